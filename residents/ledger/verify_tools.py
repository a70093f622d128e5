"""`ledger verify`'s checks of the tool loop.

Read cold from raw rows, like the rest of `verify`: each recorded tool call was made by the last
attempt of its round, which stopped at `tool_use`, and was answered by a next round; a generation
with tool calls has one segment, whose text is its rounds' text joined by a paragraph break.
"""

from __future__ import annotations

from typing import Any

from .. import truth
from ..records import TEXT_JOIN


def round_finals(attempts: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[str] | None:
    """For a generation with tool calls, the last attempt of each round (segment), in order; else None."""
    if not calls:
        return None
    last: dict[int, str] = {}
    for a in sorted(attempts, key=lambda a: (a["segment"], a["idx"])):
        last[a["segment"]] = a["id"]
    return [last[k] for k in sorted(last)]


def joined_upto(attempts: list[dict[str, Any]], rounds: list[str], attempt_id: str) -> tuple[str, set[str]]:
    """The rounds' text joined up to the round of `attempt_id` (that attempt standing for its round), and
    the attempts it is made of."""
    by_id = {a["id"]: a for a in attempts}
    upto = by_id[attempt_id]["segment"] if attempt_id in by_id else 0
    used = [by_id[r] for r in rounds if by_id[r]["segment"] < upto] + ([by_id[attempt_id]] if upto else [])
    return TEXT_JOIN.join(a["text"] for a in used if a["text"]), {a["id"] for a in used}


def check_tool_calls(
    lines: list[str], g: dict[str, Any], attempts: list[dict[str, Any]], calls: list[dict[str, Any]]
) -> None:
    """Each call was made by its round's last attempt, stopped at tool_use, and a next round answered it."""
    if not calls or g["status"] == "pending":
        return
    where = f"generation {g['id']}"
    by_id = {a["id"]: a for a in attempts}
    rounds = round_finals(attempts, calls) or []
    segments = {a["segment"] for a in attempts}
    for c in calls:
        a = by_id.get(c["attempt_id"])
        if a is None:
            lines.append(f"{where}: tool call {c['round']}.{c['pos']} names unknown attempt {c['attempt_id']}")
            continue
        if a["segment"] != c["round"] or a["id"] not in rounds:
            lines.append(
                f"{where}: tool call {c['round']}.{c['pos']} was not made by the last attempt of round {c['round']}"
            )
        if not truth.is_tool_round(a["stop_reason"]) or a["outcome"] != "completed":
            lines.append(
                f"{where}: tool call {c['round']}.{c['pos']} made by attempt {a['id']}, which is "
                f"{a['outcome']} ({a['stop_reason']}), not a completed tool_use round"
            )
        if c["round"] + 1 not in segments and g["stop_reason"] != truth.INTERRUPTED:
            lines.append(f"{where}: tool call {c['round']}.{c['pos']} was never answered by a round {c['round'] + 1}")
    called = sorted({c["round"] for c in calls})
    if called != list(range(1, len(called) + 1)):
        lines.append(f"{where}: tool calls in rounds {called}, not in rounds 1..{len(called)}")
