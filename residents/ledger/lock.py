"""One process writes a ledger at a time: an OS lock on a file beside it, `LEDGER.lock`.

Two processes writing one ledger each take the other's live replies for ones a stopped process left,
settle them as interrupted with false receipts, and answer every mention twice. So a writer takes
`flock(LOCK_EX | LOCK_NB)` on `LEDGER.lock` before it reads or writes anything, and writes its pid and
host there for the message a second writer is refused with. The kernel lets go of the lock when its
holder dies however it dies (SIGKILL, power loss), so a dead holder never blocks the next start; the
file's stale text is then only overwritten. The file is never deleted: deleting a lock file races
with a process that has just opened it.

A lock is the process's: a second writer in the same process (the demo's reader beside its
residents, tests) shares it, counted, and the last release lets go. Readers (`Ledger.open(...,
read_only=True)`) take no lock, so the read-only verbs work beside a running process and on read-only
media.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from dataclasses import dataclass


class LedgerHeld(Exception):
    """Another process holds the ledger's lock; `holder` is what it wrote there ("pid host"), if anything."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(path, holder)
        self.path, self.holder = path, holder


@dataclass
class _Lock:
    fd: int
    count: int


_held: dict[str, _Lock] = {}  # the locks this process holds, by the lock file's real path
_guard = threading.Lock()


def lock_path(ledger: str) -> str:
    return ledger + ".lock"


class Hold:
    """This process's hold on one ledger's lock; `release()` once (the last release lets go of the lock)."""

    def __init__(self, key: str) -> None:
        self._key: str | None = key

    def release(self) -> None:
        with _guard:
            if self._key is None:
                return
            lock = _held[self._key]
            lock.count -= 1
            if lock.count == 0:
                del _held[self._key]
                os.close(lock.fd)  # the kernel lets go of the flock with its last descriptor
            self._key = None


def acquire(ledger: str) -> Hold:
    """The writer's lock on `ledger`, or LedgerHeld naming the process that has it. Raises OSError when
    the lock file cannot be made (a read-only folder: a writer could not write the ledger either)."""
    path = lock_path(ledger)
    with _guard:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        key = os.path.realpath(path)
        if key in _held:
            os.close(fd)
            _held[key].count += 1
            return Hold(key)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
            os.close(fd)
            raise LedgerHeld(ledger, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        _held[key] = _Lock(fd, 1)
        return Hold(key)


def holder(ledger: str) -> str | None:
    """Who holds `ledger`'s lock ("pid host" as the writer left it, or "" when it left nothing), or None
    when no process does (`residents status`). A shared lock tried and let go at once: a writer starting
    in that instant is refused as if another held the file, and says so."""
    try:
        fd = os.open(lock_path(ledger), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
