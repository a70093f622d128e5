"""`residents usage`: the provider's token counts the ledger keeps, summed by residence, channel or day,
with a cost estimate from the model table's prices. It opens the ledger read only, as the `ledger`
verbs do, so it works beside a running process."""

from __future__ import annotations

import asyncio

import click

from ..config import use_project_models
from ..ledger import usage as usage_mod
from .common import DEFAULT_DB, UsageError, config_dir, emit, emit_json, ledger_path, open_ledger


@click.command()
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to read (default: {DEFAULT_DB} in the configuration folder)."
)
@click.option("--since", metavar="DATE", help="Only provider calls started on or after this UTC day (YYYY-MM-DD).")
@click.option(
    "--by",
    type=click.Choice(usage_mod.BY),
    default="residence",
    show_default=True,
    help="Sum by residence, by channel (its id) or by UTC day.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def usage(db: str | None, since: str | None, by: usage_mod.By, as_json: bool) -> int:
    """Tokens the provider counted, and what they cost (an estimate).

    Input (not cached), cache writes, cache reads and output of every provider call in the ledger,
    as the provider reported them; calls it gave no count for are counted, never estimated. The cost
    is the model table's list prices (models: in residents.yaml overrides them) times those counts.

    \b
    Example:
      residents usage --since 2026-12-01 --by day
      residents usage --by channel --json
    """
    try:
        start = usage_mod.since_of(since) if since is not None else None
    except ValueError as e:
        raise UsageError(f"--since: {e}") from None
    use_project_models(config_dir())  # the operator's prices, where residents.yaml states them
    path = ledger_path(db)

    async def go() -> usage_mod.Report:
        async with open_ledger(path) as lg:
            return await usage_mod.usage(lg, by, start)

    rep = asyncio.run(go())
    if as_json:
        emit_json(rep.as_json())
    else:
        emit(usage_mod.table(rep))
    return 0
