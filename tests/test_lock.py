"""The writer's lock (`residents/ledger/lock.py`): the process's, counted, naming its holder.

Across processes (a second `residents run`, a killed holder) it is tested in tests/test_ledger_process.py;
here, what one process sees: a flock on its own open of the file stands in for another process's.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from residents.ledger import Ledger, LedgerInUse, hold_ledger
from residents.ledger.lock import lock_path


@contextmanager
def another_holder(db: Path, text: str) -> Iterator[None]:
    """The lock held by an open file of its own, as another process's would be, with `text` in it."""
    fd = os.open(lock_path(str(db)), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, text.encode())
        yield
    finally:
        os.close(fd)


def free(db: Path) -> bool:
    fd = os.open(lock_path(str(db)), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


async def test_a_process_shares_its_hold_and_the_last_release_lets_go(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    first = await Ledger.open(db)
    second = await Ledger.open(db)  # the demo's reader beside its residents: one process, one hold
    assert Path(lock_path(str(db))).read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    await first.close()
    assert not free(db)
    await second.close()
    assert free(db)
    hold = hold_ledger(str(db))
    hold.release()
    hold.release()  # twice is harmless
    assert free(db)


async def test_a_writer_is_refused_while_another_holds_the_lock_and_nothing_is_made(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    with another_holder(db, "4242 harbour\n"):
        with pytest.raises(LedgerInUse) as refused:
            await Ledger.open(db)
        assert str(refused.value) == (
            f"{db}: in use by process 4242 on harbour; one process writes a ledger at a time"
            " (the read-only `residents ledger` verbs work beside it)"
        )
        assert not db.exists()  # refused before the ledger was created, let alone migrated
    async with Ledger.open(db):
        pass


async def test_a_holder_that_has_not_written_its_name_yet_is_another_process(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    with another_holder(db, ""), pytest.raises(LedgerInUse, match=r"in use by another process;"):
        hold_ledger(str(db))
