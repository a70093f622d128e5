"""The Discord gateway: HELLO/IDENTIFY/READY, heartbeats, RESUME and event dispatch.

Each IDENTIFY opens a session with its own sequence numbers and an event history, so a
bot whose socket drops can RESUME and receive exactly the events it missed, as on Discord.
Frames are JSON text; discord.py asks for zlib-stream but only inflates binary frames.

Sharding follows Discord's rules: IDENTIFY's `shard` is `[shard_id, num_shards]`, and a session
hears of a guild (READY's list, GUILD_CREATE, every event in it) only if the guild is on its shard,
`(guild_id >> 22) % num_shards == shard_id`; direct messages go to shard 0. A bad `shard` is closed
with 4010, a session that would carry more guilds than the room's `max_guilds_per_session` with 4011.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web

from . import payloads
from .model import ApiError, RoomEvent, User
from .state import RoomState

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_MS = 41250
# discord.py sends a heartbeat from its keep-alive thread and notes the send time there only after
# the event loop has sent it; an ACK read first (instant on loopback) is measured against the
# *previous* heartbeat: "Can't keep up, websocket is 41 s behind". Real Discord's ACK takes a network
# round trip; the room waits this long (at most a quarter of the interval) to give the same order.
HEARTBEAT_ACK_DELAY_S = 0.25
HISTORY_LIMIT = 5000  # events kept per session for RESUME

INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_GUILD_MESSAGE_TYPING = 1 << 11
# GATEWAY_PRESENCE | GATEWAY_GUILD_MEMBERS | GATEWAY_MESSAGE_CONTENT: privileged intents are "approved".
APPLICATION_FLAGS = (1 << 12) | (1 << 14) | (1 << 18)

OP_DISPATCH, OP_HEARTBEAT, OP_IDENTIFY, OP_PRESENCE, OP_VOICE = 0, 1, 2, 3, 4
OP_RESUME, OP_RECONNECT, OP_REQUEST_MEMBERS, OP_INVALID_SESSION, OP_HELLO, OP_HEARTBEAT_ACK = 6, 7, 8, 9, 10, 11

CLOSE_INVALID_SHARD = 4010  # "You sent us an invalid shard when identifying."
CLOSE_SHARDING_REQUIRED = 4011  # "The session would have handled too many guilds"


def shard_of(guild_id: int, num_shards: int) -> int:
    """The shard a guild is on: Discord's `(guild_id >> 22) % num_shards`."""
    return (guild_id >> 22) % num_shards


def parse_shard(value: Any) -> tuple[int, int] | None:
    """IDENTIFY's `shard` as (shard_id, num_shards), or None when it is not a valid pair."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    shard_id, num_shards = value
    return (shard_id, num_shards) if num_shards >= 1 and 0 <= shard_id < num_shards else None


class Connection:
    """One websocket; a single writer task keeps frames in order."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.session: Session | None = None
        self.closed_by_server = False
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop(), name="room-gateway-writer")

    def send(self, frame: str) -> None:
        self._queue.put_nowait(frame)

    def send_json(self, data: dict[str, Any]) -> None:
        self.send(json.dumps(data))

    async def _write_loop(self) -> None:
        while True:
            frame = await self._queue.get()
            if frame is None:
                return
            try:
                await self.ws.send_str(frame)
            except Exception as exc:  # the peer went away: RESUME will replay from history
                log.debug("gateway write failed: %r", exc)
                return

    async def close(self, code: int, *, flush: bool = False) -> None:
        """Close with `code`; `flush` first delivers queued frames (e.g. INVALID_SESSION)."""
        self.closed_by_server = True
        if flush:
            self._queue.put_nowait(None)
            try:
                await asyncio.wait_for(asyncio.shield(self._writer), timeout=1.0)
            except TimeoutError:
                pass
        self._writer.cancel()
        try:
            await self.ws.close(code=code)
        except Exception as exc:
            log.debug("gateway close failed: %r", exc)

    def stop_writer(self) -> None:
        self._writer.cancel()


class Session:
    """An identified gateway session: sequence numbers plus history for RESUME."""

    def __init__(self, session_id: str, bot: User, intents: int, shard: tuple[int, int] | None) -> None:
        self.id = session_id
        self.bot = bot
        self.intents = intents
        self.shard = shard  # (shard_id, num_shards) as IDENTIFY sent it; None: unsharded, i.e. (0, 1)
        self.seq = 0
        self.history: deque[tuple[int, str]] = deque(maxlen=HISTORY_LIMIT)
        self.conn: Connection | None = None
        self.valid = True  # False once the client closed it cleanly (1000/1001): no more RESUME

    def dispatch(self, event: str, data: dict[str, Any]) -> None:
        self.seq += 1
        frame = json.dumps({"op": OP_DISPATCH, "t": event, "s": self.seq, "d": data})
        self.history.append((self.seq, frame))
        if self.conn is not None:
            self.conn.send(frame)

    @property
    def shard_id(self) -> int:
        return self.shard[0] if self.shard is not None else 0

    def wants(self, intent: int) -> bool:
        return bool(self.intents & intent)

    def carries(self, guild_id: int | None) -> bool:
        """Whether events of this guild (None: a direct message) come through this session."""
        shard_id, num_shards = self.shard or (0, 1)
        return shard_id == 0 if guild_id is None else shard_of(guild_id, num_shards) == shard_id


class Gateway:
    """Accepts gateway websockets and turns room events into dispatches."""

    def __init__(self, state: RoomState, gateway_url: Callable[[], str]) -> None:
        self.state = state
        self.gateway_url = gateway_url
        self.sessions: dict[str, Session] = {}
        self.connections: set[Connection] = set()
        self.identifies = 0
        self.resumes = 0
        self.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS  # read when the room starts (a test may lower it)
        self._open = asyncio.Event()
        self._open.set()
        self._tasks: set[asyncio.Task[None]] = set()  # strong refs: the loop only keeps weak ones
        state.subscribe(self._on_room_event)

    # ----- lifecycle ---------------------------------------------------------------------

    async def drop(self, *, code: int = 4000, hold: bool = False, shard: int | None = None) -> int:
        """Close every bot's socket with a resumable code (only shard `shard`'s sessions, if given); `hold`
        delays the HELLO of any new connection until release()."""
        if hold:
            self._open.clear()
        conns = [
            c for c in self.connections if shard is None or (c.session is not None and c.session.shard_id == shard)
        ]
        for conn in conns:
            if conn.session is not None:
                conn.session.conn = None  # from now on events only go to history
        await asyncio.gather(*(conn.close(code) for conn in conns))
        log.info("dropped %d gateway connection(s) with close code %s", len(conns), code)
        return len(conns)

    async def invalidate(self, *, hold: bool = False, shard: int | None = None) -> int:
        """End every bot's session (only shard `shard`'s, if given) and close its socket with a resumable
        code, as when Discord invalidates sessions: the bot's RESUME is answered INVALID_SESSION (not
        resumable) and it must IDENTIFY anew. Events meanwhile are kept for no one: what was said in between
        reaches the bot only through history."""
        ended = [s for s in self.sessions.values() if shard is None or s.shard_id == shard]
        for session in ended:
            session.valid = False
            del self.sessions[session.id]
        log.info("invalidated %d gateway session(s)%s", len(ended), "" if shard is None else f" of shard {shard}")
        return await self.drop(hold=hold, shard=shard)

    def release(self) -> None:
        self._open.set()

    async def close_all(self) -> None:
        self._open.set()
        for session in self.sessions.values():
            session.conn = None
        await asyncio.gather(*(conn.close(1001) for conn in list(self.connections)))

    def live_sessions(self, bot: User | None = None) -> list[Session]:
        return [s for s in self.sessions.values() if s.valid and (bot is None or s.bot.id == bot.id)]

    def connected(self, bot: User) -> bool:
        return any(s.conn is not None for s in self.live_sessions(bot))

    # ----- websocket handling ---------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=4 * 1024 * 1024)
        await ws.prepare(request)
        conn = Connection(ws)
        self.connections.add(conn)
        try:
            if not self._open.is_set():
                log.debug("gateway held: delaying HELLO")
                await self._open.wait()
            conn.send_json(
                {"op": OP_HELLO, "d": {"heartbeat_interval": self.heartbeat_interval_ms, "_trace": ["residents-room"]}}
            )
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._on_frame(conn, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await conn.close(4002, flush=True)  # ETF / compressed payloads aren't spoken here
                elif msg.type == WSMsgType.ERROR:
                    log.debug("gateway socket error: %r", ws.exception())
        finally:
            self.connections.discard(conn)
            conn.stop_writer()
            session = conn.session
            if session is not None and session.conn is conn:
                session.conn = None
                if not conn.closed_by_server and ws.close_code in (1000, 1001):
                    # A clean client close ends the session on Discord: nothing to resume, stop buffering.
                    session.valid = False
                    self.sessions.pop(session.id, None)
                    log.info("bot %s closed gateway session %s", session.bot.name, session.id)
        return ws

    async def _on_frame(self, conn: Connection, raw: str) -> None:
        try:
            payload = json.loads(raw)
            op = payload["op"]
            data = payload.get("d")
        except (ValueError, KeyError, TypeError):
            await conn.close(4002, flush=True)
            return
        if op == OP_HEARTBEAT:
            delay = min(HEARTBEAT_ACK_DELAY_S, self.heartbeat_interval_ms / 4000)
            asyncio.get_running_loop().call_later(delay, conn.send_json, {"op": OP_HEARTBEAT_ACK, "d": None})
        elif op == OP_IDENTIFY:
            await self._identify(conn, data or {})
        elif op == OP_RESUME:
            await self._resume(conn, data or {})
        elif conn.session is None:
            await conn.close(4003, flush=True)  # not authenticated
        elif op in (OP_PRESENCE, OP_VOICE, OP_REQUEST_MEMBERS):
            pass  # GUILD_CREATE sends every member (member_count matches), so discord.py never needs to ask
        else:
            log.warning("unknown gateway op %r from %s", op, conn.session.bot.name)
            await conn.close(4001, flush=True)

    async def _identify(self, conn: Connection, data: dict[str, Any]) -> None:
        if conn.session is not None:
            await conn.close(4005, flush=True)  # already authenticated
            return
        try:
            bot = self.state.bot_for_token(str(data.get("token") or ""))
        except ApiError:
            await conn.close(4004, flush=True)  # authentication failed
            return
        intents = data.get("intents")
        if not isinstance(intents, int) or intents < 0:
            await conn.close(4013, flush=True)  # invalid intents
            return
        shard = None
        if data.get("shard") is not None:
            shard = parse_shard(data["shard"])
            if shard is None:
                log.info("bot %s sent an invalid shard %r: closing with 4010", bot.name, data["shard"])
                await conn.close(CLOSE_INVALID_SHARD, flush=True)
                return
        shard_id, num_shards = shard or (0, 1)
        guilds = [
            g for g in self.state.guilds.values() if bot.id in g.members and shard_of(g.id, num_shards) == shard_id
        ]
        limit = self.state.layout.sharding.max_guilds_per_session
        if len(guilds) > limit:
            log.info(
                "bot %s would carry %d guilds on shard %s of %s (at most %d per session): closing with 4011",
                bot.name,
                len(guilds),
                shard_id,
                num_shards,
                limit,
            )
            await conn.close(CLOSE_SHARDING_REQUIRED, flush=True)
            return
        bot.intents = intents
        session = Session(secrets.token_hex(16), bot, intents, shard)
        self.sessions[session.id] = session
        session.conn = conn
        conn.session = session
        self.identifies += 1
        ready: dict[str, Any] = {
            "v": 10,
            "user": {
                **payloads.user(bot),
                "verified": True,
                "mfa_enabled": False,
                "email": None,
                "flags": 0,
                "locale": "en-US",
            },
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": self.gateway_url(),
            "application": {"id": str(bot.application_id), "flags": APPLICATION_FLAGS},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": [],
            "user_settings": {},
            "_trace": ["residents-room"],
        }
        if session.shard is not None:
            ready["shard"] = list(session.shard)
        session.dispatch("READY", ready)
        for guild in guilds:
            session.dispatch("GUILD_CREATE", payloads.guild(guild))
        log.info(
            "bot %s identified (session %s, intents %s%s)",
            bot.name,
            session.id,
            intents,
            "" if shard is None else f", shard {shard_id} of {num_shards}: {len(guilds)} guild(s)",
        )

    async def _resume(self, conn: Connection, data: dict[str, Any]) -> None:
        session = self.sessions.get(str(data.get("session_id")))
        seq = data.get("seq")
        token = str(data.get("token") or "")
        if (
            session is None
            or not session.valid
            or session.bot.token != token
            or not isinstance(seq, int)
            or (session.history and seq < session.history[0][0] - 1)  # too far behind: the events it missed are gone
        ):
            log.info("RESUME refused for session %s: INVALID_SESSION", data.get("session_id"))
            conn.send_json({"op": OP_INVALID_SESSION, "d": False})
            return
        old = session.conn
        if old is not None and old is not conn:
            old.session = None
            task = asyncio.create_task(old.close(4000))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        session.conn = conn
        conn.session = session
        replayed = 0
        for s, frame in list(session.history):
            if s > seq:
                conn.send(frame)
                replayed += 1
        session.dispatch("RESUMED", {"_trace": ["residents-room"]})
        self.resumes += 1
        log.info(
            "bot %s resumed session %s at seq %s (%d event(s) replayed)", session.bot.name, session.id, seq, replayed
        )

    # ----- room events -> dispatches --------------------------------------------------------

    def _on_room_event(self, event: RoomEvent) -> None:
        state = self.state
        sessions = self.live_sessions()
        msg = event.message
        if event.kind in ("message_create", "message_update", "message_delete") and msg is not None:
            seeing = [
                s
                for s in sessions
                if s.carries(msg.guild.id)
                and s.wants(INTENT_GUILD_MESSAGES)
                and state.permissions(s.bot, msg.channel).view_channel
            ]
            if event.kind == "message_delete":
                data: dict[str, Any] = {
                    "id": str(msg.id),
                    "channel_id": str(msg.channel.id),
                    "guild_id": str(msg.guild.id),
                }
                for session in seeing:
                    session.dispatch("MESSAGE_DELETE", data)
                return
            name = "MESSAGE_CREATE" if event.kind == "message_create" else "MESSAGE_UPDATE"
            for session in seeing:
                session.dispatch(name, payloads.visible(msg, session.bot))
        elif event.kind == "typing" and event.user is not None and event.channel is not None:
            guild = event.channel.guild
            data = {
                "channel_id": str(event.channel.id),
                "guild_id": str(guild.id),
                "user_id": str(event.user.id),
                "timestamp": int(time.time()),
                "member": payloads.member(guild.members[event.user.id]),
            }
            for session in sessions:
                if (
                    session.carries(guild.id)
                    and session.wants(INTENT_GUILD_MESSAGE_TYPING)
                    and session.bot.id != event.user.id
                    and state.permissions(session.bot, event.channel).view_channel
                ):
                    session.dispatch("TYPING_START", data)
        elif event.kind in ("member_add", "member_update") and event.user is not None and event.guild is not None:
            name = "GUILD_MEMBER_ADD" if event.kind == "member_add" else "GUILD_MEMBER_UPDATE"
            data = {**payloads.member(event.guild.members[event.user.id]), "guild_id": str(event.guild.id)}
            for session in sessions:
                if (
                    session.carries(event.guild.id)
                    and session.wants(INTENT_GUILD_MEMBERS)
                    and session.bot.id != event.user.id
                ):
                    session.dispatch(name, data)
        elif event.kind == "interaction_create" and event.interaction is not None:
            for session in self.live_sessions(event.interaction.bot):
                if session.carries(event.interaction.channel.guild.id):
                    session.dispatch("INTERACTION_CREATE", event.interaction.payload)
