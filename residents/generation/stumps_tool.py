"""The resident's own tool, `stumps`: its set-aside texts, which it may list, read, guard and publish.

The stumps are the resident's own words, so the resident decides who reads them: `set_access`
chooses whether moderators may read a stump's text (the operator's `stumps.moderators_read_text:
false` stays a ceiling it cannot raise), and `publish` puts a set-aside text into the room as posts
of kind `recovered` with one receipt. A resident sees and acts only on its own stumps made in the
channel it is speaking in, so no text crosses channels through the tool. Every read of a text is
recorded before the text is returned. Bad input is an error result (`is_error`), never an exception.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

from .. import truth
from ..config import Residence
from ..ledger import Ledger
from ..ledger import access as acc
from ..records import Generation

LIST_LIMIT = 50  # stumps a `list` returns, newest first
ACTIONS = ("list", "read", "set_access", "publish")
KEYS = {
    "list": {"action"},
    "read": {"action", "id"},
    "set_access": {"action", "id", "access"},
    "publish": {"action", "id"},
}

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(ACTIONS)},
        "id": {"type": "string", "description": "a stump id (s-…), from `list`"},
        "access": {"type": "string", "enum": list(acc.ACCESS)},
    },
    "required": ["action"],
}

# (the stump's metadata, its exact text, the generation publishing it) → facts about the posts
Publisher = Callable[[dict[str, Any], str, Generation], Awaitable[dict[str, Any]]]


def iso(ts: float | None) -> str | None:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if ts else None


def _error(message: str) -> tuple[dict[str, Any], bool]:
    return {"error": message}, True


class StumpsTool:
    """One turn's `stumps` tool: a residence, the channel it speaks in, and how to publish there."""

    def __init__(self, ledger: Ledger, residence: Residence, channel: str, publish: Publisher | None = None) -> None:
        self.ledger, self.residence, self.channel, self.publish = ledger, residence, channel, publish

    def definitions(self) -> list[dict[str, Any]]:
        return [{"name": truth.STUMPS_TOOL, "description": truth.STUMPS_TOOL_DESCRIPTION, "input_schema": INPUT_SCHEMA}]

    def moderators_may_read(self, access: str) -> bool:
        return self.residence.policy.stumps.moderators_read_text and access == "moderators"

    async def call(self, g: Generation, round_: int, name: str, value: Any) -> tuple[dict[str, Any], bool]:
        if name != truth.STUMPS_TOOL:
            return _error(f"no tool named {name!r}; the one tool here is {truth.STUMPS_TOOL!r}")
        if not isinstance(value, dict):
            return _error("the input must be a JSON object")
        action = value.get("action")
        if action not in ACTIONS:
            return _error(f"unknown action {action!r}; the actions are {', '.join(ACTIONS)}")
        extra = sorted(set(value) - KEYS[action])
        if extra:
            return _error(f"{action} takes no {', '.join(map(repr, extra))}")
        if action == "list":
            return await self._list(), False
        sid = value.get("id")
        if not isinstance(sid, str) or not sid:
            return _error(f"{action} needs `id`, a stump id from `list`")
        meta = await acc.own_stump(self.ledger, self.residence.name, self.channel, sid.strip())
        if meta is None:
            return _error(f"no stump {sid!r} of {self.residence.name} in this channel")
        if action == "read":
            return await self._read(g, meta), False
        if action == "set_access":
            return await self._set_access(g, meta, value.get("access"))
        return await self._publish(g, meta)

    async def _list(self) -> dict[str, Any]:
        rows, total = await acc.own_stumps(self.ledger, self.residence.name, self.channel, LIST_LIMIT)
        reads = await acc.reads_of(self.ledger, [r["id"] for r in rows])
        return {
            "action": "list",
            "channel": self.channel,
            "total": total,
            "shown": len(rows),
            "stumps": [self._describe(r, reads[r["id"]]) for r in rows],
        }

    def _describe(self, r: dict[str, Any], reads: list[dict[str, Any]]) -> dict[str, Any]:
        out = {
            "id": r["id"],
            "cause": r["cause"],
            "scope": r["scope"],
            "chars": r["chars"],
            "tokens": r["output_tokens"],
            "when": iso(r["created_at"]),
            "channel": r["channel"],
            "access": r["access"],
            "moderators_may_read": self.moderators_may_read(r["access"]),
            "published": bool(r["published"]),
            "generation": r["generation_id"],
            "reads": [{"reader": x["reader"], "kind": x["kind"], "when": iso(x["at"])} for x in reads],
        }
        if r["block_type"]:
            out["block_type"] = r["block_type"]
        return out

    async def _read(self, g: Generation, meta: dict[str, Any]) -> dict[str, Any]:
        await acc.record_read(self.ledger, meta["id"], self.residence.name, "resident", g.id)
        text = await acc.stump_text(self.ledger, meta["id"])
        return {"action": "read", "id": meta["id"], "cause": meta["cause"], "chars": meta["chars"], "text": text}

    async def _set_access(self, g: Generation, meta: dict[str, Any], access: Any) -> tuple[dict[str, Any], bool]:
        if access not in acc.ACCESS:
            return _error(f"set_access needs `access`: {' or '.join(map(repr, acc.ACCESS))}, not {access!r}")
        await acc.set_access(self.ledger, meta["id"], access, self.residence.name, g.id)
        out: dict[str, Any] = {
            "action": "set_access",
            "id": meta["id"],
            "access": access,
            "moderators_may_read": self.moderators_may_read(access),
        }
        if access == "moderators" and not self.residence.policy.stumps.moderators_read_text:
            out["ceiling"] = "the operator's policy keeps stump text from moderators whatever the access"
        return out, False

    async def _publish(self, g: Generation, meta: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if meta["scope"] == "block":
            return _error(f"stump {meta['id']} is a {meta['block_type']} block, not reply text; only text is published")
        if meta["scope"] == "output":
            if truth.is_refusal(meta["cause"]):
                return _error(f"stump {meta['id']} is a reply the provider declined (refusal); it is not published")
            return _error(
                f"stump {meta['id']} is the text of reply {meta['generation_id']}, which is posted as that "
                "reply's own partial posts"
            )
        if meta["published"] or await acc.publication_of(self.ledger, meta["id"]):
            return _error(f"stump {meta['id']} is already published")
        if self.publish is None:
            return _error("publishing is not available here")
        text = await acc.stump_text(self.ledger, meta["id"])
        if not text.strip():
            return _error(f"stump {meta['id']} holds only whitespace; there is nothing to publish")
        facts = await self.publish(meta, text, g)
        return {
            "action": "publish",
            "id": meta["id"],
            "chars": meta["chars"],
            "channel": meta["channel"],
            **facts,
        }, False
