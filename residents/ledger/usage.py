"""What provider calls cost, read from the ledger: token sums by residence, channel or day, priced as an estimate.

Every attempt keeps the provider's own counts (m045): input neither written to nor read from its prompt
cache, input written to it, input read from it, and output; NULL where the provider gave none. A sum is
of the counts given; the attempts that gave none are counted beside it, never filled in. The cost is the
model table's list prices (`residents/models.yaml`, the operator's rows in residents.yaml) times those
sums: an estimate, never the provider's bill. Read by `residents usage` and a moderator's /usage.

Reads are an index range on `attempts_started` (the attempts since a moment), each joined to its
generation by its primary key.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import models
from .connection import placeholders
from .store import Ledger

By = Literal["residence", "channel", "day"]
BY: tuple[By, ...] = ("residence", "channel", "day")
COUNTS = ("input_tokens", "cache_write_tokens", "cache_read_tokens", "output_tokens")

# The column each grouping keys on; a day is the UTC date the attempt started.
_KEY = {"residence": "g.residence", "channel": "g.channel", "day": "date(a.started_at, 'unixepoch')"}
_REPORT = (
    "SELECT {key} AS k, g.model, count(*), sum(a.input_tokens), sum(a.cache_write_tokens), sum(a.cache_read_tokens),"
    " sum(a.output_tokens), sum(a.input_tokens IS NULL OR a.output_tokens IS NULL)"
    " FROM attempts a CROSS JOIN generations g ON g.id = a.generation_id"
    " WHERE a.started_at >= $1 AND a.outcome != 'streaming'{channels}"
    " GROUP BY k, g.model ORDER BY k, g.model"
)
# The same on PostgreSQL: its join is `JOIN`, its day `to_char` of the UTC time, its sums of BIGINT
# NUMERIC (cast back, as SQLite's integers), and a boolean is counted, not summed.
_KEY_POSTGRESQL = _KEY | {"day": "to_char(to_timestamp(a.started_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"}
_REPORT_POSTGRESQL = (
    "SELECT {key} AS k, g.model, count(*), sum(a.input_tokens)::bigint, sum(a.cache_write_tokens)::bigint,"
    " sum(a.cache_read_tokens)::bigint, sum(a.output_tokens)::bigint,"
    " count(*) FILTER (WHERE a.input_tokens IS NULL OR a.output_tokens IS NULL)"
    " FROM attempts a JOIN generations g ON g.id = a.generation_id"
    " WHERE a.started_at >= $1 AND a.outcome != 'streaming'{channels}"
    " GROUP BY k, g.model ORDER BY k, g.model"
)

ESTIMATE_NOTE = (
    "Costs are estimates: the provider's own token counts times the model table's list prices"
    " (residents/models.yaml, or models: in residents.yaml); the provider's invoice is the bill."
)


def since_of(text: str) -> float:
    """A `since` as epoch seconds: a UTC day (its midnight) or a date and time (UTC unless it gives an
    offset); ValueError saying how to write one."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not a date: write YYYY-MM-DD (a UTC day) or YYYY-MM-DDTHH:MM (UTC unless an offset is given)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def report_sql(by: By, channels: int | None = None, dialect: str = "sqlite") -> str:
    """The report's query in `dialect`; `channels`: how many channel ids it is limited to (None: all)."""
    limit = f" AND g.channel IN ({placeholders(channels, first=2)})" if channels is not None else ""
    if dialect == "postgresql":
        return _REPORT_POSTGRESQL.format(key=_KEY_POSTGRESQL[by], channels=limit)
    return _REPORT.format(key=_KEY[by], channels=limit)


@dataclass
class Line:
    """One group's sums: the provider's counts (None where no attempt of it gave that count), the attempts,
    those that gave no input or no output count, and the estimated cost (None where a model has no price)."""

    key: str
    attempts: int = 0
    input_tokens: int | None = None
    cache_write_tokens: int | None = None
    cache_read_tokens: int | None = None
    output_tokens: int | None = None
    unreported: int = 0
    cost: float | None = 0.0
    unpriced: list[str] = field(default_factory=list)  # models with tokens here but no price in the table

    def add(self, model: str, attempts: int, counts: tuple[int | None, ...], unreported: int) -> None:
        self.attempts += attempts
        self.unreported += unreported
        for name, n in zip(COUNTS, counts, strict=True):
            if n is not None:
                setattr(self, name, (getattr(self, name) or 0) + n)
        inp, cache_write, cache_read, out = (n or 0 for n in counts)
        priced = models.estimated_cost(models.caps(model), inp, out, cache_write, cache_read)
        if priced is None:
            self.cost = None
            if model not in self.unpriced:
                self.unpriced.append(model)
        elif self.cost is not None:
            self.cost += priced

    def as_json(self, by: str) -> dict[str, Any]:
        return {
            by: self.key,
            "attempts": self.attempts,
            **{name: getattr(self, name) for name in COUNTS},
            "attempts_without_counts": self.unreported,
            "estimated_cost_usd": round(self.cost, 6) if self.cost is not None else None,
            "unpriced_models": self.unpriced,
        }


@dataclass
class Report:
    by: By
    since: float | None
    lines: list[Line]
    total: Line

    def as_json(self) -> dict[str, Any]:
        return {
            "by": self.by,
            "since": _iso(self.since),
            "rows": [line.as_json(self.by) for line in self.lines],
            "total": self.total.as_json(self.by) | {self.by: "total"},
            "cost_is_estimate": True,
            "note": ESTIMATE_NOTE,
        }


def _iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z") if ts is not None else None


async def usage(
    ledger: Ledger, by: By = "residence", since: float | None = None, channels: frozenset[str] | None = None
) -> Report:
    """The sums of every settled attempt started at or after `since` (epoch seconds; None: all), grouped
    `by`; `channels`: only generations in these channels (a moderator's scope)."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    chosen = sorted(channels) if channels is not None else None
    rows = await ledger.db.execute_fetchall(
        report_sql(by, len(chosen) if chosen is not None else None, ledger.db.dialect), (since or 0.0, *(chosen or ()))
    )
    lines: dict[str, Line] = {}
    total = Line("total")
    for key, model, attempts, inp, cw, cr, out, unreported in rows:
        counts = (inp, cw, cr, out)
        lines.setdefault(str(key), Line(str(key))).add(model, attempts, counts, unreported)
        total.add(model, attempts, counts, unreported)
    return Report(by, since, list(lines.values()), total)


def table(rep: Report) -> str:
    """The report as a table, the estimate marked on the cost column and said in the last line."""
    if not rep.lines:
        return "no provider calls recorded" + (f" since {_iso(rep.since)}" if rep.since is not None else "")
    head = (
        f"{rep.by:<24} {'attempts':>8} {'input':>12} {'cache write':>12} {'cache read':>12} {'output':>12}"
        f" {'cost (estimate)':>16}"
    )
    out = [head]
    for line in [*rep.lines, rep.total]:
        out.append(
            f"{line.key[:24]:<24} {line.attempts:>8,} {_n(line.input_tokens):>12} {_n(line.cache_write_tokens):>12}"
            f" {_n(line.cache_read_tokens):>12} {_n(line.output_tokens):>12} {_usd(line.cost):>16}"
        )
    notes = []
    if rep.total.unreported:
        notes.append(f"{rep.total.unreported:,} attempt(s) without the provider's input or output count (not summed).")
    if rep.total.unpriced:
        notes.append(f"No price in the model table for: {', '.join(rep.total.unpriced)} (cost shown as n/a).")
    return "\n".join(out + notes + [ESTIMATE_NOTE])


def _n(n: int | None) -> str:
    return f"{n:,}" if n is not None else "n/a"


def _usd(cost: float | None) -> str:
    return f"~${cost:,.4f}" if cost is not None else "n/a"
