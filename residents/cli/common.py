"""What the verbs share: the configuration folder, the default ledger, the usage error, opening a
ledger, and writing output.

Every default path (residences/, policies/, residents.yaml, data/ledger.db) resolves from the
configuration folder (`--config DIR`, default the current folder), never from where the package is
installed; a path typed on the command line is taken as typed.

Output leaves the process as valid UTF-8 whatever the ledger holds: the ledger keeps a lone
surrogate exactly, JSON output escapes it (`\\ud83d` is valid JSON), readable output shows U+FFFD.
"""

from __future__ import annotations

import errno
import json
import re
import sys
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..config import load_project
from ..ledger import Ledger, postgres

DEFAULT_DB = "data/ledger.db"
# The demo's own ledger, under the configuration folder's data/; each run starts it afresh.
DEMO_DB = str(Path("data") / "demo.db")

_SURROGATE = re.compile("[\ud800-\udfff]")


class UsageError(Exception):
    """A command that cannot run as asked; exit 2 with its message."""


def cannot_serve(host: str, port: int, e: OSError) -> UsageError:
    """A port that cannot be bound, named with the option that chooses another."""
    if e.errno == errno.EADDRINUSE:
        return UsageError(f"port {port} on {host} is already in use: pass --port with another (0: any free port)")
    return UsageError(f"cannot serve on {host}:{port}: {e.strerror or e}")


@dataclass
class Options:
    """What the group's options decide for the whole run, read again by `main` when a verb fails."""

    debug: bool = False
    config: Path | None = None  # --config as typed; None: the current folder


def _config_option() -> Path | None:
    ctx = click.get_current_context(silent=True)
    opts = ctx.find_object(Options) if ctx is not None else None
    return opts.config if opts is not None else None


def config_dir() -> Path:
    """The configuration folder of the command being run (`--config`, default the current folder)."""
    return _config_option() or Path.cwd()


def in_config(relative: str) -> str:
    """A default path under the configuration folder (as typed with --config, else relative to here)."""
    config = _config_option()
    return str(config / relative) if config is not None else relative


def ledger_path(db: str | None) -> str:
    """`--db` as typed; else `ledger:` in residents.yaml (a path under the configuration folder, or a
    postgresql:// URL); else the default ledger under the configuration folder."""
    if db is not None:
        return db
    configured = load_project(config_dir()).ledger.db
    if configured is None:
        return in_config(DEFAULT_DB)
    if postgres.is_url(configured) or Path(configured).is_absolute():
        return configured
    return in_config(configured)


def open_ledger(db: str) -> AbstractAsyncContextManager[Ledger]:
    """An existing ledger, for `async with`, read only (beside a running process, on read-only media); a
    missing file is a usage error, never a new empty ledger."""
    if db != ":memory:" and not postgres.is_url(db) and not Path(db).exists():
        raise UsageError(
            f"{db}: no ledger there (`residents run` writes {in_config(DEFAULT_DB)}; the demo's ledger is "
            f"{in_config(DEMO_DB)}, read with --db {in_config(DEMO_DB)}; a replay writes one only with --db PATH)"
        )
    return Ledger.open(db, read_only=True)


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
