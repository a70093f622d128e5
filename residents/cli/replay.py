"""`residents replay`: a scripted conversation offline, on the real pipeline (the replay contract)."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import click

from .. import bundled
from ..config import ConfigError
from .common import config_dir, emit, emit_json


@click.command()
@click.argument("scenario", metavar="SCENARIO", type=click.Path(path_type=Path))
@click.option("--db", metavar="PATH", help="SQLite ledger to use (created if missing; default: a temporary file).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (the contract's form) instead of a transcript."
)
def replay(scenario: Path, db: str | None, as_json: bool) -> int:
    """Run a scripted conversation offline on the real pipeline.

    SCENARIO is a scenario file, or the name of a bundled one (ceiling, retry, refusal, ...). The
    provider's answers come from the scenario's recorded streams, served to the real SDK by a
    local server; posts are collected instead of sent. A bad scenario exits 2 with one line naming
    the file and the key, and writes nothing to the ledger.

    \b
    Example:
      residents replay ceiling
      residents replay scenarios/ceiling.yaml --json --db /tmp/ledger.db
    """
    from ..replay import load_scenario, transcript
    from ..replay import replay as run_replay

    gc.freeze()  # the pipeline and the SDK are imported now: keep them out of full collections too
    path, base = resolve_scenario(scenario)
    sc = load_scenario(path, base)
    result = asyncio.run(run_replay(sc, db))
    if as_json:
        emit_json(result)
    else:
        emit(transcript(result, sc))
    return 0


def resolve_scenario(arg: Path) -> tuple[Path, Path]:
    """The scenario file, and the folder its residence and policy names resolve from.

    A file that exists is used as typed, its names resolving from the configuration folder. Else a
    bundled scenario of that name, whose names resolve from the bundled examples, so it runs the
    same from any folder."""
    if arg.exists():
        return arg, config_dir()
    found = bundled.scenario(str(arg))
    if found is not None:
        return found, bundled.root()
    raise ConfigError(
        arg,
        "",
        f"file not found, and no bundled scenario has that name (bundled: {', '.join(bundled.scenario_names())})",
    )
