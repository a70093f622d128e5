"""In-memory model of one local guild: users, channels, messages, commands and interactions.

Pure state and Discord-shaped payload builders, no sockets, so the gateway, the REST
handlers and the room JSON API all render the same objects the same way. Listeners
receive a RoomEvent for every change, which is how the gateway learns what to dispatch.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

DISCORD_EPOCH_MS = 1420070400000
MAX_CONTENT = 2000
NONCE_WINDOW_S = 300.0  # Discord: "checked for uniqueness in the past few minutes"
FOLLOWUP_WINDOW_S = 15 * 60.0  # interaction tokens stay valid 15 minutes
ATTACHMENT_LIMIT = 10 * 1024 * 1024

# Permission bits (https://discord.com/developers/docs/topics/permissions)
CREATE_INSTANT_INVITE = 1 << 0
ADD_REACTIONS = 1 << 6
VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
MANAGE_MESSAGES = 1 << 13
EMBED_LINKS = 1 << 14
ATTACH_FILES = 1 << 15
READ_MESSAGE_HISTORY = 1 << 16
MENTION_EVERYONE = 1 << 17
USE_EXTERNAL_EMOJIS = 1 << 18
CHANGE_NICKNAME = 1 << 26
USE_APPLICATION_COMMANDS = 1 << 31
MANAGE_THREADS = 1 << 34
SEND_MESSAGES_IN_THREADS = 1 << 38
MODERATE_MEMBERS = 1 << 40

EVERYONE_PERMS = (
    CREATE_INSTANT_INVITE | ADD_REACTIONS | VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS | ATTACH_FILES
    | READ_MESSAGE_HISTORY | USE_EXTERNAL_EMOJIS | CHANGE_NICKNAME | USE_APPLICATION_COMMANDS
    | SEND_MESSAGES_IN_THREADS
)
MODERATOR_PERMS = MANAGE_MESSAGES | MENTION_EVERYONE | MANAGE_THREADS | MODERATE_MEMBERS
# Bots may ping @everyone here, so a resident that forgets allowed_mentions is caught pinging.
BOT_PERMS = MANAGE_MESSAGES | MENTION_EVERYONE | EMBED_LINKS | ATTACH_FILES

# Message types and flags
MSG_DEFAULT = 0
MSG_REPLY = 19
MSG_CHAT_INPUT_COMMAND = 20
FLAG_SUPPRESS_EMBEDS = 1 << 2
FLAG_EPHEMERAL = 1 << 6
FLAG_LOADING = 1 << 7
FLAG_SUPPRESS_NOTIFICATIONS = 1 << 12
FLAG_COMPONENTS_V2 = 1 << 15
SETTABLE_FLAGS = FLAG_SUPPRESS_EMBEDS | FLAG_SUPPRESS_NOTIFICATIONS | FLAG_COMPONENTS_V2

USER_MENTION = re.compile(r"<@!?(\d{1,20})>")
ROLE_MENTION = re.compile(r"<@&(\d{1,20})>")
EVERYONE_MENTION = re.compile(r"@(everyone|here)\b")
NAME_OK = re.compile(r"^[A-Za-z0-9_.-]{2,32}$")
COMMAND_NAME_OK = re.compile(r"^[-_'\w]{1,32}$")


class ApiError(Exception):
    """A Discord-shaped error: HTTP status plus a JSON body with `code` and `message`."""

    def __init__(self, status: int, code: int, message: str, errors: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code} {message}")
        self.status = status
        self.code = code
        self.message = message
        self.errors = errors

    def body(self) -> dict[str, Any]:
        data: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.errors:
            data["errors"] = self.errors
        return data


def form_error(path: Sequence[str | int], code: str, message: str) -> ApiError:
    """Discord's 50035 "Invalid Form Body" with the nested `errors` tree it uses."""
    node: dict[str, Any] = {"_errors": [{"code": code, "message": message}]}
    for key in reversed(list(path)):
        node = {str(key): node}
    return ApiError(400, 50035, "Invalid Form Body", node)


def unknown(kind: str, code: int) -> ApiError:
    return ApiError(404, code, f"Unknown {kind}")


class Snowflakes:
    """Monotonic ids in Discord's snowflake layout, so ids sort by creation time like Discord's."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        now_ms = int(time.time() * 1000)
        candidate = ((now_ms - DISCORD_EPOCH_MS) << 22) | (1 << 17) | (1 << 12)
        self._last = max(self._last + 1, candidate)
        return self._last


def snowflake_time(snowflake: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(((snowflake >> 22) + DISCORD_EPOCH_MS) / 1000, tz=dt.timezone.utc)


def iso(when: dt.datetime) -> str:
    return when.isoformat()


def bot_name_for_token(token: str) -> str:
    """The documented token -> bot name rule (before de-duplication).

    Strip an optional `local-` prefix; if what remains is 2-32 characters of letters, digits,
    `_`, `.` or `-`, the lower-cased remainder is the name (`local-cairn` -> `cairn`).
    Anything else (a real-looking Discord token, say) becomes `bot-` plus 8 hex digits of the
    token's SHA-256, so the same token always yields the same name.
    """
    rest = token[len("local-"):] if token.startswith("local-") else token
    if NAME_OK.match(rest):
        return rest.lower()
    return "bot-" + hashlib.sha256(token.encode()).hexdigest()[:8]


@dataclass
class User:
    """A guild member: a bot (owns a token and an application) or a person (posts via /_room)."""

    id: int
    name: str
    bot: bool
    joined_at: dt.datetime
    token: str | None = None
    moderator: bool = False
    intents: int | None = None  # last IDENTIFY intents, used to apply MESSAGE_CONTENT to REST too

    @property
    def application_id(self) -> int:
        # Modern Discord applications share their id with their bot user.
        return self.id

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "username": self.name,
            "global_name": None if self.bot else self.name,
            "discriminator": "0",
            "avatar": None,
            "bot": self.bot,
            "public_flags": 0,
            "banner": None,
            "accent_color": None,
            "avatar_decoration_data": None,
        }


@dataclass
class Channel:
    id: int
    name: str
    position: int
    messages: list[Message] = field(default_factory=list)
    by_id: dict[int, Message] = field(default_factory=dict)

    @property
    def last_message_id(self) -> int | None:
        for msg in reversed(self.messages):
            if not msg.deleted:
                return msg.id
        return None


@dataclass
class Attachment:
    id: int
    filename: str
    data: bytes
    content_type: str | None
    url: str

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "filename": self.filename,
            "size": len(self.data),
            "url": self.url,
            "proxy_url": self.url,
            "content_type": self.content_type,
        }


@dataclass
class Message:
    id: int
    channel_id: int
    author: User
    content: str
    type: int = MSG_DEFAULT
    embeds: list[dict[str, Any]] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[Attachment] = field(default_factory=list)
    flags: int = 0
    tts: bool = False
    nonce: str | None = None
    allowed_mentions: dict[str, Any] | None = None
    mention_user_ids: list[int] = field(default_factory=list)
    mention_role_ids: list[int] = field(default_factory=list)
    mention_everyone: bool = False
    reference_id: int | None = None
    edited_at: dt.datetime | None = None
    webhook_id: int | None = None
    application_id: int | None = None
    interaction: Interaction | None = None
    deleted: bool = False

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & FLAG_EPHEMERAL)


@dataclass
class Command:
    id: int
    application_id: int
    guild_id: int | None
    data: dict[str, Any]
    version: int

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    @property
    def type(self) -> int:
        return int(self.data.get("type", 1))

    def payload(self) -> dict[str, Any]:
        body = {
            "type": 1,
            "description": "",
            "options": [],
            "default_member_permissions": None,
            "dm_permission": True,
            "nsfw": False,
            "contexts": None,
            "integration_types": [0],
            **self.data,
        }
        body.update(id=str(self.id), application_id=str(self.application_id), version=str(self.version))
        if self.guild_id is not None:
            body["guild_id"] = str(self.guild_id)
        return body


@dataclass
class Interaction:
    """One slash-command invocation and everything the bot answered."""

    id: int
    token: str
    bot: User
    channel_id: int
    user: User
    command: Command
    options: list[dict[str, Any]]
    created: float  # time.monotonic()
    callback_type: int | None = None
    original: Message | None = None
    deferred_pending: bool = False  # a type-5 "thinking" message waiting for its first follow-up
    followups: list[Message] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RoomEvent:
    kind: str  # message_create | message_update | message_delete | typing | member_add | member_update
    #            | interaction_create | interaction_response
    message: Message | None = None
    user: User | None = None
    channel_id: int | None = None
    interaction: Interaction | None = None
    response: dict[str, Any] | None = None


Listener = Callable[[RoomEvent], None]


class RoomState:
    """The guild, its members and messages, and the Discord semantics that act on them."""

    def __init__(self, channels: Sequence[str] = ("general",), guild_name: str = "residents",
                 *, interaction_deadline: float = 3.0) -> None:
        if not channels:
            raise ValueError("a room needs at least one channel")
        self.ids = Snowflakes()
        self.guild_name = guild_name
        self.guild_id = self.ids.next()
        self.created = dt.datetime.now(dt.timezone.utc)
        self.owner_id = self.ids.next()  # a user nobody controls: owners bypass every permission
        self.bot_role_id = self.ids.next()
        self.moderator_role_id = self.ids.next()
        self.interaction_deadline = interaction_deadline
        self.base_url = "http://127.0.0.1"
        self.channels: dict[int, Channel] = {}
        for position, name in enumerate(channels):
            cid = self.ids.next()
            self.channels[cid] = Channel(id=cid, name=name, position=position)
        self.users: dict[int, User] = {}
        self.bots_by_token: dict[str, User] = {}
        self.people_by_name: dict[str, User] = {}
        self.commands: dict[int, Command] = {}
        self.interactions: dict[int, Interaction] = {}
        self.attachments: dict[int, Attachment] = {}
        self._nonces: dict[tuple[int, str], tuple[float, Message]] = {}
        self._listeners: list[Listener] = []

    # ----- events -----------------------------------------------------------------------

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: RoomEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # one broken listener must not stop the others
                log.exception("room listener failed on %s", event.kind)

    # ----- users ------------------------------------------------------------------------

    def bot_for_token(self, token: str) -> User:
        """The bot user for a token, created on first sight (any non-empty token is accepted)."""
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
        bot = User(id=self.ids.next(), name=name, bot=True, joined_at=dt.datetime.now(dt.timezone.utc), token=token)
        self.bots_by_token[token] = bot
        self.users[bot.id] = bot
        log.info("bot %s (%s) joined the room", name, bot.id)
        self.emit(RoomEvent("member_add", user=bot))
        return bot

    def person(self, name: str, *, moderator: bool | None = None) -> User:
        """The person called `name`, created on first use; `moderator` updates their role."""
        name = name.strip()
        if not name or len(name) > 32:
            raise ApiError(400, 50035, "author must be 1-32 characters")
        if name.lower() in ("everyone", "here"):
            raise ApiError(400, 50035, f"{name!r} is reserved by Discord's @{name.lower()} mention")
        user = self.people_by_name.get(name)
        if user is None:
            clash = self.user_by_name(name)
            if clash is not None:
                raise ApiError(400, 50035, f"{name!r} is a bot's name")
            user = User(id=self.ids.next(), name=name, bot=False, joined_at=dt.datetime.now(dt.timezone.utc),
                        moderator=bool(moderator))
            self.people_by_name[name] = user
            self.users[user.id] = user
            self.emit(RoomEvent("member_add", user=user))
        elif moderator is not None and moderator != user.moderator:
            user.moderator = moderator
            self.emit(RoomEvent("member_update", user=user))
        return user

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

    def members(self) -> list[User]:
        return list(self.users.values())

    def role_ids(self, user: User) -> list[int]:
        roles = []
        if user.bot:
            roles.append(self.bot_role_id)
        if user.moderator:
            roles.append(self.moderator_role_id)
        return roles

    def permissions(self, user: User) -> int:
        perms = EVERYONE_PERMS
        if user.bot:
            perms |= BOT_PERMS
        if user.moderator:
            perms |= MODERATOR_PERMS
        return perms

    # ----- payloads ---------------------------------------------------------------------

    def member_payload(self, user: User, *, with_user: bool = True, permissions: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "roles": [str(r) for r in self.role_ids(user)],
            "joined_at": iso(user.joined_at),
            "nick": None,
            "avatar": None,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "pending": False,
            "flags": 0,
            "communication_disabled_until": None,
        }
        if with_user:
            data["user"] = user.payload()
        if permissions:
            data["permissions"] = str(self.permissions(user))
        return data

    def roles_payload(self) -> list[dict[str, Any]]:
        def role(rid: int, name: str, perms: int, position: int, mentionable: bool) -> dict[str, Any]:
            return {
                "id": str(rid), "name": name, "permissions": str(perms), "position": position,
                "color": 0, "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
                "hoist": False, "managed": False, "mentionable": mentionable, "icon": None,
                "unicode_emoji": None, "flags": 0,
            }

        return [
            role(self.guild_id, "@everyone", EVERYONE_PERMS, 0, False),
            role(self.bot_role_id, "bots", EVERYONE_PERMS | BOT_PERMS, 1, False),
            role(self.moderator_role_id, "moderator", EVERYONE_PERMS | MODERATOR_PERMS, 2, True),
        ]

    def role_name(self, role_id: int) -> str | None:
        for role in self.roles_payload():
            if int(role["id"]) == role_id:
                return str(role["name"])
        return None

    def channel_payload(self, channel: Channel) -> dict[str, Any]:
        last = channel.last_message_id
        return {
            "id": str(channel.id), "type": 0, "guild_id": str(self.guild_id), "name": channel.name,
            "position": channel.position, "permission_overwrites": [], "topic": None, "nsfw": False,
            "last_message_id": str(last) if last else None, "rate_limit_per_user": 0, "parent_id": None,
            "flags": 0,
        }

    def guild_payload(self) -> dict[str, Any]:
        """GUILD_CREATE's body; member_count equals the members sent so discord.py won't chunk."""
        members = self.members()
        first = next(iter(self.channels.values()))
        return {
            "id": str(self.guild_id), "name": self.guild_name, "icon": None, "splash": None,
            "discovery_splash": None, "banner": None, "description": None, "owner_id": str(self.owner_id),
            "afk_channel_id": None, "afk_timeout": 300, "verification_level": 0,
            "default_message_notifications": 1, "explicit_content_filter": 0, "mfa_level": 0,
            "nsfw_level": 0, "premium_tier": 0, "premium_subscription_count": 0, "preferred_locale": "en-US",
            "system_channel_id": str(first.id), "system_channel_flags": 0, "rules_channel_id": None,
            "public_updates_channel_id": None, "safety_alerts_channel_id": None, "vanity_url_code": None,
            "features": [], "roles": self.roles_payload(), "emojis": [], "stickers": [],
            "joined_at": iso(self.created), "large": False, "unavailable": False,
            "member_count": len(members), "members": [self.member_payload(u) for u in members],
            "channels": [self.channel_payload(c) for c in self.channels.values()], "threads": [],
            "presences": [], "voice_states": [], "stage_instances": [], "guild_scheduled_events": [],
            "soundboard_sounds": [], "application_id": None, "max_members": 500000,
            "premium_progress_bar_enabled": False, "widget_enabled": False,
        }

    def message_payload(self, msg: Message, *, nested: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": str(msg.id), "type": msg.type, "channel_id": str(msg.channel_id),
            "guild_id": str(self.guild_id), "author": msg.author.payload(), "content": msg.content,
            "timestamp": iso(snowflake_time(msg.id)),
            "edited_timestamp": iso(msg.edited_at) if msg.edited_at else None,
            "tts": msg.tts, "mention_everyone": msg.mention_everyone,
            "mentions": [self._mention_payload(uid) for uid in msg.mention_user_ids if uid in self.users],
            "mention_roles": [str(r) for r in msg.mention_role_ids], "attachments": [a.payload() for a in msg.attachments],
            "embeds": msg.embeds, "components": msg.components, "pinned": False, "flags": msg.flags,
        }
        if msg.webhook_id is None:
            data["member"] = self.member_payload(msg.author, with_user=False)
        else:
            data["webhook_id"] = str(msg.webhook_id)
        if msg.application_id is not None:
            data["application_id"] = str(msg.application_id)
        if msg.nonce is not None:
            data["nonce"] = msg.nonce
        if msg.interaction is not None:
            inter = msg.interaction
            data["interaction_metadata"] = {
                "id": str(inter.id), "type": 2, "name": inter.command.name, "user": inter.user.payload(),
                "authorizing_integration_owners": {"0": str(self.guild_id)},
            }
            data["interaction"] = {"id": str(inter.id), "type": 2, "name": inter.command.name,
                                   "user": inter.user.payload()}
        if msg.reference_id is not None:
            data["message_reference"] = {"type": 0, "message_id": str(msg.reference_id),
                                         "channel_id": str(msg.channel_id), "guild_id": str(self.guild_id)}
            if not nested:
                ref = self.channels[msg.channel_id].by_id.get(msg.reference_id)
                data["referenced_message"] = (
                    self.message_payload(ref, nested=True) if ref is not None and not ref.deleted else None
                )
        return data

    def _mention_payload(self, user_id: int) -> dict[str, Any]:
        user = self.users[user_id]
        data = user.payload()
        data["member"] = self.member_payload(user, with_user=False)
        return data

    def visible_payload(self, msg: Message, viewer: User) -> dict[str, Any]:
        """The message as `viewer` sees it: without MESSAGE_CONTENT, content/embeds are blanked."""
        data = self.message_payload(msg)
        if not self.can_read_content(viewer, msg):
            data.update(content="", embeds=[], attachments=[], components=[])
        ref = data.get("referenced_message")
        target = self.channels[msg.channel_id].by_id.get(msg.reference_id or 0)
        if ref and target is not None and not self.can_read_content(viewer, target):
            ref.update(content="", embeds=[], attachments=[], components=[])
        return data

    def can_read_content(self, viewer: User, msg: Message) -> bool:
        if viewer.intents is None or viewer.intents & (1 << 15):
            return True
        return msg.author.id == viewer.id or viewer.id in msg.mention_user_ids

    def room_view(self, msg: Message) -> dict[str, Any]:
        """The /_room/ rendering: names instead of payloads, and who actually gets pinged."""
        channel = self.channels[msg.channel_id]
        return {
            "id": str(msg.id), "channel_id": str(msg.channel_id), "channel": channel.name,
            "author": msg.author.name, "author_id": str(msg.author.id), "bot": msg.author.bot,
            "content": msg.content, "timestamp": iso(snowflake_time(msg.id)),
            "edited_timestamp": iso(msg.edited_at) if msg.edited_at else None, "type": msg.type,
            "reply_to": str(msg.reference_id) if msg.reference_id else None,
            "allowed_mentions": msg.allowed_mentions,
            "pings": {
                "users": [self.users[u].name for u in msg.mention_user_ids if u in self.users],
                "user_ids": [str(u) for u in msg.mention_user_ids],
                "roles": [self.role_name(r) for r in msg.mention_role_ids],
                "everyone": msg.mention_everyone,
            },
            "embeds": msg.embeds,
            "attachments": [{"filename": a.filename, "size": len(a.data), "url": a.url} for a in msg.attachments],
            "flags": msg.flags, "ephemeral": msg.ephemeral, "loading": bool(msg.flags & FLAG_LOADING),
            "interaction": ({"name": msg.interaction.command.name, "user": msg.interaction.user.name,
                             "id": str(msg.interaction.id)} if msg.interaction else None),
            "nonce": msg.nonce, "deleted": msg.deleted,
        }

    # ----- channels and messages -------------------------------------------------------

    def channel(self, channel_id: int | str) -> Channel:
        try:
            return self.channels[int(channel_id)]
        except (KeyError, ValueError):
            raise unknown("Channel", 10003) from None

    def channel_by_ref(self, ref: str) -> Channel:
        """A channel by id or by name (the /_room/ API accepts either)."""
        if str(ref).isdigit() and int(ref) in self.channels:
            return self.channels[int(ref)]
        for channel in self.channels.values():
            if channel.name == str(ref).lstrip("#"):
                return channel
        raise unknown("Channel", 10003)

    def message(self, channel: Channel, message_id: int | str) -> Message:
        try:
            msg = channel.by_id[int(message_id)]
        except (KeyError, ValueError):
            raise unknown("Message", 10008) from None
        if msg.deleted:
            raise unknown("Message", 10008)
        return msg

    def history(self, channel: Channel, *, limit: int = 50, before: int | None = None,
                after: int | None = None, around: int | None = None) -> list[Message]:
        """GET /channels/{id}/messages semantics: newest first, `after` takes the oldest after it."""
        if not 1 <= limit <= 100:
            raise form_error(["limit"], "NUMBER_TYPE_MAX", "int value should be between 1 and 100.")
        live = [m for m in channel.messages if not m.deleted]
        if around is not None:
            older = [m for m in live if m.id < around][-(limit // 2):] if limit // 2 else []
            newer = [m for m in live if m.id >= around][: limit - len(older)]
            picked = older + newer
        elif after is not None:
            picked = [m for m in live if m.id > after][:limit]
        else:
            if before is not None:
                live = [m for m in live if m.id < before]
            picked = live[-limit:]
        return list(reversed(picked))

    def create_message(self, channel: Channel, author: User, body: dict[str, Any], *,
                       attachments: Sequence[tuple[str, bytes, str | None]] = (),
                       mtype: int | None = None, webhook_id: int | None = None,
                       interaction: Interaction | None = None, allow_ephemeral: bool = False,
                       allow_empty: bool = False, store: bool = True) -> Message:
        """Validate like Discord and create a message; returns the existing one on a nonce hit."""
        content = body.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise form_error(["content"], "BASE_TYPE_STRING", "Must be a string.")
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
        embeds = self._check_embeds(body.get("embeds"))
        self._check_content(content)
        components = body.get("components") or []
        if not isinstance(components, list):
            raise form_error(["components"], "BASE_TYPE_ARRAY", "Must be an array.")
        files = [self._store_attachment(channel, name, data, ctype) for name, data, ctype in attachments]
        shown = [e for e in embeds if {k for k, v in e.items() if v} - {"type", "flags", "color", "timestamp", "url"}]
        if not allow_empty and not content.strip() and not shown and not files and not components \
                and not body.get("sticker_ids") and not body.get("poll"):
            raise ApiError(400, 50006, "Cannot send an empty message")
        flags = int(body.get("flags") or 0)
        keep = SETTABLE_FLAGS | (FLAG_EPHEMERAL if allow_ephemeral else 0)
        reference_id = self._check_reference(channel, body.get("message_reference"))
        msg = Message(
            id=self.ids.next(), channel_id=channel.id, author=author, content=content,
            type=mtype if mtype is not None else (MSG_REPLY if reference_id else MSG_DEFAULT),
            embeds=embeds, components=components, attachments=files, flags=flags & keep,
            tts=bool(body.get("tts", False)), nonce=nonce, allowed_mentions=body.get("allowed_mentions"),
            reference_id=reference_id, webhook_id=webhook_id,
            application_id=author.application_id if (webhook_id or interaction) else None,
            interaction=interaction,
        )
        self._apply_mentions(msg)
        if nonce is not None and body.get("enforce_nonce"):
            self._nonces[(author.id, nonce)] = (time.monotonic(), msg)
        if store and not msg.ephemeral:
            channel.messages.append(msg)
            channel.by_id[msg.id] = msg
            self.emit(RoomEvent("message_create", message=msg))
        return msg

    def edit_message(self, msg: Message, body: dict[str, Any], *, editor: User | None = None) -> Message:
        if editor is not None and msg.author.id != editor.id:
            raise ApiError(403, 50005, "Cannot edit a message authored by another user")
        if "content" in body:
            content = body["content"] if body["content"] is not None else ""
            if not isinstance(content, str):
                raise form_error(["content"], "BASE_TYPE_STRING", "Must be a string.")
            self._check_content(content)
            msg.content = content
        if "embeds" in body:
            msg.embeds = self._check_embeds(body["embeds"])
        if "components" in body:
            msg.components = body["components"] or []
        if "flags" in body and body["flags"] is not None:
            msg.flags = (msg.flags & ~SETTABLE_FLAGS) | (int(body["flags"]) & SETTABLE_FLAGS)
        if "attachments" in body and body["attachments"] is not None:
            keep = {str(a.get("id")) for a in body["attachments"]}
            msg.attachments = [a for a in msg.attachments if str(a.id) in keep]
        if "allowed_mentions" in body:
            msg.allowed_mentions = body["allowed_mentions"]
        if not msg.content.strip() and not msg.embeds and not msg.attachments and not msg.components \
                and not (msg.flags & FLAG_LOADING):
            raise ApiError(400, 50006, "Cannot send an empty message")
        msg.edited_at = dt.datetime.now(dt.timezone.utc)
        self._apply_mentions(msg)
        if not msg.ephemeral and msg.channel_id in self.channels and msg.id in self.channels[msg.channel_id].by_id:
            self.emit(RoomEvent("message_update", message=msg))
        return msg

    def delete_message(self, msg: Message, *, deleter: User | None = None) -> None:
        if deleter is not None and msg.author.id != deleter.id and not self.permissions(deleter) & MANAGE_MESSAGES:
            raise ApiError(403, 50013, "Missing Permissions")
        msg.deleted = True
        if not msg.ephemeral:
            self.emit(RoomEvent("message_delete", message=msg))

    def _check_content(self, content: str) -> None:
        if len(content) > MAX_CONTENT:
            raise form_error(["content"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT} or fewer in length.")

    def _check_embeds(self, embeds: Any) -> list[dict[str, Any]]:
        """Discord's embed limits, so a resident that overflows an embed fails here as it would there."""
        if embeds is None:
            return []
        if not isinstance(embeds, list):
            raise form_error(["embeds"], "BASE_TYPE_ARRAY", "Must be an array.")
        if len(embeds) > 10:
            raise form_error(["embeds"], "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
        total = 0
        for i, embed in enumerate(embeds):
            if not isinstance(embed, dict):
                raise form_error(["embeds", i], "MODEL_TYPE_CONVERT", "Only dictionaries may be used in a ModelType")
            for key, limit in (("title", 256), ("description", 4096)):
                value = embed.get(key)
                if value is not None:
                    if len(str(value)) > limit:
                        raise form_error(["embeds", i, key], "BASE_TYPE_MAX_LENGTH",
                                         f"Must be {limit} or fewer in length.")
                    total += len(str(value))
            for key, sub, limit in (("footer", "text", 2048), ("author", "name", 256)):
                part = embed.get(key)
                if isinstance(part, dict) and part.get(sub) is not None:
                    if len(str(part[sub])) > limit:
                        raise form_error(["embeds", i, key, sub], "BASE_TYPE_MAX_LENGTH",
                                         f"Must be {limit} or fewer in length.")
                    total += len(str(part[sub]))
            fields = embed.get("fields") or []
            if len(fields) > 25:
                raise form_error(["embeds", i, "fields"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            for j, fld in enumerate(fields):
                for key, limit in (("name", 256), ("value", 1024)):
                    value = fld.get(key)
                    if value is None or str(value) == "":
                        raise form_error(["embeds", i, "fields", j, key], "BASE_TYPE_REQUIRED",
                                         "This field is required")
                    if len(str(value)) > limit:
                        raise form_error(["embeds", i, "fields", j, key], "BASE_TYPE_MAX_LENGTH",
                                         f"Must be {limit} or fewer in length.")
                    total += len(str(value))
        if total > 6000:
            raise form_error(["embeds"], "MAX_EMBED_SIZE_EXCEEDED", "Embed size exceeds maximum size of 6000")
        return [dict(e) for e in embeds]

    def _check_reference(self, channel: Channel, ref: Any) -> int | None:
        if not ref:
            return None
        if not isinstance(ref, dict) or ref.get("message_id") is None:
            raise form_error(["message_reference"], "BASE_TYPE_REQUIRED", "This field is required")
        if int(ref.get("type", 0) or 0) != 0:
            raise form_error(["message_reference", "type"], "BASE_TYPE_CHOICES", "Only replies are supported here")
        if ref.get("channel_id") is not None and int(ref["channel_id"]) != channel.id:
            raise form_error(["message_reference"], "REPLIES_CANNOT_REFERENCE_OTHER_CHANNEL",
                             "Cannot reply to a message in a different channel")
        target = channel.by_id.get(int(ref["message_id"]))
        if target is None or target.deleted:
            if ref.get("fail_if_not_exists", True):
                raise form_error(["message_reference"], "REPLIES_UNKNOWN_MESSAGE", "Unknown message")
            return None
        return target.id

    def _apply_mentions(self, msg: Message) -> None:
        """Who the message actually pings, per allowed_mentions (absent = parse everything)."""
        content_users: list[int] = []
        for match in USER_MENTION.finditer(msg.content):
            uid = int(match.group(1))
            if uid in self.users and uid not in content_users:
                content_users.append(uid)
        role_ids = {self.guild_id, self.bot_role_id, self.moderator_role_id}
        content_roles: list[int] = []
        for match in ROLE_MENTION.finditer(msg.content):
            rid = int(match.group(1))
            if rid in role_ids and rid not in content_roles:
                content_roles.append(rid)
        everyone_in_content = bool(EVERYONE_MENTION.search(msg.content))
        allowed = msg.allowed_mentions
        if allowed is None:
            parse = {"users", "roles", "everyone"}
            users_list: set[int] = set()
            roles_list: set[int] = set()
            replied = True
        else:
            if not isinstance(allowed, dict):
                raise form_error(["allowed_mentions"], "MODEL_TYPE_CONVERT", "Only dictionaries may be used")
            parse = set(allowed.get("parse") or [])
            bad = parse - {"users", "roles", "everyone"}
            if bad:
                raise form_error(["allowed_mentions", "parse"], "BASE_TYPE_CHOICES",
                                 f"Value must be one of ('roles', 'users', 'everyone'), not {sorted(bad)}")
            users_list = {int(u) for u in allowed.get("users") or []}
            roles_list = {int(r) for r in allowed.get("roles") or []}
            if "users" in parse and users_list:
                raise form_error(["allowed_mentions"], "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                                 "parse:[\"users\"] and users: [ids...] are mutually exclusive.")
            if "roles" in parse and roles_list:
                raise form_error(["allowed_mentions"], "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                                 "parse:[\"roles\"] and roles: [ids...] are mutually exclusive.")
            replied = bool(allowed.get("replied_user", False))
        users = [u for u in content_users if "users" in parse or u in users_list]
        roles = [r for r in content_roles if "roles" in parse or r in roles_list]
        if msg.reference_id is not None and replied:
            ref = self.channels[msg.channel_id].by_id.get(msg.reference_id)
            if ref is not None and ref.author.id not in users:
                users.append(ref.author.id)
        may_everyone = bool(self.permissions(msg.author) & MENTION_EVERYONE)
        msg.mention_user_ids = users
        msg.mention_role_ids = roles
        msg.mention_everyone = everyone_in_content and "everyone" in parse and may_everyone

    def _store_attachment(self, channel: Channel, filename: str, data: bytes, ctype: str | None) -> Attachment:
        if len(data) > ATTACHMENT_LIMIT:
            raise ApiError(413, 40005, "Request entity too large")
        aid = self.ids.next()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", filename) or "file"
        url = f"{self.base_url}/attachments/{channel.id}/{aid}/{safe}"
        att = Attachment(id=aid, filename=filename, data=data, content_type=ctype, url=url)
        self.attachments[aid] = att
        return att

    def typing(self, channel: Channel, user: User) -> None:
        self.emit(RoomEvent("typing", user=user, channel_id=channel.id))

    # ----- person posts via /_room/ ---------------------------------------------------------

    def post_as_person(self, channel: Channel, author: str, content: str, *, reply_to: int | str | None = None,
                       mentions: Iterable[str] = (), moderator: bool | None = None,
                       allowed_mentions: dict[str, Any] | None = None) -> Message:
        """What Discord's own client does for a person typing: `@name` becomes `<@id>`."""
        person = self.person(author, moderator=moderator)
        text = self._link_names(content)
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
        return self.create_message(channel, person, body)

    def _link_names(self, content: str) -> str:
        def repl(match: re.Match[str]) -> str:
            user = self.user_by_name(match.group(1))
            return f"<@{user.id}>" if user is not None else match.group(0)

        return re.sub(r"(?<![<\w])@([A-Za-z0-9_.-]{2,32})\b", repl, content)

    # ----- application commands ---------------------------------------------------------

    def overwrite_commands(self, bot: User, guild_id: int | None, commands: Any) -> list[Command]:
        """Bulk overwrite, keeping ids for names that survive, as Discord does."""
        if not isinstance(commands, list):
            raise form_error([], "BASE_TYPE_ARRAY", "Must be an array.")
        if len(commands) > 100:
            raise form_error([], "BASE_TYPE_MAX_LENGTH", "Must be 100 or fewer in length.")
        existing = {(c.name, c.type): c for c in self.commands.values()
                    if c.application_id == bot.application_id and c.guild_id == guild_id}
        kept: list[Command] = []
        for i, data in enumerate(commands):
            self._check_command(data, [i])
            key = (str(data["name"]), int(data.get("type", 1)))
            old = existing.pop(key, None)
            if old is not None:
                if old.data != data:
                    old.data, old.version = dict(data), self.ids.next()
                kept.append(old)
            else:
                cmd = Command(id=self.ids.next(), application_id=bot.application_id, guild_id=guild_id,
                              data=dict(data), version=self.ids.next())
                self.commands[cmd.id] = cmd
                kept.append(cmd)
        for gone in existing.values():
            del self.commands[gone.id]
        return kept

    def upsert_command(self, bot: User, guild_id: int | None, data: Any) -> Command:
        self._check_command(data, [])
        for cmd in self.commands.values():
            if cmd.application_id == bot.application_id and cmd.guild_id == guild_id \
                    and (cmd.name, cmd.type) == (data["name"], int(data.get("type", 1))):
                cmd.data, cmd.version = dict(data), self.ids.next()
                return cmd
        cmd = Command(id=self.ids.next(), application_id=bot.application_id, guild_id=guild_id,
                      data=dict(data), version=self.ids.next())
        self.commands[cmd.id] = cmd
        return cmd

    def list_commands(self, bot: User, guild_id: int | None) -> list[Command]:
        return [c for c in self.commands.values() if c.application_id == bot.application_id and c.guild_id == guild_id]

    def _check_command(self, data: Any, path: list[str | int]) -> None:
        if not isinstance(data, dict):
            raise form_error(path, "MODEL_TYPE_CONVERT", "Only dictionaries may be used in a ModelType")
        name = data.get("name")
        ctype = int(data.get("type", 1))
        if not isinstance(name, str) or not 1 <= len(name) <= 32:
            raise form_error([*path, "name"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 32 in length.")
        if ctype == 1:
            if not COMMAND_NAME_OK.match(name) or name != name.lower():
                raise form_error([*path, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
            desc = data.get("description")
            if not isinstance(desc, str) or not 1 <= len(desc) <= 100:
                raise form_error([*path, "description"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")
        self._check_options(data.get("options") or [], [*path, "options"])

    def _check_options(self, options: Any, path: list[str | int]) -> None:
        if len(options) > 25:
            raise form_error(path, "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        for i, opt in enumerate(options):
            name, desc = opt.get("name"), opt.get("description")
            if not isinstance(name, str) or not COMMAND_NAME_OK.match(name) or name != name.lower():
                raise form_error([*path, i, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
            if not isinstance(desc, str) or not 1 <= len(desc) <= 100:
                raise form_error([*path, i, "description"], "BASE_TYPE_BAD_LENGTH",
                                 "Must be between 1 and 100 in length.")
            if len(opt.get("choices") or []) > 25:
                raise form_error([*path, i, "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
            self._check_options(opt.get("options") or [], [*path, i, "options"])

    def find_command(self, name: str, bot_name: str | None) -> Command:
        """Guild command first, then global; `bot_name` may be omitted when only one app has `name`."""
        candidates = [c for c in self.commands.values() if c.name == name and c.type == 1
                      and c.guild_id in (None, self.guild_id)]
        if bot_name is not None:
            bot = self.bot_by_name(bot_name)
            if bot is None:
                raise ApiError(404, 10013, f"no bot called {bot_name!r}")
            candidates = [c for c in candidates if c.application_id == bot.application_id]
        apps = {c.application_id for c in candidates}
        if not candidates:
            raise ApiError(404, 10063, f"no application has a command called {name!r} (did the bot sync?)")
        if len(apps) > 1:
            raise ApiError(400, 50035, f"several bots have /{name}: say which with \"bot\"")
        candidates.sort(key=lambda c: c.guild_id is None)  # guild commands win
        return candidates[0]

    # ----- interactions -----------------------------------------------------------------

    def create_interaction(self, channel: Channel, member: str, command: Command,
                           options: list[dict[str, Any]] | None, *, moderator: bool | None) -> Interaction:
        user = self.person(member, moderator=moderator)
        bot = self.users[command.application_id]
        opts = self._typed_options(list(options or []), command.data.get("options") or [])
        inter = Interaction(id=self.ids.next(), token=secrets.token_urlsafe(32).replace("-", "x").replace("_", "y"),
                            bot=bot, channel_id=channel.id, user=user, command=command, options=opts,
                            created=time.monotonic())
        self.interactions[inter.id] = inter
        self.emit(RoomEvent("interaction_create", interaction=inter, channel_id=channel.id))
        return inter

    def _typed_options(self, given: list[dict[str, Any]], schema: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Fill in option `type`s from the synced schema and resolve names for user/channel/role values."""
        out = []
        by_name = {s.get("name"): s for s in schema}
        for opt in given:
            opt = dict(opt)
            spec = by_name.get(opt.get("name"), {})
            otype = int(opt.get("type", spec.get("type", 3)))
            opt["type"] = otype
            if otype in (1, 2):
                opt["options"] = self._typed_options(list(opt.get("options") or []), spec.get("options") or [])
            elif "value" in opt:
                opt["value"] = self._resolve_value(otype, opt["value"])
            out.append(opt)
        return out

    def _resolve_value(self, otype: int, value: Any) -> Any:
        if otype in (6, 9) and isinstance(value, str) and not value.isdigit():
            user = self.user_by_name(value.lstrip("@"))
            if user is None:
                raise ApiError(400, 50035, f"unknown user {value!r}")
            return str(user.id)
        if otype == 7 and isinstance(value, str) and not value.isdigit():
            return str(self.channel_by_ref(value).id)
        if otype == 8 and isinstance(value, str) and not value.isdigit():
            for role in self.roles_payload():
                if role["name"] == value:
                    return role["id"]
            raise ApiError(400, 50035, f"unknown role {value!r}")
        return value

    def interaction_payload(self, inter: Interaction) -> dict[str, Any]:
        channel = self.channels[inter.channel_id]
        data: dict[str, Any] = {
            "id": str(inter.command.id), "name": inter.command.name, "type": 1,
            "options": inter.options, "resolved": self._resolved(inter.options),
        }
        if inter.command.guild_id is not None:
            data["guild_id"] = str(inter.command.guild_id)
        channel_data = self.channel_payload(channel)
        channel_data["permissions"] = str(self.permissions(inter.user))
        return {
            "id": str(inter.id), "application_id": str(inter.bot.application_id), "type": 2, "data": data,
            "guild_id": str(self.guild_id), "guild": {"id": str(self.guild_id), "locale": "en-US", "features": []},
            "channel_id": str(channel.id), "channel": channel_data,
            "member": self.member_payload(inter.user, permissions=True), "token": inter.token, "version": 1,
            "app_permissions": str(self.permissions(inter.bot)), "locale": "en-US", "guild_locale": "en-US",
            "entitlements": [], "authorizing_integration_owners": {"0": str(self.guild_id)}, "context": 0,
            "attachment_size_limit": ATTACHMENT_LIMIT,
        }

    def _resolved(self, options: list[dict[str, Any]]) -> dict[str, Any]:
        resolved: dict[str, dict[str, Any]] = {}

        def walk(opts: list[dict[str, Any]]) -> None:
            for opt in opts:
                if opt["type"] in (1, 2):
                    walk(opt.get("options") or [])
                elif opt["type"] in (6, 9) and str(opt.get("value", "")).isdigit() and int(opt["value"]) in self.users:
                    user = self.users[int(opt["value"])]
                    resolved.setdefault("users", {})[str(user.id)] = user.payload()
                    resolved.setdefault("members", {})[str(user.id)] = self.member_payload(
                        user, with_user=False, permissions=True)
                elif opt["type"] == 7 and str(opt.get("value", "")).isdigit() and int(opt["value"]) in self.channels:
                    ch = self.channels[int(opt["value"])]
                    resolved.setdefault("channels", {})[str(ch.id)] = {
                        "id": str(ch.id), "name": ch.name, "type": 0, "permissions": str(EVERYONE_PERMS)}
                elif opt["type"] in (8, 9):
                    for role in self.roles_payload():
                        if role["id"] == str(opt.get("value")):
                            resolved.setdefault("roles", {})[role["id"]] = role

        walk(options)
        return resolved

    def interaction_for_callback(self, interaction_id: str, token: str) -> Interaction:
        try:
            inter = self.interactions[int(interaction_id)]
        except (KeyError, ValueError):
            raise unknown("interaction", 10062) from None
        if not secrets.compare_digest(inter.token, token):
            raise unknown("interaction", 10062)
        if inter.callback_type is not None:
            raise ApiError(400, 40060, "Interaction has already been acknowledged.")
        if time.monotonic() - inter.created > self.interaction_deadline:
            raise unknown("interaction", 10062)
        return inter

    def interaction_for_webhook(self, app_id: str, token: str) -> Interaction:
        for inter in self.interactions.values():
            if secrets.compare_digest(inter.token, token) and str(inter.bot.application_id) == str(app_id):
                if inter.callback_type is None or time.monotonic() - inter.created > FOLLOWUP_WINDOW_S:
                    break
                return inter
        raise unknown("Webhook", 10015)

    def record_response(self, inter: Interaction, kind: str, *, ctype: int | None = None,
                        message: Message | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "kind": kind, "type": ctype,
            "content": message.content if message is not None else None,
            "ephemeral": bool(message.flags & FLAG_EPHEMERAL) if message is not None else False,
            "embeds": list(message.embeds) if message is not None else [],
            "components": list(message.components) if message is not None else [],
            "message_id": str(message.id) if message is not None else None,
            "flags": message.flags if message is not None else 0,
            "allowed_mentions": message.allowed_mentions if message is not None else None,
        }
        if extra:
            entry.update(extra)
        inter.responses.append(entry)
        self.emit(RoomEvent("interaction_response", interaction=inter, response=entry, message=message))
        return entry

    def interaction_callback(self, inter: Interaction, body: dict[str, Any],
                             attachments: Sequence[tuple[str, bytes, str | None]] = ()) -> dict[str, Any]:
        """Apply an interaction callback; returns the `?with_response=1` body."""
        ctype = int(body.get("type", 0))
        data = body.get("data") or {}
        channel = self.channels[inter.channel_id]
        message: Message | None = None
        if ctype == 4:
            message = self.create_message(channel, inter.bot, data, attachments=attachments,
                                          mtype=MSG_CHAT_INPUT_COMMAND,
                                          webhook_id=inter.bot.application_id, interaction=inter,
                                          allow_ephemeral=True)
        elif ctype == 5:
            flags = FLAG_LOADING | (int(data.get("flags") or 0) & FLAG_EPHEMERAL)
            message = self.create_message(channel, inter.bot, {"content": "", "flags": 0},
                                          mtype=MSG_CHAT_INPUT_COMMAND, webhook_id=inter.bot.application_id,
                                          interaction=inter, allow_empty=True, store=False)
            message.flags = flags
            if not message.ephemeral:
                channel.messages.append(message)
                channel.by_id[message.id] = message
                self.emit(RoomEvent("message_create", message=message))
            inter.deferred_pending = True
        elif ctype == 9:
            inter.callback_type = ctype
            self.record_response(inter, "callback", ctype=ctype, extra={"modal": data})
            return {"interaction": self._callback_interaction(inter, None), "resource": {"type": ctype}}
        else:
            raise form_error(["type"], "INTERACTION_RESPONSE_TYPE_INVALID",
                             f"Interaction response type {ctype} is not valid for an application command")
        inter.callback_type = ctype
        inter.original = message
        self.record_response(inter, "callback", ctype=ctype, message=message)
        return {
            "interaction": self._callback_interaction(inter, message),
            "resource": {"type": ctype, "message": self.message_payload(message)},
        }

    def _callback_interaction(self, inter: Interaction, message: Message | None) -> dict[str, Any]:
        return {
            "id": str(inter.id), "type": 2, "activity_instance_id": None,
            "response_message_id": str(message.id) if message else None,
            "response_message_loading": bool(message and message.flags & FLAG_LOADING),
            "response_message_ephemeral": bool(message and message.ephemeral),
        }

    def followup(self, inter: Interaction, body: dict[str, Any],
                 attachments: Sequence[tuple[str, bytes, str | None]] = ()) -> Message:
        """A follow-up; the first one after a defer replaces the "thinking" message, as on Discord."""
        channel = self.channels[inter.channel_id]
        if inter.deferred_pending and inter.original is not None:
            original = inter.original
            probe = self.create_message(channel, inter.bot, body, attachments=attachments, allow_ephemeral=True,
                                        mtype=MSG_CHAT_INPUT_COMMAND, webhook_id=inter.bot.application_id,
                                        interaction=inter, store=False)  # validates like a new message
            inter.deferred_pending = False
            original.flags &= ~FLAG_LOADING
            original.content, original.embeds, original.components = probe.content, probe.embeds, probe.components
            original.attachments, original.allowed_mentions = probe.attachments, probe.allowed_mentions
            original.edited_at = None
            self._apply_mentions(original)
            if not original.ephemeral:
                self.emit(RoomEvent("message_update", message=original))
            self.record_response(inter, "followup", message=original)
            return original
        msg = self.create_message(channel, inter.bot, body, attachments=attachments, allow_ephemeral=True,
                                  mtype=MSG_CHAT_INPUT_COMMAND, webhook_id=inter.bot.application_id,
                                  interaction=inter)
        inter.followups.append(msg)
        self.record_response(inter, "followup", message=msg)
        return msg

    def interaction_message(self, inter: Interaction, message_id: str) -> Message:
        if message_id == "@original":
            if inter.original is None:
                raise unknown("Message", 10008)
            return inter.original
        for msg in [inter.original, *inter.followups]:
            if msg is not None and str(msg.id) == message_id and not msg.deleted:
                return msg
        raise unknown("Message", 10008)

    def edit_interaction_message(self, inter: Interaction, msg: Message, body: dict[str, Any]) -> Message:
        if msg is inter.original and inter.deferred_pending:
            msg.flags &= ~FLAG_LOADING
            try:
                self.edit_message(msg, body)
            except ApiError:
                msg.flags |= FLAG_LOADING
                raise
            inter.deferred_pending = False
        else:
            self.edit_message(msg, body)
        self.record_response(inter, "edit", message=msg)
        return msg
