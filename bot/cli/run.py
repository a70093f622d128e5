"""`residents run`: every residence with Discord settings, each as its own bot, in one process."""
from __future__ import annotations

import click

from .common import DEFAULT_DB, UsageError, config_dir, ledger_path


@click.command()
@click.option("--discord-api", metavar="URL", help="A Discord-compatible API to use instead of discord.com "
                                                   "(e.g. the local room: http://127.0.0.1:8765).")
@click.option("--db", metavar="PATH", help=f"The SQLite ledger (default: {DEFAULT_DB} in the configuration folder).")
def run(discord_api: str | None, db: str | None) -> int:
    """Run every residence with Discord settings, each as its own bot.

    The residences are those in the configuration folder (--config). Tokens come from the
    environment variables they name (discord.token_env), the provider key from ANTHROPIC_API_KEY. A start-up problem stops everything with one line.

    \b
    Example:
      residents run --discord-api http://127.0.0.1:8765 --db data/ledger.db
    """
    from ..discord.run import StartupError, main
    try:
        return main(config_dir(), ledger_path(db), discord_api)
    except StartupError as e:
        raise UsageError(str(e)) from None
