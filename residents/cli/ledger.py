"""`residents ledger list | show | stumps | verify | export`: the ledger read back, its invariants and its
hash chain checked, the chain written out for anyone to check offline."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from ..ledger import chain, views
from ..ledger.access import access_of, reads_of, tool_calls_of
from ..ledger.verify import Report, check, few_collections
from ..records import Generation, Stump, ToolCall
from .common import DEFAULT_DB, UsageError, emit, emit_json, ledger_path, open_ledger


@click.group(invoke_without_command=True)
@click.pass_context
def ledger(ctx: click.Context) -> None:
    """Read the ledger back and check its invariants.

    Generations, stumps and their provenance, as the pipeline recorded them. Without a command,
    this help.

    \b
    Example:
      residents ledger list --db data/ledger.db
      residents ledger list --db data/demo.db     (the demo's ledger)
    """
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit(0)


@ledger.command("list")
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to read (default: {DEFAULT_DB} in the configuration folder)."
)
@click.option("--residence", metavar="NAME", help="Only this residence's generations.")
@click.option("-n", "--limit", type=int, default=20, show_default=True, help="How many generations, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array instead of a table.")
def list_(db: str | None, residence: str | None, limit: int, as_json: bool) -> int:
    """Recent generations, newest first.

    Each with its status, stop reason, characters, tokens, attempts and stumps.

    \b
    Example:
      residents ledger list --residence cairn -n 5
    """
    path = ledger_path(db)

    async def go() -> list[dict[str, Any]]:
        async with open_ledger(path) as lg:
            return await lg.list_generations(residence, limit)

    rows = asyncio.run(go())
    if as_json:
        emit_json(rows)
    else:
        emit(views.generation_table(rows))
    return 0


@ledger.command()
@click.argument("record_id", metavar="ID")
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to read (default: {DEFAULT_DB} in the configuration folder)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text included) instead of a report.")
def show(record_id: str, db: str | None, as_json: bool) -> int:
    """One generation or stump: its provenance and exact text.

    ID is a generation id (g-…), a stump id (s-…), or a message (its id, or a link to it, as
    Discord's "Copy Message Link" gives): the generation that posted it. A stump also shows its
    access (who may read its text) and every read of its text: who, as what, and when.

    \b
    Example:
      residents ledger show g-0123456789ab --json
      residents ledger show https://discord.com/channels/1/2/1234567890123456789
    """
    path = ledger_path(db)
    calls: list[ToolCall] = []
    reads: list[dict[str, Any]] = []
    access: list[str | None] = [None]
    message = views.message_id_of(record_id)

    async def go() -> Generation | Stump | None:
        async with open_ledger(path) as lg:
            if record_id.startswith("s-"):
                access[0] = await access_of(lg, record_id)
                reads.extend((await reads_of(lg, [record_id]))[record_id])
                return await lg.get_stump(record_id)
            gid: str | None = record_id
            if message is not None:
                post = (await lg.posts_by_message([message])).get(message)
                gid = post.generation_id if post else None
            if gid is None:
                return None
            calls.extend(await tool_calls_of(lg, gid))
            return await lg.get_generation(gid)

    rec = asyncio.run(go())
    if rec is None:
        what = f"no generation posted message {message}" if message else "no such generation or stump"
        raise UsageError(f"{record_id}: {what} in {path}")
    if not as_json:
        emit(views.show(rec, calls, access[0], reads) if isinstance(rec, Stump) else views.show(rec, calls))
    elif isinstance(rec, Stump):
        emit_json({**rec.meta(), "access": access[0], "reads": reads, "text": rec.text})
    else:
        emit_json(
            {
                **rec.as_json(),
                "tool_rounds": [c.as_json() for c in calls],
                "stumps": [{**s.meta(), "text": s.text} for s in rec.stumps],
                "posts": [p.as_json() for p in rec.posts],
                "attachments": [f.as_json() for f in rec.attachments],
            }
        )
    return 0


@ledger.command()
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to read (default: {DEFAULT_DB} in the configuration folder)."
)
@click.option("--residence", metavar="NAME", help="Only this residence's stumps.")
@click.option("--cause", metavar="CAUSE", help="Only stumps of this cause (max_tokens, retry-abandoned, refusal, ...).")
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="How many stumps, newest first."
)
@click.option("--before", metavar="STUMP_ID", help="The next page: only stumps older than this one.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array of metadata instead of a table.")
def stumps(
    db: str | None, residence: str | None, cause: str | None, limit: int, before: str | None, as_json: bool
) -> int:
    """Texts not published as completed speech, newest first.

    Metadata only (no stump text is read). When older stumps remain beyond the page, a line
    on stderr names the --before that shows them.

    \b
    Example:
      residents ledger stumps --cause retry-abandoned --limit 20
      residents ledger stumps --limit 20 --before s-0123456789ab
    """
    path = ledger_path(db)

    async def go() -> tuple[list[Stump], bool]:
        async with open_ledger(path) as lg:
            page = await lg.list_stump_meta(residence, cause, limit=limit + 1, before=before)
            if before is not None and not page and await lg.get_stump(before) is None:
                raise UsageError(f"--before {before}: no such stump in {path}")
            return page[:limit], len(page) > limit

    page, more = asyncio.run(go())
    if as_json:
        emit_json([s.meta() for s in page])
    else:
        emit(views.stump_table(page))
    if more:
        print(f"older stumps: residents ledger stumps --before {page[-1].id}", file=sys.stderr)
    return 0


@ledger.command()
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to check (default: {DEFAULT_DB} in the configuration folder)."
)
@click.option("--strict", is_flag=True, help="Count generations still pending (unsettled) as violations too.")
@click.option(
    "--export",
    "export_file",
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check an export of the chain instead, offline: no ledger is opened.",
)
def verify(db: str | None, strict: bool, export_file: Path | None) -> int:
    """Check every invariant of the ledger, and its hash chain.

    Texts kept exactly, one receipt per cut, posts covering each text once, no speech for a
    generation that did not complete; each chain entry linked to the one before, hashing to
    its content, and each record as its latest entry states it. Exit 1 with one line per
    violation (the first broken chain entry first); exit 0 with one summary line that ends
    with the chain's head hash. With --export FILE, checks that file alone.

    \b
    Example:
      residents ledger verify --db data/ledger.db --strict
      residents ledger verify --export chain.jsonl
    """
    if export_file is not None:
        if strict:
            raise UsageError("--strict checks a ledger's pending generations; an export has none (drop one of them)")
        return _verify_export(export_file)

    path = ledger_path(db)

    async def go() -> Report:
        async with open_ledger(path) as lg:
            return await check(lg)

    with few_collections():  # while this process only checks, as its workers do
        rep = asyncio.run(go())
    lines = list(rep.violations)
    if strict:
        lines += [f"generation {gid}: unsettled (status pending)" for gid in rep.unsettled]
    if lines:
        for line in lines:
            emit(line)
        return 1
    if rep.unsettled:
        print(
            f"{len(rep.unsettled)} generation(s) unsettled (pending): "
            + ", ".join(rep.unsettled[:10])
            + (" …" if len(rep.unsettled) > 10 else ""),
            file=sys.stderr,
        )
    print(
        f"ledger ok: {rep.generations} generation(s) checked, {len(rep.unsettled)} unsettled, "
        f"{rep.undelivered} post(s) undelivered; chain of {rep.chain_entries} entries, head {rep.chain_head}"
    )
    return 0


def _verify_export(path: Path) -> int:
    try:
        rep = chain.verify_export(path)
    except OSError as e:
        raise UsageError(f"{path}: cannot read the export: {e.strerror or e}") from None
    if rep.problem is not None:
        emit(rep.problem)
        return 1
    anchor = "" if rep.first == 1 else f"; it continues entry {rep.first - 1}, whose hash it names as {rep.anchor}"
    print(f"export ok: entries {rep.first}..{rep.last} ({rep.last - rep.first + 1}), head {rep.head}{anchor}")
    return 0


@ledger.command()
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to read (default: {DEFAULT_DB} in the configuration folder)."
)
@click.option(
    "--out",
    "out",
    required=True,
    metavar="FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the chain, one JSON line per entry ('-': standard output).",
)
@click.option(
    "--since",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="ENTRY",
    help="The first entry to write (its sequence number); earlier ones are left out.",
)
def export(db: str | None, out: Path, since: int) -> int:
    """Write the hash chain as JSON Lines, for anyone to check offline.

    One canonical JSON object per line (entry, hash, prev, seq): hashes and metadata of every
    settled record, never their text. `residents ledger verify --export FILE` checks it with
    no database; the README's "Provenance" section gives the algorithm in a few lines.

    \b
    Example:
      residents ledger export --out chain.jsonl
      residents ledger export --out newer.jsonl --since 1200
    """
    path = ledger_path(db)

    async def go() -> tuple[list[chain.Entry], int]:
        async with open_ledger(path) as lg:
            head = list(await lg.db.execute_fetchall("SELECT coalesce(max(seq), 0) FROM chain"))[0][0]
            return await chain.entries(lg.db, since), head

    entries, head = asyncio.run(go())
    if since > 1 and not entries:
        raise UsageError(f"--since {since}: no such entry in {path} (its chain has {head} entries)")
    data = "".join(e.line + "\n" for e in entries)
    if str(out) == "-":
        sys.stdout.write(data)
    else:
        try:
            out.write_text(data, encoding="ascii")
        except OSError as e:
            raise UsageError(f"{out}: cannot write the export: {e.strerror or e}") from None
    where = "standard output" if str(out) == "-" else str(out)
    span = f"entries {entries[0].seq}..{entries[-1].seq}" if entries else "no entries"
    print(f"wrote {span} to {where}" + (f"; head {entries[-1].hash}" if entries else ""), file=sys.stderr)
    return 0
