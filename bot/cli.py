"""The verbs people type: `residents replay | check | ledger | run | room | demo`.

Every failure a person can cause ends as one line on stderr and an exit status (2 for bad input);
a traceback is shown only with --debug.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ConfigError
from .ledger import LedgerError

log = logging.getLogger(__name__)

DEFAULT_DB = "data/ledger.db"


class UsageError(Exception):
    """A command that cannot run as asked; exit 2 with its message."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="residents", description="AI residents in Discord rooms that tell the truth "
                                                              "about every output.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output on stderr")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = p.add_subparsers(dest="verb", metavar="COMMAND")

    r = sub.add_parser("replay", help="run a scripted conversation offline on the real pipeline")
    r.add_argument("scenario", type=Path)
    r.add_argument("--db", help="SQLite ledger to use (created if missing; default: a temporary file)")
    r.add_argument("--json", action="store_true", help="print one JSON object (the contract's form)")
    r.set_defaults(func=cmd_replay)

    c = sub.add_parser("check", help="validate residences, policies and scenarios")
    c.add_argument("paths", nargs="*", type=Path)
    c.set_defaults(func=cmd_check)

    lg = sub.add_parser("ledger", help="read the ledger back")
    lsub = lg.add_subparsers(dest="ledger_verb", metavar="ACTION")
    ll = lsub.add_parser("list", help="recent generations")
    ll.add_argument("--db", default=DEFAULT_DB)
    ll.add_argument("--residence")
    ll.add_argument("-n", "--limit", type=int, default=20)
    ll.add_argument("--json", action="store_true")
    ll.set_defaults(func=cmd_ledger_list)
    ls = lsub.add_parser("show", help="one generation or stump, with provenance")
    ls.add_argument("id")
    ls.add_argument("--db", default=DEFAULT_DB)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ledger_show)
    lst = lsub.add_parser("stumps", help="texts that exist but were not published as completed speech")
    lst.add_argument("--db", default=DEFAULT_DB)
    lst.add_argument("--residence")
    lst.add_argument("--cause")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=cmd_ledger_stumps)
    from .ledger.verify import add_verb
    add_verb(lsub)
    for name, add in EXTRA_VERBS.items():
        add(sub)
    return p


# Verbs that live with their own feature (run, room, demo) register here, so this file stays the index.
EXTRA_VERBS: dict[str, Callable[[Any], None]] = {}


def main(argv: list[str] | None = None) -> int:
    _load_extra_verbs()
    p = _parser()
    args = p.parse_args(argv)
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        p.print_help(sys.stderr)
        return 2
    # Everything imported so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise pause streams for ~100 ms (bench/README.md).
    gc.freeze()
    try:
        result = args.func(args)
        return int(result or 0)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"residents: {e}", file=sys.stderr)
        return 2
    except LedgerError as e:
        print(f"residents: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last line of defence: one line, never a traceback, unless asked
        if args.debug:
            raise
        log.debug("internal error", exc_info=True)
        print(f"residents: internal error: {type(e).__name__}: {e} (run with --debug for details)", file=sys.stderr)
        return 1


def _load_extra_verbs() -> None:
    for module in ("bot.discord.cli", "bot.demo"):
        try:
            __import__(module)
        except ModuleNotFoundError as e:
            if not e.name or not module.startswith(e.name):
                raise


def cmd_replay(args: argparse.Namespace) -> int:
    from .replay import load_scenario, replay, transcript
    gc.freeze()  # the pipeline and the SDK are imported now: keep them out of full collections too
    sc = load_scenario(args.scenario)
    result = asyncio.run(replay(sc, args.db))
    if args.json:
        json.dump(result, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(transcript(result, sc))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from .config import check_paths
    base = Path.cwd()
    paths = list(args.paths) or sorted((base / "policies").glob("*.yaml")) + sorted((base / "residences").glob("*.yaml"))
    if not paths:
        raise UsageError("nothing to check: no residences/*.yaml or policies/*.yaml here, and no paths given")
    for p in paths:
        if not p.exists():
            print(f"{p}: file not found", file=sys.stderr)
            return 2
    problems = check_paths(paths, base)
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 2
    print(f"{len(paths)} file(s) valid")
    return 0


def _open_ledger(db: str):
    from .ledger import Ledger
    if db != ":memory:" and not Path(db).exists():
        raise UsageError(f"{db}: no ledger there (run a replay or the bot first, or pass --db)")
    return Ledger.open(db)


def cmd_ledger_list(args: argparse.Namespace) -> int:
    from .ledger import views

    async def go() -> list[dict[str, Any]]:
        ledger = await _open_ledger(args.db)
        try:
            return await ledger.list_generations(args.residence, args.limit)
        finally:
            await ledger.close()
    rows = asyncio.run(go())
    print(json.dumps(rows, ensure_ascii=False) if args.json else views.generation_table(rows))
    return 0


def cmd_ledger_show(args: argparse.Namespace) -> int:
    from .ledger import views

    async def go():
        ledger = await _open_ledger(args.db)
        try:
            if args.id.startswith("s-"):
                return await ledger.get_stump(args.id)
            return await ledger.get_generation(args.id)
        finally:
            await ledger.close()
    rec = asyncio.run(go())
    if rec is None:
        raise UsageError(f"{args.id}: no such generation or stump in {args.db}")
    if args.json:
        data = rec.as_json() if hasattr(rec, "as_json") else {**rec.meta(), "text": rec.text}
        if hasattr(rec, "stumps"):
            data["stumps"] = [{**s.meta(), "text": s.text} for s in rec.stumps]
            data["posts"] = [p.as_json() for p in rec.posts]
        print(json.dumps(data, ensure_ascii=False))
    else:
        print(views.show(rec))
    return 0


def cmd_ledger_stumps(args: argparse.Namespace) -> int:
    from .ledger import views

    async def go():
        ledger = await _open_ledger(args.db)
        try:
            return await ledger.list_stumps(args.residence, args.cause, limit=200)
        finally:
            await ledger.close()
    stumps = asyncio.run(go())
    print(json.dumps([s.meta() for s in stumps]) if args.json else views.stump_table(stumps))
    return 0
