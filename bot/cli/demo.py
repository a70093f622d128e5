"""`residents demo`: the offline room a newcomer runs first, on the same code that runs in Discord."""
from __future__ import annotations

import asyncio
import os
import time

import click

from .. import models
from .common import UsageError, in_config


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to serve on (loopback only).")
@click.option("--port", type=int, default=8765, show_default=True, help="The room's port (0: any free port).")
@click.option("--headless", is_flag=True, help="Play the demo script, print the transcript, exit.")
@click.option("--provider", type=click.Choice(["scripted", "anthropic"]), default="scripted", show_default=True,
              help="anthropic: the real API with ANTHROPIC_API_KEY.")
@click.option("--model", metavar="ID", help="With --provider anthropic: the model every demo resident uses.")
@click.option("--db", metavar="PATH", help="The ledger (default: a new file under data/ in the configuration folder).")
def demo(host: str, port: int, headless: bool, provider: str, model: str | None, db: str | None) -> int:
    """The offline room with scripted residents and a web view.

    No token and no network: a local room, a scripted provider and the real pipeline.

    \b
    Example:
      residents demo --headless --port 0
    """
    from ..demo.run import main_async
    from ..discord.run import StartupError
    if provider == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
        raise UsageError("--provider anthropic needs ANTHROPIC_API_KEY in the environment")
    if model is not None and not models.known(model):
        hint = models.nearest(model)
        raise UsageError(f"--model {model}: not in the model table" + (f" (did you mean {hint}?)" if hint else ""))
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise UsageError(f"--host {host}: the demo serves on loopback only")
    db = db or in_config(f"data/demo-{time.strftime('%Y%m%d-%H%M%S')}.db")
    try:
        return asyncio.run(main_async(db, host, port, headless, provider, model))
    except OSError as e:
        raise UsageError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    except StartupError as e:  # e.g. --provider anthropic with a key the API refuses
        raise UsageError(str(e)) from None
    except KeyboardInterrupt:
        return 0
