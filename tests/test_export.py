"""`residents ledger export`: streamed a page at a time (the same bytes the whole chain read at once
gave), `--since` an entry, written atomically (an interrupted or failed export leaves the earlier file
as it was and no partial file), and every bad input one line with exit 2.

The ledger is built by the bench's builder (`bench.ledger_scale.build`: the real schema, the chain's
own entries), big enough for several pages; the tests that read it run on both backends (`backend`: the
file, and its copy in a PostgreSQL database), those of the file written out on SQLite alone; the CLI runs in-process and, where a limit of the
operating system has to stop it, as a subprocess.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import resource
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ledgerkit import Backend, rows

from residents import cli
from residents.ledger import chain
from residents.ledger import export as chain_export
from residents.ledger.copy import copy_ledger

ROOT = Path(__file__).resolve().parent.parent
GENERATIONS = 1000  # about 4,400 chain entries: three pages of 2,000


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("export") / "ledger.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))  # bench/ sits beside the package, not in it
        from bench.ledger_scale import build

        build(str(db), GENERATIONS)
    return db


@pytest.fixture
def ledger_at(backend: Backend, built: Path) -> str:
    """The built ledger on the test's backend: the file itself, or a copy of it (`residents ledger copy`)
    in the test's own PostgreSQL database."""
    if backend.name == "sqlite":
        return str(built)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever runs on this thread
        pool.submit(asyncio.run, copy_ledger(str(built), backend.location)).result()
    return backend.location


def whole_chain(db: Path | str, since: int = 1) -> bytes:
    """The export as it was made before streaming: every entry read at once, one line each."""
    entries = rows(str(db), chain.ENTRIES + " WHERE seq >= $1 ORDER BY seq", since)
    return "".join(chain_export.export_line(chain.Entry(*r)) + "\n" for r in entries).encode("ascii")


def head_of(db: Path | str) -> tuple[int, str]:
    [(seq, digest)] = rows(str(db), "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    return int(seq), str(digest)


def export(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = cli.main(["ledger", "export", *args])
    return code, capsys.readouterr().err.splitlines()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


def test_a_streamed_export_is_byte_for_byte_the_whole_chain_and_names_its_head(ledger_at, tmp_path, capsys):
    out = tmp_path / "chain.jsonl"
    code, err = export(capsys, "--db", str(ledger_at), "--out", str(out))
    last, digest = head_of(ledger_at)
    assert last > 2 * chain_export.EXPORT_PAGE  # several pages
    assert code == 0 and err == [f"wrote entries 1..{last} to {out}; head {last}:{digest}"]
    assert out.read_bytes() == whole_chain(ledger_at)
    assert leftovers(tmp_path) == []
    code, said = cli.main(["ledger", "verify", "--export", str(out)]), capsys.readouterr().out
    assert code == 0 and said.startswith(f"export ok: entries 1..{last} ({last}), head {digest}")


@pytest.mark.parametrize("out", [["--out", "-"], []], ids=["--out -", "no --out"])
def test_an_export_to_standard_output_is_the_same_bytes(ledger_at, capsysbinary, out):
    """`--out -`, or no `--out` at all (issue 25: a pipe is the usual place for it), writes to standard output."""
    assert cli.main(["ledger", "export", "--db", str(ledger_at), *out]) == 0
    captured = capsysbinary.readouterr()
    assert captured.out == whole_chain(ledger_at)
    assert b"wrote entries 1.." in captured.err and b"to standard output" in captured.err


def test_an_export_holds_a_page_not_the_chain(ledger_at, tmp_path, monkeypatch):
    """With pages of 100 entries, the export's peak allocation is a small part of the file it writes
    (reading the whole chain at once held all of it, and the joined text again): beyond what exporting
    the last entry alone takes (a connection's own, asyncpg's type caches on PostgreSQL), a quarter."""
    monkeypatch.setattr(chain_export, "EXPORT_PAGE", 100)
    out = tmp_path / "chain.jsonl"
    last, _ = head_of(ledger_at)

    def peak_of(*since: str) -> int:
        tracemalloc.start()
        try:
            assert cli.main(["ledger", "export", "--db", ledger_at, "--out", str(out), *since]) == 0
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    alone = peak_of("--since", str(last))
    peak = peak_of()
    size = out.stat().st_size
    assert out.read_bytes() == whole_chain(ledger_at)
    assert peak - alone < size / 4, f"peak {peak:,} bytes ({alone:,} for one entry) for an export of {size:,}"


async def test_pages_follow_each_other_whatever_their_size(ledger_at):
    from residents.ledger import Ledger

    last, _ = head_of(ledger_at)
    async with Ledger.open(ledger_at) as lg:
        for page, since in ((1, last - 5), (7, 3), (2000, 1), (10_000, 1)):
            chain_export.EXPORT_PAGE, saved = page, chain_export.EXPORT_PAGE
            try:
                pages = [p async for p in chain_export.export_pages(lg.db, since, last)]
            finally:
                chain_export.EXPORT_PAGE = saved
            assert all(0 < len(p) <= page for p in pages)
            got = "".join(chain_export.export_line(e) + "\n" for p in pages for e in p).encode("ascii")
            assert got == whole_chain(ledger_at, since), (page, since)


def test_since_exports_from_that_entry_on(ledger_at, tmp_path, capsys):
    last, digest = head_of(ledger_at)
    since = last - 2345
    out = tmp_path / "newer.jsonl"
    code, err = export(capsys, "--db", ledger_at, "--out", str(out), "--since", str(since))
    assert code == 0 and err == [f"wrote entries {since}..{last} to {out}; head {last}:{digest}"]
    assert out.read_bytes() == whole_chain(ledger_at, since)
    assert out.read_bytes().count(b"\n") == last - since + 1
    code, err = export(capsys, "--db", ledger_at, "--out", str(out), "--since", str(last))
    assert code == 0 and out.read_bytes().count(b"\n") == 1


@pytest.mark.parametrize("since", ["abc", "0", "-3", "1.5", "", "12x", "²"])
def test_since_not_an_entry_number_is_one_line(built, tmp_path, capsys, since):
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    code, err = export(capsys, "--db", str(built), "--out", str(out), "--since", since)
    assert code == 2 and err == [f"residents: --since {since}: not an entry number (a whole number from 1)"]
    assert out.read_bytes() == b"earlier\n" and leftovers(tmp_path) == []


def test_since_beyond_the_head_is_one_line_and_the_earlier_file_stays(ledger_at, tmp_path, capsys):
    last, _ = head_of(ledger_at)
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    code, err = export(capsys, "--db", ledger_at, "--out", str(out), "--since", str(last + 1))
    assert code == 2 and err == [
        f"residents: --since {last + 1}: no such entry in {ledger_at} (its chain has {last} entries)"
    ]
    assert out.read_bytes() == b"earlier\n" and leftovers(tmp_path) == []


def test_an_out_that_cannot_be_written_is_one_line(built, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = {
        tmp_path / "no-such-folder" / "chain.jsonl": "No such file or directory",
        afile / "chain.jsonl": "Not a directory",
    }
    for out, why in cases.items():
        code, err = export(capsys, "--db", str(built), "--out", str(out))
        assert code == 2 and err == [f"residents: --out {out}: cannot write the export: {why}"]
        assert not out.exists()
    code, err = export(capsys, "--db", str(built), "--out", str(tmp_path))
    assert code == 2 and err == [f"residents: --out {tmp_path}: a folder, not a file"]
    assert leftovers(tmp_path) == []


def test_an_export_replacing_a_file_keeps_its_permissions(built, tmp_path, capsys):
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    out.chmod(0o640)
    assert export(capsys, "--db", str(built), "--out", str(out))[0] == 0
    assert out.stat().st_mode & 0o777 == 0o640 and out.read_bytes() == whole_chain(built)


def run_export_limited(db: Path, out: Path, limit: int) -> subprocess.CompletedProcess[str]:
    """`residents ledger export` as a subprocess whose files may not grow past `limit` bytes (RLIMIT_FSIZE):
    the write that crosses it fails with EFBIG (Python ignores SIGXFSZ), as on a disk that fills up."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, "-m", "residents", "ledger", "export", "--db", str(db), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=out.parent,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=limited,
    )


def test_a_write_that_fails_midway_leaves_the_earlier_file_and_no_part(built, tmp_path):
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    run = run_export_limited(built, out, limit=300_000)  # the export is ~2 MB
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"residents: --out {out}: cannot write the export: File too large"]
    assert out.read_bytes() == b"earlier\n" and leftovers(tmp_path) == []


KILLED_AFTER_A_PAGE = """
import os, signal, sys
from residents import cli
from residents.ledger import export as chain_export

real = chain_export.export_pages

async def killed(*args):
    async for page in real(*args):
        yield page
        os.kill(os.getpid(), signal.SIGKILL)  # after the first page is written: no chance to clean up

chain_export.export_pages = killed
sys.exit(cli.main(sys.argv[1:]))
"""


def test_an_export_killed_midway_leaves_the_earlier_file_whole(built, tmp_path):
    """SIGKILL after the first page is written (no Python left to clean up): the earlier file is untouched;
    what was written is only ever in the hidden temporary file beside it."""
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    run = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_A_PAGE, "ledger", "export", "--db", str(built), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert out.read_bytes() == b"earlier\n"
    [part] = leftovers(tmp_path)
    written = (tmp_path / part).read_bytes()
    assert part.startswith(".chain.jsonl.") and 0 < len(written) and whole_chain(built).startswith(written)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["chain.jsonl"]


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_an_export_interrupted_midway_leaves_the_earlier_file_and_no_part(built, tmp_path, capsys, monkeypatch, how):
    """SIGTERM (or Ctrl-C) after the first page is written: the export stops, says so in one line, removes
    its temporary file and leaves the earlier file as it was."""
    real = chain_export.export_pages
    written: list[int] = []

    async def interrupted(*args: Any) -> AsyncIterator[list[chain.Entry]]:
        async for page in real(*args):
            yield page
            written.append(len(page))
            assert leftovers(tmp_path), "the first page is in the temporary file"
            if how == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(5)  # the loop's handler cancels the export here, before another page is read
            else:
                raise KeyboardInterrupt

    monkeypatch.setattr(chain_export, "export_pages", interrupted)
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    code, err = export(capsys, "--db", str(built), "--out", str(out))
    assert written == [chain_export.EXPORT_PAGE]
    assert code == 130 and err == [f"residents: export interrupted; {out} is as it was before"]
    assert out.read_bytes() == b"earlier\n" and leftovers(tmp_path) == []


def test_an_entry_that_is_not_ascii_is_one_line_and_nothing_is_written(backend: Backend, built, tmp_path, capsys):
    """No entry residents writes holds a non-ASCII byte (canonical JSON escapes them); one put there by hand
    stops the export with one line, the earlier file as it was."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, copy_ledger(str(built), backend.location)).result()
    db = backend.location
    last, digest = head_of(db)
    backend.change(
        "INSERT INTO chain (seq, kind, record, prev, body, hash) VALUES ($1, 'generation', 'g-x', $2, $3, $4)",
        last + 1,
        digest,
        '{"id":"g-x","kind":"generation","note":"é"}',
        "0" * 64,
    )
    out = tmp_path / "chain.jsonl"
    out.write_bytes(b"earlier\n")
    code, err = export(capsys, "--db", db, "--out", str(out))
    assert code == 2 and err == [
        f"residents: {db}: a chain entry is not ASCII, as no entry residents writes is (nothing was exported); "
        "`residents ledger verify` checks the chain"
    ]
    assert out.read_bytes() == b"earlier\n" and leftovers(tmp_path) == []
