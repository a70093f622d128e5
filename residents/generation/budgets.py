"""Daily token budgets (`policy.budgets`), asked before any provider call of a turn.

A residence's budget counts every attempt of the UTC day; a person's, the attempts of the generations that
person's mentions asked for. A budget is spent when what the provider counted that day reaches it; then the
turn makes no provider call. Counts the provider did not give are not counted (never estimated), and a
generation already under way finishes: the next turn is the one refused.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ..config import Budgets, PersonBudgets
from ..ledger import Ledger
from ..ledger import budgets as ledger_budgets


@dataclass(frozen=True)
class Reached:
    """A spent budget: whose (`residence` or `person`), which tokens (`input` or `output`), its size, and
    what was counted."""

    scope: str
    tokens: str
    budget: int
    spent: int


def utc_day(now: float) -> tuple[str, float]:
    """The UTC day of `now` (YYYY-MM-DD) and the moment it began."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).date()
    return day.isoformat(), dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def has_budget(b: Budgets | PersonBudgets) -> bool:
    return b.daily_input_tokens is not None or b.daily_output_tokens is not None


def first_reached(scope: str, b: Budgets | PersonBudgets, spent: ledger_budgets.Spent) -> Reached | None:
    """The budget of `b` that `spent` reaches, output's first."""
    for tokens, budget, n in (
        ("output", b.daily_output_tokens, spent.output),
        ("input", b.daily_input_tokens, spent.input),
    ):
        if budget is not None and n >= budget:
            return Reached(scope, tokens, budget, n)
    return None


async def reached(ledger: Ledger, residence: str, b: Budgets, person: str | None, now: float) -> Reached | None:
    """The first daily budget of `residence` that is spent today: its own, then `person`'s; None when none is."""
    if not has_budget(b) and (person is None or not has_budget(b.per_person)):
        return None
    since = utc_day(now)[1]
    if has_budget(b):
        found = first_reached("residence", b, await ledger_budgets.spent(ledger, residence, since))
        if found is not None:
            return found
    if person is not None and has_budget(b.per_person):
        return first_reached("person", b.per_person, await ledger_budgets.spent(ledger, residence, since, person))
    return None
