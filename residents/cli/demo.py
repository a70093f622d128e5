"""`residents demo`: the offline room a newcomer runs first, on the same code that runs in Discord."""

from __future__ import annotations

import asyncio
import os

import click

from .. import models
from .common import DEMO_DB, UsageError, cannot_serve, in_config


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to serve on (loopback only).")
@click.option("--port", type=int, default=8765, show_default=True, help="The room's port (0: any free port).")
@click.option("--headless", is_flag=True, help="Play the demo script, print the transcript, exit.")
@click.option(
    "--provider",
    type=click.Choice(["scripted", "anthropic"]),
    default="scripted",
    show_default=True,
    help="anthropic: the real API with ANTHROPIC_API_KEY.",
)
@click.option("--model", metavar="ID", help="With --provider anthropic: the model every demo resident uses.")
@click.option(
    "--db",
    metavar="PATH",
    help=(
        f"The ledger the demo writes. Without it, the demo writes {DEMO_DB} in the configuration folder "
        "and replaces it on each run; a ledger named here is kept and each run is added to it."
    ),
)
def demo(host: str, port: int, headless: bool, provider: str, model: str | None, db: str | None) -> int:
    """The offline room with scripted residents and a web view.

    No token and no network: a local room, a scripted provider and the real pipeline. The demo's
    script plays in the web room once a page opens it (people post, a reply is cut at its ceiling,
    an attempt is retried, a moderator opens the stump), then the room is yours; "Play again"
    clears the channel and plays it again. The ledger is data/demo.db, started afresh each run
    (pass --db to keep one): read it with `residents ledger list --db data/demo.db`.

    \b
    Example:
      residents demo
      residents demo --headless --port 0
    """
    from ..demo.run import fresh_ledger, main_async
    from ..discord.run import StartupError
    from ..ledger import hold_ledger

    if provider == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
        raise UsageError("--provider anthropic needs ANTHROPIC_API_KEY in the environment")
    if model is not None and not models.known(model):
        hint = models.nearest(model)
        raise UsageError(f"--model {model}: not in the model table" + (f" (did you mean {hint}?)" if hint else ""))
    lifecycle = models.lifecycle_problem(model) if model is not None else None
    if lifecycle is not None and lifecycle[0]:  # retired: its requests would fail
        raise UsageError(f"--model {model}: {lifecycle[1]}")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise UsageError(f"--host {host}: the demo serves on loopback only")
    fresh = db is None  # the demo's own ledger, replaced at each start
    if db is None:
        db = in_config(DEMO_DB)
    # Before the previous demo's ledger is replaced, or anything is written: refused (exit 2) while
    # another process writes this ledger. The residents' own opening shares this process's hold.
    holding = hold_ledger(db)
    try:
        if fresh:
            replaced = fresh_ledger(db)
            line = (
                f"residents demo: ledger {db} (the previous demo's ledger was replaced; --db PATH keeps a run's)"
                if replaced
                else f"residents demo: ledger {db}"
            )
        else:
            line = f"residents demo: ledger {db}"
        line += f"; afterwards: residents ledger list --db {db}"
        try:
            code = asyncio.run(main_async(db, host, port, headless, provider, model, ledger_line=line))
        except OSError as e:
            raise cannot_serve(host, port, e) from None
        except StartupError as e:  # e.g. --provider anthropic with a key the API refuses
            raise UsageError(str(e)) from None
        except KeyboardInterrupt:
            return 0
        if not headless or code:
            return code
        # A headless run ends with its ledger checked, as `residents ledger verify` checks it: one line.
        from .ledger import checked, verify_line

        report = checked(db, writer=True)  # within this process's hold
        print(verify_line(report), flush=True)
        return 0 if report.ok else 1
    finally:
        holding.release()
