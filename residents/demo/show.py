"""The demo's script, played in the room where people look.

The demo's people (alice, bob, and mo the moderator) act through the room's own `/_room/` API, as
members, on a schedule: their lines are posted like anyone's, the residents answer through the real
pipeline, and mo's slash commands are answered by the resident bots. The page is told the script's
progress and each of mo's answers as room events (`show`, `show_command`), so its moderator panel
opens the stump as mo sees it. "Play again" clears the channel (every message deleted, as the room)
and plays the script from the start; the ledger keeps every run.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ..ledger import Ledger
from ..ledger.views import refused_line
from ..localservers.room.model import ApiError
from ..localservers.room.server import RoomServer
from ..records import Post
from .script import Scripted

log = logging.getLogger(__name__)

CHANNEL = "general"
MODERATOR = "mo"

# (who, what they post, the resident who answers)
SCENES: list[tuple[str, str, str]] = [
    ("alice", "@cairn Tell us about the harbour, everything you know.", "cairn"),
    ("bob", "@sill What did Cairn leave out?", "sill"),
    ("alice", "@cairn And the lighthouse?", "cairn"),
]


@dataclass(frozen=True)
class Pace:
    """Seconds the script waits: before it starts, between scenes, and before each of mo's commands."""

    start: float = 0.0
    between: float = 0.0
    command: float = 0.0


BROWSER_PACE = Pace(start=1.5, between=3.0, command=2.0)


@dataclass
class Command:
    label: str  # as typed: `/stumps show id:s-…`
    bot: str
    name: str
    options: list[dict[str, Any]]
    responses: list[dict[str, Any]] = field(default_factory=list)


class DemoShow:
    """Plays SCENES and mo's look at the stumps; tells the room's page how far it got."""

    def __init__(
        self,
        room: RoomServer,
        ledger: Ledger,
        responder: Scripted | None,
        pace: Pace = Pace(),
        settle_timeout: float = 30.0,
    ) -> None:
        self.room, self.ledger, self.responder, self.pace = room, ledger, responder, pace
        self.settle_timeout = settle_timeout
        self.state = "waiting"  # waiting | playing | done | failed
        self.step = 0
        self.runs = 0
        self.problem: str | None = None
        self.generations: list[str] = []  # this run's, one per scene
        self.commands: list[Command] = []  # this run's, answered
        self.task: asyncio.Task[None] | None = None

    @property
    def steps(self) -> int:
        return len(SCENES) + 3

    def status(self) -> dict[str, Any]:
        """What the page shows: where the script is, and whether "Play again" may be pressed."""
        return {
            "name": "residents demo",
            "state": self.state,
            "step": self.step,
            "steps": self.steps,
            "runs": self.runs,
            "channel": CHANNEL,
            "replay": "clears the channel",
            "commands": [self._answer(i, c) for i, c in enumerate(self.commands)],  # what mo saw, for any page
            **({"problem": self.problem} if self.problem else {}),
        }

    def _answer(self, index: int, command: Command) -> dict[str, Any]:
        """One of mo's commands and the answer mo saw, as the page's moderator panel shows it."""
        return {
            "run": self.runs,
            "index": index,
            "label": command.label,
            "bot": command.bot,
            "member": MODERATOR,
            "responses": command.responses,
        }

    # ----- starting ---------------------------------------------------------------------------

    async def start_when_watched(self, within: float) -> None:
        """Start once the first page opens the room, or after `within` seconds, whichever comes first."""
        try:
            await asyncio.wait_for(self.room.watched.wait(), within)
        except TimeoutError:
            pass
        await self.start()

    async def start(self) -> asyncio.Task[None]:
        self.task = asyncio.create_task(self.play(), name="demo-show")
        await asyncio.sleep(0)
        return self.task

    async def play_again(self) -> dict[str, Any]:
        """The page's "Play again": refused while playing; else the channel is cleared and the script restarts."""
        if self.state == "playing" or (self.task is not None and not self.task.done()):
            raise ApiError(409, 0, "the demo is still playing")
        cleared = self.room.clear_channel(CHANNEL)
        if self.responder is not None:
            self.responder.reset()
        log.info("demo: playing again (%d message(s) cleared)", cleared)
        await self.start()
        return self.status()

    # ----- playing ----------------------------------------------------------------------------

    async def play(self) -> None:
        self.runs += 1
        self.state, self.step, self.problem = "playing", 0, None
        self.generations, self.commands = [], []
        self._tell()
        try:
            async with aiohttp.ClientSession(self.room.url) as http:
                await asyncio.sleep(self.pace.start)
                for i, (author, content, resident) in enumerate(SCENES):
                    if i:
                        await asyncio.sleep(self.pace.between)
                    posted = await _call(
                        http, "POST", f"/_room/channels/{CHANNEL}/messages", {"author": author, "content": content}
                    )
                    self.generations.append(await self._settled(str(posted["id"]), resident))
                    self._advance()
                for command in await self._moderator_commands():
                    await asyncio.sleep(self.pace.command)
                    # by name: the room finds the process's one commands bot, which answers for every resident
                    out = await _call(
                        http,
                        "POST",
                        "/_room/commands",
                        {
                            "channel": CHANNEL,
                            "member": MODERATOR,
                            "moderator": True,
                            "name": command.name,
                            "options": command.options,
                            "timeout": 15,
                        },
                    )
                    command.responses = list(out["responses"])
                    self.commands.append(command)
                    self.room.publish({"type": "show_command", **self._answer(len(self.commands) - 1, command)})
                    self._advance()
            self.state = "done"
        except asyncio.CancelledError:
            self.state = "done"
            raise
        except Exception as e:  # one line for the operator and the page; the room stays open
            self.state, self.problem = "failed", f"{type(e).__name__}: {e}"
            log.error("demo script stopped at step %d: %s", self.step + 1, self.problem)
        finally:
            self._tell()

    async def _moderator_commands(self) -> list[Command]:
        """mo looks at Cairn's cut reply, lists Sill's stumps, and opens the one its retry left."""
        cut = self.generations[0]
        stumps = [
            s for s in await self.ledger.list_stumps(residence="sill", limit=20) if s.generation_id in self.generations
        ]
        commands = [
            Command(f"/generation show ref:{cut}", "cairn", "generation", _sub("show", ref=cut)),
            Command("/stumps list resident:sill", "sill", "stumps", _sub("list", resident="sill")),
        ]
        if stumps:
            commands.append(Command(f"/stumps show id:{stumps[0].id}", "sill", "stumps", _sub("show", id=stumps[0].id)))
        return commands

    async def _settled(self, trigger: str, resident: str) -> str:
        return await settled(self.ledger, trigger, resident, self.settle_timeout)

    def _advance(self) -> None:
        self.step += 1
        self._tell()

    def _tell(self) -> None:
        self.room.publish({"type": "show", **self.status()})


async def settled(ledger: Ledger, trigger: str, resident: str, timeout: float = 30.0) -> str:
    """The generation answering message `trigger`, once settled and every post of it delivered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        rows = list(
            await ledger.db.execute_fetchall(
                "SELECT id FROM generations WHERE trigger=$1 AND residence=$2 AND status!='pending'",
                (trigger, resident),
            )
        )
        if rows:
            g = await ledger.get_generation(rows[0][0])
            if g and g.posts and all(p.message_id for p in g.posts):
                return g.id
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{resident} did not answer message {trigger} in {timeout:.0f}s")


def _sub(name: str, **options: str) -> list[dict[str, Any]]:
    return [{"name": name, "type": 1, "options": [{"name": k, "type": 3, "value": v} for k, v in options.items()]}]


async def _call(http: aiohttp.ClientSession, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One `/_room/` request as a member; an error answer raises with the room's message."""
    async with http.request(method, path, json=body) as resp:
        data = await resp.json()
        if resp.status >= 400:
            raise RuntimeError(f"{method} {path}: {resp.status} {data.get('message', '')}")
        return data


USER_MENTION = re.compile(r"<@!?(\d+)>")
SHOWN_LINES = 14  # of each moderator answer; the rest is counted, not shown

TRANSCRIPT_INTRO = [
    "What to look for: Cairn's long answer is cut at its max_tokens, so it is posted as partials and one",
    "receipt line saying so; Sill's first attempt fails mid-stream and is retried, its text kept as a stump",
    "with a notice; then mo, a moderator, opens the cut generation and the stump as the ledger holds them.",
]
# On the real API nothing is scripted to fail: only the cut, which a small max_tokens makes likely.
REAL_API_INTRO = [
    "What to look for: Cairn's answer is limited by a small max_tokens; if it reaches it, it is posted as",
    "partials and one receipt line saying so. Then mo, a moderator, opens that generation and lists the",
    "stumps the ledger holds (a failed and retried attempt would leave one).",
]


def transcript_lines(
    messages: Sequence[dict[str, Any]],
    kinds: dict[str, dict[str, Any]],
    commands: Sequence[Command],
    intro: Sequence[str] = TRANSCRIPT_INTRO,
    refused: Sequence[Post] = (),
) -> list[str]:
    """The headless demo's printout: what to look for, the room with each message's kind (mentions
    shown as @name), the posts the room refused (set aside, so not among its messages), then what mo
    saw, every cut of it marked with what was left out."""
    names = _names(messages)
    lines = [*intro, "", "== the room"]
    for m in messages:
        kind = kinds.get(str(m["id"]), {}).get("kind", "person" if not m["bot"] else "?")
        content = USER_MENTION.sub(lambda found: "@" + names.get(found.group(1), found.group(1)), m["content"])
        body = content if len(content) <= 300 else content[:280] + f" … [{len(content):,} chars]"
        lines.append(f"[{m['author']} · {kind}] {body}")
    if refused:
        lines += ["", "== not in the room: refused by it, set aside"]
        lines += [refused_line(p) for p in refused]
    lines.append("")
    lines.append("== a moderator looks")
    for c in commands:
        lines.append(f"> {c.label}")
        for r in c.responses:
            lines += ["  " + line for line in shown_answer(r.get("content") or "")]
    return lines


def _names(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    """User id -> name, from the authors and the pinged users the room reports."""
    names = {str(m["author_id"]): str(m["author"]) for m in messages if "author_id" in m}
    for m in messages:
        pings = m.get("pings") or {}
        names.update(zip(map(str, pings.get("user_ids", [])), map(str, pings.get("users", [])), strict=False))
    return names


def shown_answer(content: str, limit: int = SHOWN_LINES) -> list[str]:
    """An answer's first `limit` lines; when cut, a code fence left open is closed and a line says how
    many lines were left out, so the cut is as visible as any other in this project."""
    lines = content.splitlines()
    if len(lines) <= limit:
        return lines
    kept = lines[:limit]
    fence_open = sum(1 for line in kept if line.lstrip().startswith("```")) % 2 == 1
    left = len(lines) - limit
    return [*kept, *(["```"] if fence_open else []), f"[… {left} more line{'s' if left != 1 else ''} not shown]"]
