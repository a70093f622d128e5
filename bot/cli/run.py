"""`residents run`: every residence with Discord settings, each as its own bot, in one process."""
from __future__ import annotations

from pathlib import Path

import click

from .common import DEFAULT_DB, UsageError


@click.command()
@click.option("--discord-api", metavar="URL", help="A Discord-compatible API to use instead of discord.com "
                                                   "(e.g. the local room: http://127.0.0.1:8765).")
@click.option("--db", default=DEFAULT_DB, show_default=True, metavar="PATH", help="The SQLite ledger.")
def run(discord_api: str | None, db: str) -> int:
    """Run every residence with Discord settings, each as its own bot.

    Tokens come from the environment variables the residences name (discord.token_env), the
    provider key from ANTHROPIC_API_KEY. A start-up problem stops everything with one line.

    \b
    Example:
      residents run --discord-api http://127.0.0.1:8765 --db data/ledger.db
    """
    from ..discord.run import StartupError, main
    try:
        return main(Path.cwd(), db, discord_api)
    except StartupError as e:
        raise UsageError(str(e)) from None
