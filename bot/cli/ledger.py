"""`residents ledger list | show | stumps | verify`: the ledger read back, and its invariants checked."""
from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from ..generation.records import Generation, Stump
from ..ledger import views
from ..ledger.verify import Report, check
from .common import DEFAULT_DB, UsageError, emit, emit_json, open_ledger


@click.group()
def ledger() -> None:
    """Read the ledger back and check its invariants.

    Generations, stumps and their provenance, as the pipeline recorded them.

    \b
    Example:
      residents ledger list --db data/ledger.db
    """


@ledger.command("list")
@click.option("--db", default=DEFAULT_DB, show_default=True, metavar="PATH", help="The SQLite ledger to read.")
@click.option("--residence", metavar="NAME", help="Only this residence's generations.")
@click.option("-n", "--limit", type=int, default=20, show_default=True, help="How many generations, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array instead of a table.")
def list_(db: str, residence: str | None, limit: int, as_json: bool) -> int:
    """Recent generations, newest first.

    Each with its status, stop reason, characters, tokens, attempts and stumps.

    \b
    Example:
      residents ledger list --residence cairn -n 5
    """
    async def go() -> list[dict[str, Any]]:
        lg = await open_ledger(db)
        try:
            return await lg.list_generations(residence, limit)
        finally:
            await lg.close()
    rows = asyncio.run(go())
    if as_json:
        emit_json(rows)
    else:
        emit(views.generation_table(rows))
    return 0


@ledger.command()
@click.argument("record_id", metavar="ID")
@click.option("--db", default=DEFAULT_DB, show_default=True, metavar="PATH", help="The SQLite ledger to read.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text included) instead of a report.")
def show(record_id: str, db: str, as_json: bool) -> int:
    """One generation or stump: its provenance and exact text.

    ID is a generation id (g-…), a stump id (s-…), or a message (its id, or a link to it, as
    Discord's "Copy Message Link" gives): the generation that posted it.

    \b
    Example:
      residents ledger show g-0123456789ab --json
      residents ledger show https://discord.com/channels/1/2/1234567890123456789
    """
    message = views.message_id_of(record_id)

    async def go() -> Generation | Stump | None:
        lg = await open_ledger(db)
        try:
            if record_id.startswith("s-"):
                return await lg.get_stump(record_id)
            if message is not None:
                post = (await lg.posts_by_message([message])).get(message)
                return await lg.get_generation(post.generation_id) if post and post.generation_id else None
            return await lg.get_generation(record_id)
        finally:
            await lg.close()
    rec = asyncio.run(go())
    if rec is None:
        what = f"no generation posted message {message}" if message else "no such generation or stump"
        raise UsageError(f"{record_id}: {what} in {db}")
    if not as_json:
        emit(views.show(rec))
    elif isinstance(rec, Stump):
        emit_json({**rec.meta(), "text": rec.text})
    else:
        emit_json({**rec.as_json(), "stumps": [{**s.meta(), "text": s.text} for s in rec.stumps],
                   "posts": [p.as_json() for p in rec.posts]})
    return 0


@ledger.command()
@click.option("--db", default=DEFAULT_DB, show_default=True, metavar="PATH", help="The SQLite ledger to read.")
@click.option("--residence", metavar="NAME", help="Only this residence's stumps.")
@click.option("--cause", metavar="CAUSE", help="Only stumps of this cause (max_tokens, retry-abandoned, refusal, ...).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="How many stumps, newest first.")
@click.option("--before", metavar="STUMP_ID", help="The next page: only stumps older than this one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array of metadata instead of a table.")
def stumps(db: str, residence: str | None, cause: str | None, limit: int, before: str | None, as_json: bool) -> int:
    """Texts not published as completed speech, newest first.

    Metadata only (no stump text is read). When older stumps remain beyond the page, a line
    on stderr names the --before that shows them.

    \b
    Example:
      residents ledger stumps --cause retry-abandoned --limit 20
      residents ledger stumps --limit 20 --before s-0123456789ab
    """
    async def go() -> tuple[list[Stump], bool]:
        lg = await open_ledger(db)
        try:
            page = await lg.list_stump_meta(residence, cause, limit=limit + 1, before=before)
            if before is not None and not page and await lg.get_stump(before) is None:
                raise UsageError(f"--before {before}: no such stump in {db}")
            return page[:limit], len(page) > limit
        finally:
            await lg.close()
    page, more = asyncio.run(go())
    if as_json:
        emit_json([s.meta() for s in page])
    else:
        emit(views.stump_table(page))
    if more:
        print(f"older stumps: residents ledger stumps --before {page[-1].id}", file=sys.stderr)
    return 0


@ledger.command()
@click.option("--db", default=DEFAULT_DB, show_default=True, metavar="PATH", help="The SQLite ledger to check.")
@click.option("--strict", is_flag=True, help="Count generations still pending (unsettled) as violations too.")
def verify(db: str, strict: bool) -> int:
    """Check every invariant of the ledger.

    Texts kept exactly, one receipt per cut, posts covering each text once, no speech for a
    generation that did not complete. Exit 1 with one line per violation; exit 0 with one
    summary line.

    \b
    Example:
      residents ledger verify --db data/ledger.db --strict
    """
    async def go() -> Report:
        lg = await open_ledger(db)
        try:
            return await check(lg)
        finally:
            await lg.close()

    rep = asyncio.run(go())
    lines = list(rep.violations)
    if strict:
        lines += [f"generation {gid}: unsettled (status pending)" for gid in rep.unsettled]
    if lines:
        for line in lines:
            emit(line)
        return 1
    if rep.unsettled:
        print(f"{len(rep.unsettled)} generation(s) unsettled (pending): " + ", ".join(rep.unsettled[:10])
              + (" …" if len(rep.unsettled) > 10 else ""), file=sys.stderr)
    print(f"ledger ok: {rep.generations} generation(s) checked, {len(rep.unsettled)} unsettled, "
          f"{rep.undelivered} post(s) undelivered")
    return 0
