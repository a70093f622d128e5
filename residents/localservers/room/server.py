"""RoomServer: a local Discord-compatible server (REST + gateway) over real sockets.

The real discord.py client logs in to it after `point_at_local(url)`, so a person without a
bot token can try the residents offline, and tests exercise the same code paths as on Discord.
One guild by default; a layout (`residents room --layout`) builds several, with roles, members
and channel permission overwrites.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from aiohttp import web

from . import payloads
from .faults import ConnectionOutage, FaultPlan
from .gateway import Gateway
from .interactions import Interactions
from .jsonhttp import error_middleware
from .layout import Layout, default_layout
from .model import ApiError, Interaction, RoomEvent
from .rest import DiscordRest
from .roomapi import RoomApi
from .state import RoomState, Upload

log = logging.getLogger(__name__)

T = TypeVar("T")

Annotator = Callable[[list[str]], Awaitable[dict[str, dict[str, Any]]]]
"""`async (message_ids) -> {message_id: {"kind": ..., "generation_id": ...}}`: what the room can't know itself."""


class Show(Protocol):
    """A script someone plays in the room (the demo): its state for the page, and a way to play it again."""

    def status(self) -> dict[str, Any]: ...
    async def play_again(self) -> dict[str, Any]: ...


class RoomServer:
    """Guilds with text channels; any bot token logs in (and joins every guild), people post through /_room/."""

    def __init__(
        self,
        channels: Sequence[str] = ("general",),
        guild_name: str = "residents",
        *,
        layout: Layout | None = None,
        interaction_deadline: float = 3.0,
    ) -> None:
        self.state = RoomState(
            layout or default_layout(list(channels), guild_name), interaction_deadline=interaction_deadline
        )
        self.desk = Interactions(self.state)
        self.faults = FaultPlan()
        self.outage = ConnectionOutage()
        self.faults.refuse = self.refuse_connections
        self.gateway = Gateway(self.state, self.gateway_url)
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._bound: tuple[str, int] | None = None
        self._changed = asyncio.Event()
        self._event_queues: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self._annotator: Annotator | None = None
        self._show: Show | None = None
        self.watched = asyncio.Event()  # set when the first page (or other client) opens the event stream
        self.state.subscribe(self._on_room_event)

    # ----- lifecycle ------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on host:port (0 = any free port); returns the base URL `http://host:port`."""
        app = web.Application(middlewares=[self.outage.middleware, error_middleware], client_max_size=32 * 1024 * 1024)
        DiscordRest(self.state, self.desk, self.faults, self.gateway_url).add_routes(app)
        RoomApi(self).add_routes(app)
        app.router.add_get("/gateway", self.gateway.handle)
        app.router.add_get("/gateway/", self.gateway.handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        bound = runner.addresses[0]
        self._bound = (host, bound[1])
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{bound[1]}"
        self.state.base_url = self.url
        log.info(
            "local Discord room listening on %s (%s)",
            self.url,
            "; ".join(
                f"{g.name}: {', '.join(c.name for c in g.channels.values())}" for g in self.state.guilds.values()
            ),
        )
        return self.url

    async def stop(self) -> None:
        """Close gateways and event streams, then the listener."""
        for queue in list(self._event_queues):
            queue.put_nowait(None)
        await self.outage.cancel()
        await self.gateway.close_all()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        log.info("local Discord room stopped")

    def gateway_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/gateway/"

    # ----- read the room ------------------------------------------------------------------------

    @property
    def guild_id(self) -> str:
        """The first guild's id (the only guild of a room without a layout)."""
        return str(self.state.guild_id)

    def channel_id(self, name: str = "general") -> str:
        """A channel's id by name, `guild/channel` or id."""
        return str(self.state.channel_by_ref(name).id)

    def snapshot(self) -> dict[str, Any]:
        """GET /_room/state."""
        state = self.state
        guilds = list(state.guilds.values())
        return {
            "url": self.url,
            "gateway_url": self.gateway_url(),
            "guild": {"id": str(state.guild_id), "name": state.guild_name},
            "guilds": [
                {
                    "id": str(g.id),
                    "name": g.name,
                    "channels": [{"id": str(c.id), "name": c.name, "ref": c.ref} for c in g.channels.values()],
                    "roles": [
                        {"id": str(r.id), "name": r.name, "permissions": [n for n, on in r.permissions if on]}
                        for r in g.roles.values()
                    ],
                    "members": [
                        {"name": m.user.name, "bot": m.user.bot, "roles": [r.name for r in m.roles]}
                        for m in g.members.values()
                    ],
                }
                for g in guilds
            ],
            "channels": [
                {"id": str(c.id), "name": c.name, "guild": c.guild.name, "ref": c.ref} for c in state.channels.values()
            ],
            "bots": [
                {
                    "id": str(b.id),
                    "name": b.name,
                    "application_id": str(b.application_id),
                    "connected": self.gateway.connected(b),
                    "commands": sorted(
                        {c.name for c in state.commands.values() if c.application_id == b.application_id}
                    ),
                    # in how many guilds it has put its command list (an empty one included)
                    "synced": sum(1 for app, _g in state.synced if app == b.application_id),
                }
                for b in state.bots()
            ],
            "people": [
                {
                    "id": str(p.id),
                    "name": p.name,
                    "moderator": state.is_moderator(p),
                    "guilds": {g.name: [r.name for r in g.members[p.id].roles] for g in guilds if p.id in g.members},
                }
                for p in state.people_by_name.values()
            ],
            "gateway": {
                "identifies": self.gateway.identifies,
                "resumes": self.gateway.resumes,
                "sessions": [
                    {
                        "bot": s.bot.name,
                        "shard": list(s.shard) if s.shard is not None else None,
                        "connected": s.conn is not None,
                    }
                    for s in self.gateway.live_sessions()
                ],
                "sharding": {
                    "guilds_per_shard": state.layout.sharding.guilds_per_shard,
                    "max_guilds_per_session": state.layout.sharding.max_guilds_per_session,
                    "max_concurrency": state.layout.sharding.max_concurrency,
                },
            },
            "annotator": self._annotator is not None,
            "show": self._show.status() if self._show is not None else None,
        }

    def messages(self, channel: str = "general", member: str | None = None) -> list[dict[str, Any]]:
        """Every live message in the channel, oldest first, as /_room/ renders it.

        With `member` (a person's name), only if that member may see the channel (403 otherwise).
        """
        ch = self.state.channel_by_ref(channel)
        if member is not None:
            user = self.state.people_by_name.get(member)
            if user is None or not self.state.permissions(user, ch).view_channel:
                raise ApiError(403, 50001, f"{member} cannot see {ch.ref}")
        return [payloads.room_view(m) for m in ch.messages if not m.deleted]

    @property
    def resumes(self) -> int:
        return self.gateway.resumes

    # ----- annotations --------------------------------------------------------------------------

    def set_annotator(self, fn: Annotator | None) -> None:
        """Let the web page show what each message is (speech, partial, receipt, notice).

        Discord itself has no such field; the kind lives in whoever posted the message (the demo's
        ledger), so the room asks back through `fn` rather than importing it.
        """
        self._annotator = fn

    async def annotations(self, message_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """GET /_room/annotations: the annotator's answer for these ids, restricted to them ({} without one)."""
        if self._annotator is None or not message_ids:
            return {}
        wanted = list(dict.fromkeys(str(m) for m in message_ids))
        found = await self._annotator(wanted)
        return {mid: dict(found[mid]) for mid in wanted if isinstance(found.get(mid), dict)}

    # ----- a show (the demo's script) ------------------------------------------------------------

    def set_show(self, show: Show | None) -> None:
        """Let the page show a script's progress and offer to play it again (`/_room/show`)."""
        self._show = show

    def show_status(self) -> dict[str, Any] | None:
        return self._show.status() if self._show is not None else None

    async def play_show_again(self) -> dict[str, Any]:
        if self._show is None:
            raise ApiError(404, 0, "nothing is playing in this room")
        return await self._show.play_again()

    def publish(self, item: dict[str, Any]) -> None:
        """Put an event of the room's own (not Discord's) on the page's event stream: `{"type": ..., ...}`."""
        for queue in list(self._event_queues):
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                log.warning("event stream subscriber is not reading: dropping it")
                self._event_queues.discard(queue)

    # ----- act in the room ----------------------------------------------------------------------

    def clear_channel(self, channel: str) -> int:
        """Delete every message of a channel, as the room itself (bots see MESSAGE_DELETE); how many."""
        ch = self.state.channel_by_ref(channel)
        live = [m for m in ch.messages if not m.deleted]
        for msg in live:
            msg.deleted = True
            self.state.emit(RoomEvent("message_delete", message=msg))
        return len(live)

    def post(
        self,
        channel: str,
        author: str,
        content: str,
        *,
        reply_to: int | str | None = None,
        mentions: Iterable[str] = (),
        moderator: bool | None = None,
        allowed_mentions: dict[str, Any] | None = None,
        attachments: Sequence[Upload] = (),
    ) -> dict[str, Any]:
        """Post as the person `author`, with any files (name, bytes, content type or None); dispatched to
        bots before this returns."""
        ch = self.state.channel_by_ref(channel)
        msg = self.state.post_as_person(
            ch,
            author,
            content,
            reply_to=reply_to,
            mentions=mentions,
            moderator=moderator,
            allowed_mentions=allowed_mentions,
            attachments=attachments,
        )
        return payloads.room_view(msg)

    async def invoke_command(
        self,
        channel: str,
        member: str,
        name: str,
        *,
        bot: str | None = None,
        options: list[dict[str, Any]] | None = None,
        moderator: bool | None = None,
        timeout: float = 10.0,
        settle: float = 0.25,
        target: str | None = None,
    ) -> dict[str, Any]:
        """Run /name as `member` in `channel`; wait for the callback and follow-ups (quiet for `settle` s).

        With `target` (a message id in `channel`), run the message command `name` on that message, as
        its Apps menu does. The member's roles in the channel's guild, with the channel's overwrites,
        decide the permissions the bot is told; `moderator` is the default room's shortcut for its
        `moderator` role.
        """
        ch = self.state.channel_by_ref(channel)
        command = self.state.find_command(name, bot, ch.guild, 1 if target is None else 3)
        owner = self.state.users[command.application_id]
        if not self.gateway.live_sessions(owner):
            raise ApiError(409, 0, f"bot {owner.name!r} has no gateway session")
        inter = self.desk.create(ch, member, command, options, moderator=moderator, target=target)
        timed_out = await self._await_responses(inter, timeout, settle)
        return {
            "interaction_id": str(inter.id),
            "command": command.name,
            "bot": owner.name,
            "member": inter.user.name,
            "moderator": self.state.is_moderator(inter.user, ch.guild),
            "channel": ch.ref,
            "permissions": [n for n, on in self.state.permissions(inter.user, ch) if on],
            "responses": list(inter.responses),
            "timed_out": timed_out,
        }

    async def press_button(
        self,
        channel: str,
        member: str,
        message_id: str,
        custom_id: str,
        *,
        timeout: float = 10.0,
        settle: float = 0.25,
    ) -> dict[str, Any]:
        """`member` presses the button `custom_id` on message `message_id` of `channel`, as Discord's client
        does; waits for the answer and follow-ups (quiet for `settle` s), as `invoke_command` does."""
        ch = self.state.channel_by_ref(channel)
        message = self.state.message(ch, message_id)
        if message.author.bot and not self.gateway.live_sessions(message.author):
            raise ApiError(409, 0, f"bot {message.author.name!r} has no gateway session")
        inter = self.desk.press(ch, member, message_id, custom_id)
        timed_out = await self._await_responses(inter, timeout, settle)
        return {
            "interaction_id": str(inter.id),
            "custom_id": custom_id,
            "message_id": str(message.id),
            "bot": inter.bot.name,
            "member": inter.user.name,
            "channel": ch.ref,
            "permissions": [n for n, on in self.state.permissions(inter.user, ch) if on],
            "responses": list(inter.responses),
            "timed_out": timed_out,
        }

    async def _await_responses(self, inter: Interaction, timeout: float, settle: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last_count, last_change = 0, loop.time()
        while True:
            now = loop.time()
            if len(inter.responses) != last_count:
                last_count, last_change = len(inter.responses), now
            # a message (4) or an edit of the button's message (7) answers at once; 5 and 6 wait for a follow-up
            complete = any(r["kind"] != "callback" or r["type"] in (4, 7) for r in inter.responses)
            if complete and now - last_change >= settle:
                return False
            if now >= deadline:
                return not complete
            wait = deadline - now
            if complete:
                wait = min(wait, settle - (now - last_change))
            await self._wait_changed(max(wait, 0.0))

    async def wait_for_message(
        self, predicate: Callable[[dict[str, Any]], bool], *, channel: str | None = None, timeout: float = 5.0
    ) -> dict[str, Any]:
        """The first message (room view) matching `predicate`, waiting up to `timeout` s for it."""

        def check() -> dict[str, Any] | None:
            refs = [channel] if channel else [str(c.id) for c in self.state.channels.values()]
            for ref in refs:
                for view in self.messages(ref):
                    if predicate(view):
                        return view
            return None

        return await self.wait_until(check, timeout=timeout)

    async def wait_until(self, check: Callable[[], T | None], *, timeout: float = 5.0) -> T:
        """Re-run `check` on every room change until it returns non-None; TimeoutError after `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = check()
            if result is not None:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"room condition not met within {timeout}s")
            await self._wait_changed(remaining)

    async def _wait_changed(self, timeout: float) -> None:
        event = self._changed
        try:
            await asyncio.wait_for(event.wait(), timeout=timeout)
        except TimeoutError:
            pass

    # ----- faults -------------------------------------------------------------------------------

    def fail_message_posts(
        self,
        status: int = 500,
        *,
        nth: int = 1,
        times: int = 1,
        retry_after: float = 0.05,
        is_global: bool = False,
        after_create: bool = False,
        refuse_seconds: float | None = None,
    ) -> None:
        """Answer the `nth` next bot message POST with `status` (429 carries retry_after), `times` times.

        `after_create` (5xx only) stores the message first, like a response lost on the way back.
        `refuse_seconds` answers nothing instead: that POST's connection is cut and the room refuses
        connections for that long (`refuse_connections`).
        """
        self.faults.add(
            status,
            nth=nth,
            times=times,
            retry_after=retry_after,
            is_global=is_global,
            after_create=after_create,
            refuse_seconds=refuse_seconds,
        )

    async def drop_gateway(self, *, hold: bool = False, shard: int | None = None) -> int:
        """Close all bots' websockets with 4000 (resumable), or only those of shard `shard`; `hold` keeps
        them out until release_gateway()."""
        return await self.gateway.drop(hold=hold, shard=shard)

    async def invalidate_sessions(self, *, hold: bool = False, shard: int | None = None) -> int:
        """End every bot's gateway session, or only those of shard `shard` (its RESUME gets INVALID_SESSION,
        so it identifies anew and misses what was said meanwhile); `hold` keeps them out until
        release_gateway()."""
        return await self.gateway.invalidate(hold=hold, shard=shard)

    def release_gateway(self) -> None:
        self.gateway.release()

    async def refuse_connections(self, seconds: float) -> None:
        """Accept no TCP connection for `seconds` and cut the REST connections open now (gateways stay)."""
        if self._runner is None or self._bound is None:
            raise ApiError(409, 0, "the room is not listening")
        await self.outage.refuse(self._runner, *self._bound, seconds)

    def faults_view(self) -> dict[str, Any]:
        return {
            "message_post": [f.describe() for f in self.faults.pending],
            "hits": self.faults.hits,
            "connections": self.outage.describe(),
        }

    # ----- change notification and the event stream ---------------------------------------------

    def subscribe_events(self) -> asyncio.Queue[dict[str, Any] | None]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=10000)
        self._event_queues.add(queue)
        self.watched.set()
        return queue

    def unsubscribe_events(self, queue: asyncio.Queue[dict[str, Any] | None]) -> None:
        self._event_queues.discard(queue)

    def _on_room_event(self, event: RoomEvent) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if not self._event_queues:
            return
        item = self._event_item(event)
        if item is None:
            return
        for queue in list(self._event_queues):
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                log.warning("event stream subscriber is not reading: dropping it")
                self._event_queues.discard(queue)

    def _event_item(self, event: RoomEvent) -> dict[str, Any] | None:
        if event.kind in ("message_create", "message_update", "message_delete") and event.message is not None:
            return {"type": event.kind, "message": payloads.room_view(event.message)}
        if event.kind == "typing" and event.user is not None and event.channel is not None:
            return {"type": "typing", "channel_id": str(event.channel.id), "user": event.user.name, "time": time.time()}
        if event.kind == "interaction_response" and event.interaction is not None:
            return {
                "type": "interaction_response",
                "interaction_id": str(event.interaction.id),
                "command": event.interaction.name,
                "custom_id": event.interaction.custom_id,
                "member": event.interaction.user.name,
                "channel_id": str(event.interaction.channel.id),
                "response": event.response,
            }
        if event.kind in ("member_add", "member_update") and event.user is not None and event.guild is not None:
            return {
                "type": event.kind,
                "user": {
                    "id": str(event.user.id),
                    "name": event.user.name,
                    "bot": event.user.bot,
                    "guild": event.guild.name,
                    "moderator": self.state.is_moderator(event.user, event.guild),
                },
            }
        return None


async def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    channels: Sequence[str] = ("general",),
    guild_name: str = "residents",
    layout: Layout | None = None,
    announce: Callable[[RoomServer], None] | None = None,
) -> None:
    """Run a room until cancelled (the `residents room` command wraps this); `announce` is told once it listens."""
    server = RoomServer(channels, guild_name, layout=layout)
    url = await server.start(host, port)
    log.info(
        "point bots at %s (REST %s/api/v10, gateway %s); people post via %s/_room/", url, url, server.gateway_url(), url
    )
    if announce is not None:
        announce(server)
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
