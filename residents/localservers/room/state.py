"""The room's state: guilds built from a layout, users and their memberships, messages and commands.

No sockets: the gateway, the REST routes and the room API all act through here, and learn of every
change as a RoomEvent (the event bus), which is how the gateway knows what to dispatch.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import discord

from . import validation
from .layout import GuildLayout, Layout, default_layout
from .model import (
    BOT_PERMS,
    BOTS_ROLE,
    EVERYONE_PERMS,
    FLAG_EPHEMERAL,
    MODERATOR_ROLE,
    MSG_DEFAULT,
    MSG_REPLY,
    SETTABLE_FLAGS,
    ApiError,
    Attachment,
    Channel,
    Command,
    Guild,
    Interaction,
    Listener,
    Member,
    Message,
    Overwrite,
    Role,
    RoomEvent,
    Snowflakes,
    User,
    form_error,
    unknown,
)
from .payloads import ATTACHMENT_LIMIT

log = logging.getLogger(__name__)

NONCE_WINDOW_S = 300.0  # Discord: "checked for uniqueness in the past few minutes"
NAME_OK = re.compile(r"^[A-Za-z0-9_.-]{2,32}$")
Upload = tuple[str, bytes, str | None]  # a file: name, bytes, content type


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def content_type_of(filename: str, data: bytes, declared: str | None) -> str | None:
    """The type Discord reports for an upload: the declared one unless it is none or the generic
    `application/octet-stream` (what discord.py sends), else from the bytes or the name; a text type
    whose bytes are UTF-8 carries `; charset=utf-8`, as Discord's does."""
    if declared and declared.split(";")[0].strip().lower() != "application/octet-stream":
        return declared
    found = next((t for magic, t in _MAGIC if data.startswith(magic)), None)
    if found is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        found = "image/webp"
    found = found or mimetypes.guess_type(filename)[0]
    if found is None:
        return declared
    if found.startswith("text/") or found in ("application/json", "application/xml"):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return found
        return f"{found}; charset=utf-8"
    return found


def bot_name_for_token(token: str) -> str:
    """The documented token -> bot name rule (before de-duplication).

    Strip an optional `local-` prefix; if what remains is 2-32 characters of letters, digits,
    `_`, `.` or `-`, the lower-cased remainder is the name (`local-cairn` -> `cairn`).
    Anything else (a real-looking Discord token, say) becomes `bot-` plus 8 hex digits of the
    token's SHA-256, so the same token always yields the same name.
    """
    rest = token[len("local-") :] if token.startswith("local-") else token
    if NAME_OK.match(rest):
        return rest.lower()
    return "bot-" + hashlib.sha256(token.encode()).hexdigest()[:8]


class RoomState:
    """Guilds, their members and messages, and the Discord semantics that act on them."""

    def __init__(self, layout: Layout | None = None, *, interaction_deadline: float = 3.0) -> None:
        self.layout = layout or default_layout()
        self.ids = Snowflakes()
        self.owner_id = self.ids.next()  # a user nobody controls: owners bypass every permission
        self.interaction_deadline = interaction_deadline
        self.base_url = "http://127.0.0.1"
        self.users: dict[int, User] = {}
        self.bots_by_token: dict[str, User] = {}
        self.people_by_name: dict[str, User] = {}
        self.guilds: dict[int, Guild] = {}
        self.channels: dict[int, Channel] = {}
        self.commands: dict[int, Command] = {}
        self.synced: set[tuple[int, int | None]] = set()  # (application, guild or None) that put its commands
        self.interactions: dict[int, Interaction] = {}
        self.attachments: dict[int, Attachment] = {}
        self._nonces: dict[tuple[int, str], tuple[float, Message]] = {}
        self._listeners: list[Listener] = []
        guild_ids = self.ids.milliseconds_apart(len(self.layout.guilds))
        for spec, guild_id in zip(self.layout.guilds, guild_ids, strict=True):
            self._build_guild(spec, guild_id)

    def _build_guild(self, spec: GuildLayout, guild_id: int) -> Guild:
        g = Guild(id=guild_id, name=spec.name, owner_id=self.owner_id)
        g.roles[g.id] = Role(g.id, "@everyone", EVERYONE_PERMS, 0)
        bots = Role(self.ids.next(), BOTS_ROLE, discord.Permissions(EVERYONE_PERMS.value | BOT_PERMS.value), 1)
        g.roles[bots.id] = bots
        for position, (name, perms) in enumerate(spec.roles.items(), start=2):
            rid = self.ids.next()
            g.roles[rid] = Role(rid, name, discord.Permissions(**{p: True for p in perms}), position, mentionable=True)
        for position, name in enumerate(spec.channels):
            ch = Channel(id=self.ids.next(), name=name, position=position, guild=g)
            g.channels[ch.id] = ch
            self.channels[ch.id] = ch
        self.guilds[g.id] = g
        for person, roles in spec.members.items():
            user = self._new_person(person)
            g.members[user.id] = Member(user, [r for r in g.roles.values() if r.name in roles])
        for ch_name, rules in spec.overwrites.items():
            ch = next(c for c in g.channels.values() if c.name == ch_name)
            for rule in rules:
                target = g.role_named(rule.target)
                kind, tid = (0, target.id) if target is not None else (1, self.people_by_name[rule.target].id)
                ch.overwrites.append(
                    Overwrite(
                        tid,
                        kind,
                        discord.Permissions(**{p: True for p in rule.allow}),
                        discord.Permissions(**{p: True for p in rule.deny}),
                    )
                )
        return g

    # ----- events -----------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: RoomEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # one broken listener must not stop the others
                log.exception("room listener failed on %s", event.kind)

    # ----- guilds and channels ----------------------------------------------------------

    @property
    def guild(self) -> Guild:
        """The first guild: the only one of a room started without a layout."""
        return next(iter(self.guilds.values()))

    @property
    def guild_id(self) -> int:
        return self.guild.id

    @property
    def guild_name(self) -> str:
        return self.guild.name

    @property
    def moderator_role_id(self) -> int | None:
        role = self.guild.role_named(MODERATOR_ROLE)
        return role.id if role is not None else None

    def guild_by_id(self, guild_id: int | str) -> Guild:
        try:
            return self.guilds[int(guild_id)]
        except (KeyError, ValueError):
            raise unknown("Guild", 10004) from None

    def channel(self, channel_id: int | str) -> Channel:
        try:
            return self.channels[int(channel_id)]
        except (KeyError, ValueError):
            raise unknown("Channel", 10003) from None

    def channel_by_ref(self, ref: str) -> Channel:
        """A channel by id, `guild/channel`, or a bare name when only one guild has it (the /_room/ API's names)."""
        ref = str(ref).strip().lstrip("#")
        if ref.isdigit() and int(ref) in self.channels:
            return self.channels[int(ref)]
        guild_name, _, name = ref.rpartition("/")
        found = [c for c in self.channels.values() if c.name == name and guild_name in ("", c.guild.name)]
        if len(found) > 1:
            raise ApiError(
                400,
                50035,
                f"channel {name!r} is in guilds {' and '.join(c.guild.name for c in found)}: "
                f"say which, e.g. {found[0].ref!r}",
            )
        if not found:
            raise unknown("Channel", 10003)
        return found[0]

    def visible_channel(self, bot: User, channel_id: int | str) -> Channel:
        """A channel a bot asks for by id: 404 if unknown, 403 if it may not see it."""
        ch = self.channel(channel_id)
        if not self.permissions(bot, ch).view_channel:
            raise ApiError(403, 50001, "Missing Access")
        return ch

    def permissions(self, user: User, channel: Channel) -> discord.Permissions:
        return channel.guild.permissions(user, channel)

    # ----- users ------------------------------------------------------------------------

    def bot_for_token(self, token: str) -> User:
        """The bot user for a token, created on first sight (any non-empty token) and joined to every guild."""
        token = token.strip()
        if not token:
            raise ApiError(401, 0, "401: Unauthorized")
        bot = self.bots_by_token.get(token)
        if bot is not None:
            return bot
        base = bot_name_for_token(token)
        name, n = base, 1
        while self.user_by_name(name) is not None:
            n += 1
            name = f"{base}-{n}"
        bot = User(id=self.ids.next(), name=name, bot=True, token=token)
        self.bots_by_token[token] = bot
        self.users[bot.id] = bot
        log.info("bot %s (%s) joined the room", name, bot.id)
        for g in self.guilds.values():
            g.members[bot.id] = Member(bot, [r for r in g.roles.values() if r.name == BOTS_ROLE])
            self.emit(RoomEvent("member_add", user=bot, guild=g))
        return bot

    def _new_person(self, name: str) -> User:
        name = name.strip()
        if not name or len(name) > 32:
            raise ApiError(400, 50035, "author must be 1-32 characters")
        if name.lower() in ("everyone", "here"):
            raise ApiError(400, 50035, f"{name!r} is reserved by Discord's @{name.lower()} mention")
        user = self.people_by_name.get(name)
        if user is None:
            if self.user_by_name(name) is not None:
                raise ApiError(400, 50035, f"{name!r} is a bot's name")
            user = User(id=self.ids.next(), name=name, bot=False)
            self.people_by_name[name] = user
            self.users[user.id] = user
        return user

    def person(self, name: str, guild: Guild | None = None, *, moderator: bool | None = None) -> User:
        """The person called `name`, a member of `guild` (joining it on first use, with no roles).

        `moderator` is the default room's shortcut: it gives or takes the guild's `moderator` role.
        """
        g = guild or self.guild
        user = self._new_person(name)
        member = g.members.get(user.id)
        if member is None:
            member = g.members[user.id] = Member(user, [])
            self.emit(RoomEvent("member_add", user=user, guild=g))
        if moderator is not None:
            role = g.role_named(MODERATOR_ROLE)
            if role is None:
                raise ApiError(
                    400,
                    50035,
                    f"guild {g.name} has no {MODERATOR_ROLE!r} role: the layout's roles "
                    'decide what a member may do (drop "moderator")',
                )
            if moderator != (role in member.roles):
                member.roles = [r for r in member.roles if r is not role] + ([role] if moderator else [])
                self.emit(RoomEvent("member_update", user=user, guild=g))
        return user

    def is_moderator(self, user: User, guild: Guild | None = None) -> bool:
        g = guild or self.guild
        member = g.members.get(user.id)
        return member is not None and any(r.name == MODERATOR_ROLE for r in member.roles)

    def user_by_name(self, name: str) -> User | None:
        for user in self.users.values():
            if user.name == name:
                return user
        return None

    def bot_by_name(self, name: str) -> User | None:
        user = self.user_by_name(name)
        return user if user is not None and user.bot else None

    def bots(self) -> list[User]:
        return list(self.bots_by_token.values())

    # ----- messages -----------------------------------------------------------------------

    def message(self, channel: Channel, message_id: int | str) -> Message:
        try:
            msg = channel.by_id[int(message_id)]
        except (KeyError, ValueError):
            raise unknown("Message", 10008) from None
        if msg.deleted:
            raise unknown("Message", 10008)
        return msg

    def history(
        self, channel: Channel, *, limit: int = 50, before: int | None = None, after: int | None = None
    ) -> list[Message]:
        """GET /channels/{id}/messages semantics: newest first, `after` takes the oldest after it."""
        if not 1 <= limit <= 100:
            raise form_error(["limit"], "NUMBER_TYPE_MAX", "int value should be between 1 and 100.")
        live = [m for m in channel.messages if not m.deleted]
        if after is not None:
            picked = [m for m in live if m.id > after][:limit]
        else:
            if before is not None:
                live = [m for m in live if m.id < before]
            picked = live[-limit:]
        return list(reversed(picked))

    def create_message(
        self,
        channel: Channel,
        author: User,
        body: dict[str, Any],
        *,
        attachments: Sequence[Upload] = (),
        mtype: int | None = None,
        interaction: Interaction | None = None,
        allow_ephemeral: bool = False,
        allow_empty: bool = False,
        store: bool = True,
    ) -> Message:
        """Validate like Discord and create a message; returns the existing one on a nonce hit.

        `interaction` makes it an interaction's answer (sent through the application's webhook).
        """
        content = validation.check_content(body.get("content"))
        nonce = body.get("nonce")
        if nonce is not None:
            nonce = str(nonce)
            if len(nonce) > 25:
                raise form_error(["nonce"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            if body.get("enforce_nonce"):
                hit = self._nonces.get((author.id, nonce))
                if hit is not None and time.monotonic() - hit[0] < NONCE_WINDOW_S and not hit[1].deleted:
                    log.info("nonce %s from %s matched message %s: not creating another", nonce, author.name, hit[1].id)
                    return hit[1]
        embeds = validation.check_embeds(body.get("embeds"))
        components = validation.check_components(body.get("components"))
        files = [self._store_attachment(channel, name, data, ctype) for name, data, ctype in attachments]
        if (
            not allow_empty
            and not content.strip()
            and not validation.shows_something(embeds)
            and not files
            and not components
            and not body.get("sticker_ids")
            and not body.get("poll")
        ):
            raise validation.empty_message()
        flags = int(body.get("flags") or 0) & (SETTABLE_FLAGS | (FLAG_EPHEMERAL if allow_ephemeral else 0))
        reference = validation.check_reference(channel, body.get("message_reference"))
        msg = Message(
            id=self.ids.next(),
            channel=channel,
            author=author,
            content=content,
            type=mtype if mtype is not None else (MSG_REPLY if reference else MSG_DEFAULT),
            embeds=embeds,
            components=components,
            attachments=files,
            flags=flags,
            tts=bool(body.get("tts", False)),
            nonce=nonce,
            allowed_mentions=body.get("allowed_mentions"),
            reference=reference,
            webhook_id=author.application_id if interaction else None,
            application_id=author.application_id if interaction else None,
            interaction=interaction,
        )
        self._apply_mentions(msg)
        if nonce is not None and body.get("enforce_nonce"):
            self._nonces[(author.id, nonce)] = (time.monotonic(), msg)
        if store and not msg.ephemeral:
            self.store(msg)
        return msg

    def store(self, msg: Message) -> None:
        msg.channel.messages.append(msg)
        msg.channel.by_id[msg.id] = msg
        self.emit(RoomEvent("message_create", message=msg))

    def _apply_mentions(self, msg: Message) -> None:
        validation.apply_mentions(msg, self.users, self.permissions(msg.author, msg.channel).mention_everyone)

    def edit_message(self, msg: Message, body: dict[str, Any], *, editor: User | None = None) -> Message:
        """PATCH a message: content, embeds, components, allowed_mentions (the parts anything here edits).

        Checked whole before anything changes, so a refused edit leaves the message as it was. An edit
        of content or embeds marks it edited; one of its components alone (a button taken away) does not."""
        if editor is not None and msg.author is not editor:
            raise ApiError(403, 50005, "Cannot edit a message authored by another user")
        content = validation.check_content(body["content"]) if "content" in body else msg.content
        embeds = validation.check_embeds(body["embeds"]) if "embeds" in body else msg.embeds
        components = validation.check_components(body["components"]) if "components" in body else msg.components
        if not content.strip() and not embeds and not msg.attachments and not components:
            raise validation.empty_message()
        if "content" in body or "embeds" in body:
            msg.edited_at = discord.utils.utcnow()
        msg.content, msg.embeds, msg.components = content, embeds, components
        if "allowed_mentions" in body:
            msg.allowed_mentions = body["allowed_mentions"]
        self._apply_mentions(msg)
        if not msg.ephemeral and msg.channel.by_id.get(msg.id) is msg:
            self.emit(RoomEvent("message_update", message=msg))
        return msg

    def delete_message(self, msg: Message, *, deleter: User) -> None:
        if msg.author is not deleter and not self.permissions(deleter, msg.channel).manage_messages:
            raise ApiError(403, 50013, "Missing Permissions")
        msg.deleted = True
        self.emit(RoomEvent("message_delete", message=msg))

    def _store_attachment(self, channel: Channel, filename: str, data: bytes, ctype: str | None) -> Attachment:
        if len(data) > ATTACHMENT_LIMIT:
            raise ApiError(413, 40005, "Request entity too large")
        aid = self.ids.next()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", filename) or "file"
        att = Attachment(
            id=aid,
            filename=filename,
            data=data,
            content_type=content_type_of(filename, data, ctype),
            url=f"{self.base_url}/attachments/{channel.id}/{aid}/{safe}",
        )
        self.attachments[aid] = att
        return att

    def typing(self, channel: Channel, user: User) -> None:
        self.emit(RoomEvent("typing", user=user, channel=channel))

    def post_as_person(
        self,
        channel: Channel,
        author: str,
        content: str,
        *,
        reply_to: int | str | None = None,
        mentions: Iterable[str] = (),
        moderator: bool | None = None,
        allowed_mentions: dict[str, Any] | None = None,
        attachments: Sequence[Upload] = (),
    ) -> Message:
        """What Discord's own client does for a person typing: `@name` becomes `<@id>`."""
        person = self.person(author, channel.guild, moderator=moderator)
        if not self.permissions(person, channel).send_messages:
            raise ApiError(403, 50013, f"{person.name} may not send messages in {channel.ref}")
        text = re.sub(
            r"(?<![<\w])@([A-Za-z0-9_.-]{2,32})\b",
            lambda m: f"<@{u.id}>" if (u := self.user_by_name(m.group(1))) else m.group(0),
            content,
        )
        missing = []
        for name in mentions:
            user = self.user_by_name(name)
            if user is None:
                raise ApiError(400, 50035, f"unknown user to mention: {name!r}")
            if not re.search(rf"<@!?{user.id}>", text):
                missing.append(f"<@{user.id}>")
        if missing:
            text = " ".join(missing) + (" " + text if text else "")
        body: dict[str, Any] = {"content": text}
        if allowed_mentions is not None:
            body["allowed_mentions"] = allowed_mentions
        if reply_to is not None:
            body["message_reference"] = {"message_id": str(reply_to), "channel_id": str(channel.id)}
        return self.create_message(channel, person, body, attachments=attachments)

    # ----- application commands ---------------------------------------------------------

    def overwrite_commands(self, bot: User, guild_id: int | None, commands: Any) -> list[Command]:
        """Bulk overwrite, keeping ids for names that survive, as Discord does."""
        if not isinstance(commands, list):
            raise form_error([], "BASE_TYPE_ARRAY", "Must be an array.")
        if len(commands) > 100:
            raise form_error([], "BASE_TYPE_MAX_LENGTH", "Must be 100 or fewer in length.")
        existing = {
            (c.name, c.type): c
            for c in self.commands.values()
            if c.application_id == bot.application_id and c.guild_id == guild_id
        }
        kept: list[Command] = []
        for i, data in enumerate(commands):
            validation.check_command(data, [i])
            old = existing.pop((str(data["name"]), int(data.get("type", 1))), None)
            if old is not None:
                if old.data != data:
                    old.data, old.version = dict(data), self.ids.next()
                kept.append(old)
            else:
                cmd = Command(
                    id=self.ids.next(),
                    application_id=bot.application_id,
                    guild_id=guild_id,
                    data=dict(data),
                    version=self.ids.next(),
                )
                self.commands[cmd.id] = cmd
                kept.append(cmd)
        for gone in existing.values():
            del self.commands[gone.id]
        self.synced.add((bot.application_id, guild_id))
        return kept

    def find_command(self, name: str, bot_name: str | None, guild: Guild, ctype: int = 1) -> Command:
        """`guild`'s command first, then global; `bot_name` may be omitted when only one app has `name`.

        `ctype`: 1 a slash command, 3 a message command (a message's Apps menu)."""
        candidates = [
            c for c in self.commands.values() if c.name == name and c.type == ctype and c.guild_id in (None, guild.id)
        ]
        if bot_name is not None:
            bot = self.bot_by_name(bot_name)
            if bot is None:
                raise ApiError(404, 10013, f"no bot called {bot_name!r}")
            candidates = [c for c in candidates if c.application_id == bot.application_id]
        if not candidates:
            raise ApiError(
                404, 10063, f"no application has a command called {name!r} in guild {guild.name} (did the bot sync?)"
            )
        if len({c.application_id for c in candidates}) > 1:
            raise ApiError(400, 50035, f'several bots have /{name}: say which with "bot"')
        candidates.sort(key=lambda c: c.guild_id is None)  # guild commands win
        return candidates[0]
