"""`residents ledger list | show | stumps | verify | export`: the ledger read back, its invariants and its
hash chain checked, the chain written out for anyone to check offline. They open it read only, so they
work beside a running process and on read-only media. `residents ledger migrate` brings a ledger from an
older residents up to date; `residents ledger copy` moves one whole to another file or database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import signal
import stat
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click

from .. import truth
from ..ledger import Ledger, LedgerError, postgres, views
from ..ledger import export as chain_export
from ..ledger.access import access_of, reads_of, tool_calls_of
from ..ledger.checkpoints import chain_head
from ..ledger.copy import copy_ledger
from ..ledger.export import verify_export
from ..ledger.verify import Report, check
from ..records import Generation, Stump, ToolCall
from .common import DEFAULT_DB, UsageError, emit, emit_json, ledger_path, open_ledger

T = TypeVar("T")


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
@click.option(
    "--head",
    "saved",
    metavar="N:SHA256",
    help="A head a witness saved (entry N's seq and hash): say whether it is in this chain, all after it holding.",
)
def verify(db: str | None, strict: bool, export_file: Path | None, saved: str | None) -> int:
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
      residents ledger verify --head 1200:3f5a…(64 hex digits)
    """
    head = _head(saved) if saved is not None else None
    if export_file is not None:
        if head is not None:
            raise UsageError("--head checks a ledger's chain; an export is checked alone (drop one of them)")
        if strict:
            raise UsageError("--strict checks a ledger's pending generations; an export has none (drop one of them)")
        return _verify_export(export_file)

    rep = checked(ledger_path(db), head=head)
    lines = rep.lines(unsettled_as_violations=strict)
    if rep.saved_head is not None and (lines or not rep.head_holds):
        lines.insert(0, rep.saved_head)
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
    print(verify_line(rep))
    if rep.saved_head is not None:
        print(rep.saved_head)
    return 0


def checked(path: str, writer: bool = False, head: tuple[int, str] | None = None) -> Report:
    """The ledger at `path` checked whole (`verify`, and the end of `residents demo --headless`), and
    `head`, a head a witness saved, looked for in its chain.

    `writer`: this process holds the ledger's lock (the demo), so it opens it as its writer, whose
    close folds the WAL back in; a read-only reader leaves `-wal` and `-shm` beside the file."""

    async def go() -> Report:
        async with Ledger.open(path) if writer else open_ledger(path) as lg:
            return await check(lg, head)

    return asyncio.run(go())


def verify_line(rep: Report) -> str:
    """`verify`'s result in one line: the summary of a ledger that holds, or how many violations and the first."""
    if rep.violations:
        many = len(rep.violations)
        return f"ledger fails verify: {many} violation{'s' if many != 1 else ''}; the first: {rep.violations[0]}"
    return (
        f"ledger ok: {rep.generations} generation(s) checked, {len(rep.unsettled)} unsettled, "
        f"{rep.undelivered} post(s) undelivered; chain of {rep.chain_entries} entries, head {rep.chain_head}"
    )


def _head(saved: str) -> tuple[int, str]:
    """`N:SHA256` as a witness saves a head: N an entry's seq, SHA256 its hash in lowercase hex."""
    seq, _, digest = saved.partition(":")
    if not (seq.isascii() and seq.isdigit() and int(seq) > 0 and len(digest) == 64):
        digest = ""
    if not digest or any(c not in "0123456789abcdef" for c in digest):
        raise UsageError(
            f"--head {saved}: not a head; give N:SHA256, N an entry's number and SHA256 its hash (64 lowercase hex digits)"
        )
    return int(seq), digest


def _verify_export(path: Path) -> int:
    try:
        rep = verify_export(path)
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
    default="-",
    show_default=True,
    metavar="FILE",
    help="Where to write the chain, one JSON line per entry ('-', the default: standard output).",
)
@click.option(
    "--since",
    default="1",
    show_default=True,
    metavar="ENTRY",
    help="The first entry to write (its sequence number); earlier ones are left out.",
)
def export(db: str | None, out: str, since: str) -> int:
    """Write the hash chain as JSON Lines, for anyone to check offline.

    One canonical JSON object per line (entry, hash, prev, seq): hashes and metadata of every
    settled record, never their text. `residents ledger verify --export FILE` checks it with
    no database; the repository's docs/provenance.md gives the algorithm in a few lines.

    The chain is read and written a page at a time (memory stays small however long it is), up to
    the head as the export starts. FILE is written whole or not at all: a temporary file beside it,
    renamed into place once complete, so an interrupted or failed export leaves any earlier FILE
    as it was.

    \b
    Example:
      residents ledger export --out chain.jsonl
      residents ledger export --out newer.jsonl --since 1200
    """
    first = _entry_number(since)
    path = ledger_path(db)
    target = None if out == "-" else Path(out)
    if target is not None and target.is_dir():
        raise UsageError(f"--out {out}: a folder, not a file")

    async def go() -> tuple[int, int, str] | None:
        """The export; the first and last entries written and the head's hash (None: no entries)."""
        async with open_ledger(path) as lg:
            head = await chain_head(lg.db)
            last = head[0] if head else 0
            if first > 1 and first > last:
                raise UsageError(f"--since {first}: no such entry in {path} (its chain has {last} entries)")
            with _written(target) as sink:
                async for page in chain_export.export_pages(lg.db, first, last):
                    sink.write("".join(chain_export.export_line(e) + "\n" for e in page).encode("ascii"))
            return (first, last, head[1]) if head else None

    try:
        span = _interruptible(go)
    except asyncio.CancelledError:
        where = "" if target is None else f"; {target} is as it was before"
        print(f"residents: export interrupted{where}", file=sys.stderr)
        return 130
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write the export: {e.strerror or e}") from None
    except UnicodeEncodeError:
        raise UsageError(
            f"{path}: a chain entry is not ASCII, as no entry residents writes is (nothing was exported); "
            "`residents ledger verify` checks the chain"
        ) from None
    where = "standard output" if target is None else str(target)
    if span is None:
        print(f"wrote no entries to {where}", file=sys.stderr)
    else:
        print(
            f"wrote entries {span[0]}..{span[1]} to {where}; head {truth.head_ref(span[1], span[2])}", file=sys.stderr
        )
    return 0


def _entry_number(since: str) -> int:
    """`--since` as an entry's sequence number; anything else is one line naming it."""
    if not re.fullmatch(r"\s*[0-9]+\s*", since) or int(since) < 1:  # ASCII digits: `²` is a digit to isdigit
        raise UsageError(f"--since {since}: not an entry number (a whole number from 1)")
    return int(since)


def _interruptible(go: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(go())`, where SIGTERM, like Ctrl-C, cancels the run (so `_written` removes its
    temporary file) instead of ending the process on the spot."""

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or not supported here
            pass
        return await go()

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise asyncio.CancelledError from None


class _Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...


@contextlib.contextmanager
def _written(target: Path | None) -> Iterator[_Sink]:
    """Where an export's bytes go: standard output as they come, or `target`, atomically.

    A file is written as a hidden temporary file in `target`'s folder (the same file system, so the
    rename is atomic), flushed and fsynced, then renamed over `target` and the folder fsynced: a reader
    sees the previous file or the new one whole, never a part. Whatever stops the writing while Python
    still runs (an error, a full disk, Ctrl-C, SIGTERM) removes the temporary file; a kill that leaves
    no chance to (SIGKILL, a power cut) can leave a `.NAME.*.part` beside `target`, never touching it.
    """
    if target is None:
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    folder = target.parent
    temp = folder / f".{target.name}.{secrets.token_hex(6)}.part"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any new file
    try:
        with contextlib.suppress(FileNotFoundError):  # a file replaced keeps its permissions
            os.chmod(fd, stat.S_IMODE(target.stat().st_mode))
        with open(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    where = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(where)  # the rename itself, on disk
    finally:
        os.close(where)


@ledger.command()
@click.option(
    "--db", metavar="PATH", help=f"The SQLite ledger to migrate (default: {DEFAULT_DB} in the configuration folder)."
)
def migrate(db: str | None) -> int:
    """Bring a ledger from an older residents up to date.

    The read-only verbs refuse a ledger that needs migrating; this applies its migrations (and starts
    the hash chain of a ledger from before it), as `residents run` does when it starts. Like any writer,
    it is refused while another process holds the ledger.

    \b
    Example:
      residents ledger migrate --db data/ledger.db
    """
    path = ledger_path(db)
    if not postgres.is_url(path) and not Path(path).is_file():
        raise UsageError(f"{path}: no ledger there")

    async def go() -> list[str]:
        began = time.time()
        async with Ledger.open(path) as lg:
            sql = "SELECT name FROM _migrations WHERE applied_at >= $1 ORDER BY rowid"
            return [r[0] for r in await lg.db.execute_fetchall(sql, (began,))]

    applied = asyncio.run(go())
    print(
        f"{postgres.shown(path)}: "
        + (f"{len(applied)} migration(s) applied: {', '.join(applied)}" if applied else "up to date")
    )
    return 0


@ledger.command("copy")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="PATH|URL",
    help="The ledger to copy: a SQLite file or a postgresql:// URL.",
)
@click.option(
    "--to", "destination", required=True, metavar="PATH|URL", help="Where: a new file, or an empty PostgreSQL database."
)
def copy_(source: str, destination: str) -> int:
    """Copy a ledger whole, its hash chain with it, between files and PostgreSQL databases.

    Every row of every table, byte for byte, read in one transaction (a running process may go on
    writing the source: the copy is the ledger as it stood when the copy began) and written in one
    (a copy that fails leaves the destination empty). The source must be at this residents' migration
    step (`residents ledger migrate` brings it there); the destination must hold no ledger rows. Rows
    per table go to stderr as they are copied; the last lines name the chain's head on each side,
    which `residents ledger verify` on the copy ends on too.

    \b
    Example:
      residents ledger copy --from data/ledger.db --to postgresql://residents@db.internal/residents
      residents ledger copy --from postgresql://residents@db.internal/residents --to backup.db
    """
    src_name, dst_name = (postgres.shown(x) if postgres.is_url(x) else x for x in (source, destination))
    if not postgres.is_url(source) and not Path(source).is_file():
        raise UsageError(f"--from {source}: no ledger there")

    def told(table: str, rows: int, done: bool) -> None:
        if done or rows % 100_000 == 0:
            print(f"{table}: {rows} row(s){'' if done else ' …'}", file=sys.stderr)

    try:
        copied = asyncio.run(copy_ledger(source, destination, told))
    except LedgerError as e:  # refused or failed: nothing of it is in the destination
        raise UsageError(str(e)) from None
    total = sum(n for _, n in copied.rows)
    print(f"copied {total} row(s) in {len(copied.rows)} tables from {src_name} to {dst_name}", file=sys.stderr)
    for name, head in ((src_name, copied.source_head), (dst_name, copied.copy_head)):
        print(f"{name}: head {truth.head_ref(*head) if head else 'none (an empty chain)'}")
    return 0
