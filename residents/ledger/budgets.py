"""Daily token budgets in the ledger: what a residence, or one person's mentions, spent since a moment, and
the replies a spent budget refused, each with the notice its channel got (at most one a UTC day).

What is spent is read from the attempts themselves (the provider's own counts, m045), so it survives a
restart and counts every process writing the ledger; so is whether a channel was told today (a refusal
with its notice's post id). Kept apart from `store.py` so each is small.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..records import BudgetRefusal, Post
from . import appending, chain
from .connection import POSTGRESQL
from .store import Ledger

# Input is every token the provider read: not cached, written to its cache, read from it. The attempts of
# the day by `attempts_started`, each joined to its generation by its primary key.
SPENT = (
    "SELECT coalesce(sum(a.input_tokens), 0) + coalesce(sum(a.cache_write_tokens), 0)"
    " + coalesce(sum(a.cache_read_tokens), 0), coalesce(sum(a.output_tokens), 0)"
    " FROM attempts a CROSS JOIN generations g ON g.id = a.generation_id"
    " WHERE a.started_at >= $1 AND g.residence = $2"
)
SPENT_BY_PERSON = SPENT + " AND g.person = $3"
# PostgreSQL's join is `JOIN` (SQLite's `CROSS JOIN` keeps its order: the attempts first).
POSTGRESQL[SPENT] = (
    "SELECT coalesce(sum(a.input_tokens), 0) + coalesce(sum(a.cache_write_tokens), 0)"
    " + coalesce(sum(a.cache_read_tokens), 0), coalesce(sum(a.output_tokens), 0)"
    " FROM attempts a JOIN generations g ON g.id = a.generation_id"
    " WHERE a.started_at >= $1 AND g.residence = $2"
)
POSTGRESQL[SPENT_BY_PERSON] = POSTGRESQL[SPENT] + " AND g.person = $3"
TOLD = (
    "SELECT 1 FROM budget_refusals WHERE residence = $1 AND channel = $2 AND day = $3 AND post_id IS NOT NULL LIMIT 1"
)


@dataclass(frozen=True)
class Spent:
    input: int
    output: int


async def spent(ledger: Ledger, residence: str, since: float, person: str | None = None) -> Spent:
    """Tokens the provider counted for `residence`'s attempts started at or after `since`; with `person`,
    only those of the generations that person's mentions asked for."""
    sql, params = (SPENT, (since, residence)) if person is None else (SPENT_BY_PERSON, (since, residence, person))
    [(inp, out)] = list(await ledger.db.execute_fetchall(sql, params))
    return Spent(int(inp), int(out))


async def told(ledger: Ledger, residence: str, channel: str, day: str) -> bool:
    """Whether `channel` already got `residence`'s budget notice on UTC day `day`."""
    return bool(list(await ledger.db.execute_fetchall(TOLD, (residence, channel, day))))


async def refuse(ledger: Ledger, refusal: BudgetRefusal, posts: list[Post]) -> None:
    """Record a refused reply, its chain entry and the notice posts it gets (none, or the one of the day), in
    one transaction."""
    r = refusal
    # The columns in the chain payload's order, then when: the row and its entry state the same fields.
    fields = (r.id, r.residence, r.channel, r.trigger, r.person, r.scope, r.tokens, r.budget, r.spent, r.day, r.post_id)
    await ledger.write(
        [
            (
                "INSERT INTO budget_refusals (id, residence, channel, trigger, person, scope, tokens, budget, spent,"
                " day, post_id, created_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12)",
                (*fields, r.created_at),
            ),
            appending.append("budget-refusal", r.id, chain.budget_refusal_payload(r)),
        ],
        posts,
    )


async def refusals(ledger: Ledger, residence: str | None = None) -> list[BudgetRefusal]:
    """Every refusal recorded (of `residence`), oldest first."""
    where, params = (" WHERE residence = $1", (residence,)) if residence is not None else ("", ())
    got = await ledger.db.execute_fetchall(
        "SELECT id, residence, channel, trigger, person, scope, tokens, budget, spent, day, post_id, created_at"
        " FROM budget_refusals" + where + " ORDER BY created_at, rowid",
        params,
    )
    return [BudgetRefusal(*r) for r in got]
