"""`residents replay`: a scripted conversation offline, on the real pipeline (the replay contract)."""
from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import click

from .common import emit, emit_json


@click.command()
@click.argument("scenario", type=click.Path(path_type=Path))
@click.option("--db", metavar="PATH", help="SQLite ledger to use (created if missing; default: a temporary file).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the contract's form) instead of a transcript.")
def replay(scenario: Path, db: str | None, as_json: bool) -> int:
    """Run a scripted conversation offline on the real pipeline.

    The provider's answers come from the scenario's recorded streams, served to the real SDK by a
    local server; posts are collected instead of sent. A bad scenario exits 2 with one line naming
    the file and the key, and writes nothing to the ledger.

    \b
    Example:
      residents replay scenarios/ceiling.yaml --json --db /tmp/ledger.db
    """
    from ..replay import load_scenario, replay as run_replay, transcript
    gc.freeze()  # the pipeline and the SDK are imported now: keep them out of full collections too
    sc = load_scenario(scenario)
    result = asyncio.run(run_replay(sc, db))
    if as_json:
        emit_json(result)
    else:
        emit(transcript(result, sc))
    return 0
