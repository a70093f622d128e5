"""An export of the hash chain: written a page at a time (`export_pages`, `ledger export`), and checked
with no database (`ledger verify --export`): each line canonical, linked to the one before, hashing to
itself. The format is `export_line`'s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .chain import GENESIS_PREV, WALK, Entry, canonical, entry_hash
from .connection import Connection

EXPORT_PAGE = 2000  # entries read at a time by an export: its memory stays this page's, whatever the chain's length


def export_line(e: Entry) -> str:
    """One export line: canonical({"entry","hash","prev","seq"}) (keys in that, sorted, order)."""
    return f'{{"entry":{e.body},"hash":"{e.hash}","prev":"{e.prev}","seq":{int(e.seq)}}}'


async def export_pages(db: Connection, since: int, last: int) -> AsyncIterator[list[Entry]]:
    """Entries `since`..`last` in order, a page at a time: an export writes each page before reading the next.

    Why pages: the whole chain held at once took 1.1 GB at 100,000 generations. Each page starts after
    the last entry of the one before (by `seq`, the primary key), so the pages cost the same however
    far into the chain they are; entries appended meanwhile, past `last`, are left for a later export.
    """
    after, page = since - 1, EXPORT_PAGE
    while after < last:
        rows_ = await db.execute_fetchall(WALK, (after, last, page))
        if not rows_:
            return
        batch = [Entry(*r) for r in rows_]
        yield batch
        after = batch[-1].seq


@dataclass
class ExportReport:
    problem: str | None = None
    first: int = 0
    last: int = 0
    anchor: str = GENESIS_PREV
    head: str = GENESIS_PREV

    @property
    def ok(self) -> bool:
        return self.problem is None


def verify_export(path: Path) -> ExportReport:
    """Check an export with no database: each line canonical, linked to the one before, hashing to itself.

    Stops at the first broken line and names it. An export made `--since` an entry starts from that
    entry's `prev` (its anchor, to compare with the ledger's); a whole one starts from 64 zeros.
    """
    return check_export(path.read_bytes(), str(path))


def check_export(data: bytes, name: str) -> ExportReport:
    """`verify_export` on an export's bytes; `name` is how its lines are named."""
    rep = ExportReport()
    if not data:
        rep.problem = f"{name}: no entries"
        return rep
    if not data.endswith(b"\n"):
        rep.problem = f"{name}: the last line is not terminated by a newline (the file was cut or changed)"
        return rep
    last_seq, last_hash = None, None
    for n, raw in enumerate(data[:-1].split(b"\n"), 1):
        where = f"{name}:{n}"
        try:
            text = raw.decode("ascii")
            obj = json.loads(text)
        except (UnicodeDecodeError, ValueError) as e:
            rep.problem = f"{where}: not a JSON line of the export ({type(e).__name__})"
            return rep
        if (
            not isinstance(obj, dict)
            or set(obj) != {"entry", "hash", "prev", "seq"}
            or not isinstance(obj["seq"], int)
            or isinstance(obj["seq"], bool)
            or obj["seq"] < 1
            or not isinstance(obj["entry"], dict)
            or not _hex64(obj["prev"])
            or not _hex64(obj["hash"])
        ):
            rep.problem = f"{where}: not an entry (keys entry, hash, prev, seq with their types)"
            return rep
        seq = obj["seq"]
        label = f"{where}: entry {seq}"
        if canonical(obj) != text:
            rep.problem = f"{label}: not in canonical form (the line was changed)"
            return rep
        if last_seq is None:
            rep.first, rep.anchor = seq, obj["prev"]
            if seq == 1 and obj["prev"] != GENESIS_PREV:
                rep.problem = f"{label}: the first entry must name {GENESIS_PREV[:8]}… (64 zeros) as its previous hash"
                return rep
        elif seq != last_seq + 1:
            rep.problem = f"{label}: follows entry {last_seq}"
            return rep
        elif obj["prev"] != last_hash:
            rep.problem = f"{label}: its previous hash is not entry {last_seq}'s hash"
            return rep
        if entry_hash(seq, obj["prev"], canonical(obj["entry"])) != obj["hash"]:
            rep.problem = f"{label}: its hash does not match its content"
            return rep
        last_seq, last_hash = seq, obj["hash"]
    rep.last, rep.head = last_seq or 0, last_hash or GENESIS_PREV
    return rep


def _hex64(v: Any) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
