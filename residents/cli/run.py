"""`residents run`: every residence with Discord settings, each as its own bot, in one process."""

from __future__ import annotations

import logging

import click

from ..observe import JsonLines
from .common import DEFAULT_DB, UsageError, config_dir, ledger_path

LEVELS = ("debug", "info", "warning", "error")


@click.command()
@click.option(
    "--discord-api",
    metavar="URL",
    help="A Discord-compatible API to use instead of discord.com (e.g. the local room: http://127.0.0.1:8765).",
)
@click.option("--db", metavar="PATH", help=f"The SQLite ledger (default: {DEFAULT_DB} in the configuration folder).")
@click.option(
    "--log-level",
    type=click.Choice(LEVELS, case_sensitive=False),
    help="What is logged on stderr, each line once  [default: discord.py's connection lines at info, "
    "the rest at warning; -v/-vv lower both]",
)
@click.option(
    "--shards",
    metavar="SPEC",
    help="This process's gateway shards for every bot, in place of each residence's discord.shards: "
    "auto, N (all N shards), or N:ID,ID (some of them, e.g. 4:0,2).",
)
@click.option(
    "--log-format",
    type=click.Choice(("text", "json"), case_sensitive=False),
    default="text",
    show_default=True,
    help="json: one JSON object a line on stderr, with the residence, channel, generation and attempt ids "
    "of the work in hand.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics (/metrics) and health checks (/healthz, /readyz) on 127.0.0.1:PORT "
    "(0: any free port, printed at start).",
)
@click.option(
    "--ready-post-age",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="/readyz fails while a post has waited in an outbox longer than this  [default: 120]",
)
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1),
    default=15.0,
    show_default=True,
    metavar="SECONDS",
    help="On a PostgreSQL ledger shared by several processes: how long a bot's lease lasts unrenewed; "
    "a process that dies is replaced within this plus --renew-seconds.",
)
@click.option(
    "--renew-seconds",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often the leases are renewed (less than --lease-seconds).",
)
def run(
    discord_api: str | None,
    db: str | None,
    log_level: str | None,
    log_format: str,
    metrics_port: int | None,
    ready_post_age: float | None,
    shards: str | None,
    lease_seconds: float,
    renew_seconds: float,
) -> int:
    """Run every residence with Discord settings, each as its own bot.

    The residences are those in the configuration folder (--config). Tokens come from the
    environment variables they name (discord.token_env), the provider key from ANTHROPIC_API_KEY;
    every one missing is named in one line. Once every bot is ready, a table shows each resident,
    its bot user, model, channels and continuation standing, and the invite URL of each bot. A
    start-up problem stops everything with one line.

    \b
    On a PostgreSQL ledger (--db URL) any number of processes, on one machine or several, share the
    ledger and the configuration folder: each bot (or shard of one) is driven by one of them at a time,
    under a lease; `residents status` lists who holds what.

    \b
    Example:
      residents run --discord-api http://127.0.0.1:8765 --db data/ledger.db
      residents run --log-level warning
      residents run --shards 4:0,1
      residents run --metrics-port 9464 --log-format json
    """
    from ..discord.run import StartupError, main
    from ..ledger.leases import Terms
    from ..metrics import READY_POST_AGE  # with aiohttp and prometheus_client: only when running

    root, gateway = logging.getLogger(), logging.getLogger("discord")
    previous = root.level, gateway.level
    formatters = [(h, h.formatter) for h in root.handlers]
    if log_format.lower() == "json":
        for h, _ in formatters:
            h.setFormatter(JsonLines())
    if log_level:
        root.setLevel(getattr(logging, log_level.upper()))
        gateway.setLevel(logging.NOTSET)
    else:  # discord.py's connection lines at info; everything else at warning, or as -v/-vv say
        gateway.setLevel(min(root.level, logging.INFO))
    if renew_seconds >= lease_seconds:
        raise UsageError(
            f"--renew-seconds {renew_seconds:g}: renew more often than a lease lasts (--lease-seconds {lease_seconds:g})"
        )
    terms = Terms(lease_seconds, renew_seconds)
    try:
        return main(
            config_dir(), ledger_path(db), discord_api, shards, metrics_port, ready_post_age or READY_POST_AGE, terms
        )
    except StartupError as e:
        raise UsageError(str(e)) from None
    finally:
        root.setLevel(previous[0])  # in-process callers (tests) keep their own levels and formats
        gateway.setLevel(previous[1])
        for h, formatter in formatters:
            h.setFormatter(formatter)
