"""`residents replay`: one residence through a scripted conversation, on the real pipeline.

The real SDK talks to the local provider server (the `anthropic` SDK to its `/v1/messages`, or for a
residence with `provider: openai-compatible` the `openai` SDK to its `/v1/chat/completions`); generation, ledger, delivery planning and
the outbox are the bot's own code. The one difference from production is the room: posts are
collected, and the room's history is the scenario's turns.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from typing import Any

from .. import truth
from ..context import RoomMessage
from ..context.compile import notes_after
from ..delivery.outbox import Outbox
from ..delivery.resume import Seen
from ..generation.attempts import AttemptRunner
from ..generation.run import Generator
from ..ledger import Ledger
from ..ledger.access import tool_calls_of
from ..localservers.provider import ProviderServer
from ..provider import REGISTRY, Endpoint, connect
from ..records import Post
from ..resident import Resident
from ..text import outbound
from .scenario import Scenario

CHANNEL = "replay"


class CollectingRoom:
    """The room of a replay: posts are kept in order, and they join the history later turns see."""

    def __init__(self, resident_name: str) -> None:
        self.resident = resident_name
        self.history: list[RoomMessage] = []
        self.sent: list[Post] = []
        self.nonces: dict[str, str] = {}  # message id → the post id it was sent with
        self._n = 0
        # A room's message ids are its own for ever, as Discord's are: a ledger holds one reply per trigger
        # message, and a replay may be run again into the same ledger (`--db`).
        self._run = uuid.uuid4().hex[:8]

    def _id(self) -> str:
        self._n += 1
        return f"m{self._n}-{self._run}"

    def say(self, author: str, content: str) -> RoomMessage:
        m = RoomMessage(self._id(), author, False, content)
        self.history.append(m)
        return m

    async def send(self, post: Post) -> str:
        mid = self._id()
        self.history.append(RoomMessage(mid, self.resident, True, post.content, is_bot=True))
        self.sent.append(post)
        self.nonces[mid] = post.id
        return mid

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        """The resident's messages after `after_id` (every one when None: a replay's room keeps no times)."""
        ids = [m.id for m in self.history]
        start = ids.index(after_id) + 1 if after_id in ids else 0
        return [Seen(m.id, m.content, self.nonces.get(m.id)) for m in self.history[start:] if m.is_self]


async def replay(sc: Scenario, db_path: str | None) -> dict[str, Any]:
    tmp = None
    if db_path is None:
        fd, tmp = tempfile.mkstemp(prefix="residents-replay-", suffix=".db")
        os.close(fd)
        os.unlink(tmp)
        db_path = tmp
    server = ProviderServer()
    await server.start()
    try:
        async with Ledger.open(db_path) as ledger:
            # Every provider's calls go to the local server, which speaks each protocol, whatever the base_url.
            reg = REGISTRY[sc.residence.provider]
            local = Endpoint(server.url + reg.base_path, "replay-local", "replay")
            provider = connect(sc.residence.provider, local)
            try:
                room = CollectingRoom(sc.residence.name)
                resident = Resident(
                    sc.residence,
                    Generator(AttemptRunner(provider, ledger)),
                    ledger,
                    Outbox.of_room(ledger, sc.residence.name, room),
                )
                turns = []
                made: set[str] = set()  # attempts of earlier turns: a continuation's generation carries them too
                for t in sc.turns:
                    server.reset(t.calls)
                    first = len(room.sent)
                    if t.say is not None:
                        m = room.say(t.say.author, t.say.content)
                        reply = await resident.respond(room, CHANNEL, list(room.history), trigger=m.id)
                    else:
                        reply = await resident.continue_generation(room, CHANNEL, None)
                    g = reply.generation
                    gj = None
                    if g is not None:
                        g = await ledger.get_generation(g.id)
                    if g is not None:
                        gj = {**g.as_json(), "tool_rounds": [c.as_json() for c in await tool_calls_of(ledger, g.id)]}
                    new = [a.id for a in g.attempts if a.id not in made] if g is not None else []
                    made.update(new)
                    turns.append(
                        {
                            "generation": gj,
                            "attempts_this_turn": len(new),
                            # what the resident's next request shows after this output (its words are shown as posted)
                            "resident_sees": notes_after(g, sc.residence.policy.stumps.resident_reads_own)
                            if g is not None
                            else [],
                            "posts": [
                                {
                                    "kind": p.kind,
                                    "content": p.content,
                                    "id": p.id,
                                    "message_id": p.message_id,
                                    "replacements": p.replacements,
                                }
                                for p in room.sent[first:]
                            ],
                            "requests": list(server.requests),
                            "provider_calls": len(server.requests),
                            **({"declined": reply.declined} if reply.declined else {}),
                        }
                    )
                stumps = [{**s.meta(), "text": s.text} for s in await ledger.list_stumps(limit=1_000_000)]
                return {
                    "residence": sc.residence.name,
                    "db": None if tmp else db_path,
                    "turns": turns,
                    "stumps": stumps,
                }
            finally:
                await provider.close()
    finally:
        await server.stop()
        if tmp:
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(tmp + suffix)
                except FileNotFoundError:
                    pass


def transcript(result: dict[str, Any], sc: Scenario) -> str:
    """The readable form: the room as people would read it, and one line per generation."""
    lines: list[str] = []
    for t, turn in zip(sc.turns, result["turns"], strict=False):
        if t.say is not None:
            lines.append(f"[{t.say.author}] {t.say.content}")
        else:
            lines.append("[moderator] /continue")
        for p in turn["posts"]:
            lines.append(f"[{result['residence']} · {p['kind']}] {outbound(p['content'])[0]}")  # as the room gets it
        g = turn["generation"]
        if g is not None:
            tok = f"{g['output_tokens']:,} tokens" if g["output_tokens"] is not None else "tokens unknown"
            stop = g["stop_reason"] or "no stop reason"
            n, total = turn["attempts_this_turn"], len(g["attempts"])
            attempts = f"{n} attempt(s)" + (f" this turn ({total} in all)" if n != total else "")
            ended = truth.continuation_ended_words(g["continuation"]["ended"], g["continuation"]["standing"])
            lines.append(
                f"  ↳ generation {g['id']}: {g['status']} ({stop}), {g['chars']:,} chars, {tok}, "
                f"{attempts}, {len(g['segments'])} segment(s), continuation {ended}; "
                f"provider calls {turn['provider_calls']}"
            )
            for note in turn["resident_sees"]:
                lines.append(f"  ↳ {result['residence']} sees after it next time: {note}")
            for c in g.get("tool_rounds", []):
                verdict = "error" if c["is_error"] else "ok"
                lines.append(
                    f"    tool round {c['round']}: {c['name']} {json.dumps(c['input'], ensure_ascii=False)} → {verdict}"
                )
            for a in g["attempts"]:
                blocks = a.get("blocks") or []
                if len(blocks) > 1 or any(b["type"] != "text" for b in blocks):
                    lines.append(
                        f"    attempt {a['id']} blocks: "
                        + " · ".join(f"#{b['index']} {b['type']} {b['chars']:,} chars" for b in blocks)
                    )
        lines.append("")
    if result["stumps"]:
        lines.append("stumps:")
        for s in result["stumps"]:
            lines.append(
                f"  {s['id']} {s['cause']} {s['chars']:,} chars, "
                f"{'published' if s['published'] else 'not published'} (generation {s['generation_id']})"
            )
    return "\n".join(lines)
