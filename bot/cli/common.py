"""What the verbs share: the default ledger, the usage error, opening a ledger, and writing output.

Output leaves the process as valid UTF-8 whatever the ledger holds: the ledger keeps a lone
surrogate exactly, JSON output escapes it (`\\ud83d` is valid JSON), readable output shows U+FFFD.
"""
from __future__ import annotations

import json
import re
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from ..ledger import Ledger


DEFAULT_DB = "data/ledger.db"

_SURROGATE = re.compile("[\ud800-\udfff]")


class UsageError(Exception):
    """A command that cannot run as asked; exit 2 with its message."""


def open_ledger(db: str) -> AbstractAsyncContextManager[Ledger]:
    """An existing ledger, for `async with`; a missing file is a usage error, never a new empty ledger."""
    if db != ":memory:" and not Path(db).exists():
        raise UsageError(f"{db}: no ledger there (run a replay or the bot first, or pass --db)")
    return Ledger.open(db)


def json_text(obj: Any) -> str:
    """One line of JSON; a lone surrogate is written as its escape, so the line is valid UTF-8."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False))


def readable(text: str) -> str:
    """Text for a terminal: a surrogate pair joined into its character, a lone surrogate as U+FFFD."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def emit_json(obj: Any) -> None:
    sys.stdout.write(json_text(obj) + "\n")


def emit(text: str) -> None:
    sys.stdout.write(readable(text) + "\n")
