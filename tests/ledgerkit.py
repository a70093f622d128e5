"""The ledger's two backends for the ledger's own tests: the `backend` fixture (conftest.py) gives each
test a ledger location on SQLite (a file's path) and on PostgreSQL (a fresh database on the session's
one `pgkit` server), and these helpers read and change rows straight in either, as a person with the
database's own client would: no ledger code in between.

The PostgreSQL case is marked e2e (it starts a server process): `pytest -m "not e2e"` runs the SQLite
case alone and starts no server. A fresh database per test is made from `template0` (~0.15 s): cloning
a migrated template was slower here (~0.45 s) than making one and letting the ledger migrate it (~0.2 s).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import pgkit
import pytest

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql", marks=pytest.mark.e2e)]


def is_pg(location: str) -> bool:
    return location.startswith("postgresql://")


def rows(location: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """A statement's rows read straight from the backend ($1, $2, … parameters on both)."""
    if is_pg(location):
        return pgkit.fetch(location, statement, *params)
    with closing(sqlite3.connect(location)) as con:
        return [tuple(r) for r in con.execute(statement, {str(i): p for i, p in enumerate(params, 1)}).fetchall()]


def change(location: str, statement: str, *params: Any) -> None:
    """A row changed behind the ledger's back ($1, $2, … parameters on both)."""
    if is_pg(location):
        pgkit.fetch(location, statement, *params)
        return
    with closing(sqlite3.connect(location)) as con:
        con.execute(statement, {str(i): p for i, p in enumerate(params, 1)})
        con.commit()


@dataclass(frozen=True)
class Backend:
    """Where a test's ledger is, which backend that is, and how to get another empty place on it."""

    name: str  # "sqlite" | "postgresql"
    location: str  # a file's path, or a database's URL
    make: Callable[[], str] = field(repr=False, compare=False)

    def __str__(self) -> str:
        return self.location

    def another(self) -> str:
        """A second empty location on the same backend (a new file's path, a new database's URL)."""
        return self.make()

    def rows(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        return rows(self.location, statement, *params)

    def change(self, statement: str, *params: Any) -> None:
        change(self.location, statement, *params)
