"""The guild model of the local room: users, guilds with roles and channel overwrites, messages, commands.

Plain objects that point at each other (a message at its channel, a channel at its guild), so
rendering a payload needs no lookups. Permissions are computed with discord.py's own
`discord.Permissions`, the way Discord does: @everyone and the member's roles, administrator and
ownership, then the channel's overwrites (@everyone, roles, the member).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import discord

# What every member may do (Discord's defaults for a new server's @everyone, trimmed to text).
EVERYONE_PERMS = discord.Permissions(
    create_instant_invite=True,
    add_reactions=True,
    view_channel=True,
    send_messages=True,
    embed_links=True,
    attach_files=True,
    read_message_history=True,
    use_external_emojis=True,
    change_nickname=True,
    use_application_commands=True,
    send_messages_in_threads=True,
)
# The default room's `moderator` role, which the /_room/ `moderator` flag gives or takes.
MODERATOR_PERMS = discord.Permissions(
    manage_messages=True, mention_everyone=True, manage_threads=True, moderate_members=True
)
# Every bot gets the `bots` role; it may ping @everyone, so a resident that forgets allowed_mentions is caught.
BOT_PERMS = discord.Permissions(manage_messages=True, mention_everyone=True, embed_links=True, attach_files=True)

MODERATOR_ROLE = "moderator"
BOTS_ROLE = "bots"

# Message types and flags
MSG_DEFAULT = 0
MSG_REPLY = 19
MSG_CHAT_INPUT_COMMAND = 20
MSG_CONTEXT_MENU_COMMAND = 23  # the answer to a message or user command
FLAG_SUPPRESS_EMBEDS = 1 << 2
FLAG_EPHEMERAL = 1 << 6
FLAG_LOADING = 1 << 7
FLAG_SUPPRESS_NOTIFICATIONS = 1 << 12
SETTABLE_FLAGS = FLAG_SUPPRESS_EMBEDS | FLAG_SUPPRESS_NOTIFICATIONS


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
    """Increasing ids in Discord's snowflake layout (`discord.utils.time_snowflake`), so they sort by time."""

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        self._last = max(self._last + 1, discord.utils.time_snowflake(now()))
        return self._last

    def milliseconds_apart(self, n: int) -> list[int]:
        """`n` ids in consecutive milliseconds of their own (`id >> 22` one apart): guilds built together
        then sit on consecutive shards (`(guild_id >> 22) % num_shards`), spread evenly in the order built,
        as guilds created over months spread on Discord."""
        first = max(((self._last >> 22) + 1) << 22, discord.utils.time_snowflake(now()))
        ids = [first + (i << 22) for i in range(n)]
        if ids:
            self._last = ids[-1]
        return ids


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(eq=False)
class User:
    """A bot (owns a token and an application) or a person (posts via /_room/); names are room-wide."""

    id: int
    name: str
    bot: bool
    token: str | None = None
    intents: int | None = None  # last IDENTIFY intents, used to apply MESSAGE_CONTENT to REST too

    @property
    def application_id(self) -> int:
        return self.id  # modern Discord applications share their id with their bot user


@dataclass(eq=False)
class Role:
    id: int
    name: str
    permissions: discord.Permissions
    position: int
    mentionable: bool = False


@dataclass(eq=False)
class Overwrite:
    """A channel permission overwrite for a role (type 0) or a member (type 1)."""

    id: int
    type: int
    allow: discord.Permissions
    deny: discord.Permissions


@dataclass(eq=False)
class Member:
    user: User
    roles: list[Role]
    joined_at: dt.datetime = field(default_factory=now)


@dataclass(eq=False)
class Channel:
    id: int
    name: str
    position: int
    guild: Guild
    overwrites: list[Overwrite] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    by_id: dict[int, Message] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        """How people name it when a bare name is ambiguous: `guild/channel`."""
        return f"{self.guild.name}/{self.name}"

    @property
    def last_message_id(self) -> int | None:
        for msg in reversed(self.messages):
            if not msg.deleted:
                return msg.id
        return None


@dataclass(eq=False)
class Guild:
    id: int  # also the id of its @everyone role, as on Discord
    name: str
    owner_id: int
    created: dt.datetime = field(default_factory=now)
    roles: dict[int, Role] = field(default_factory=dict)
    channels: dict[int, Channel] = field(default_factory=dict)
    members: dict[int, Member] = field(default_factory=dict)

    @property
    def everyone(self) -> Role:
        return self.roles[self.id]

    def role_named(self, name: str) -> Role | None:
        return next((r for r in self.roles.values() if r.name == name), None)

    def permissions(self, user: User, channel: Channel | None = None) -> discord.Permissions:
        """`user`'s permissions in the guild, or in `channel` with its overwrites applied (Discord's order)."""
        member = self.members.get(user.id)
        if member is None:
            return discord.Permissions.none()
        if user.id == self.owner_id:
            return discord.Permissions.all()
        perms = discord.Permissions(self.everyone.permissions.value)
        for role in member.roles:
            perms.value |= role.permissions.value
        if perms.administrator:
            return discord.Permissions.all()
        if channel is None:
            return perms
        by_target = {(o.type, o.id): o for o in channel.overwrites}
        everyone = by_target.get((0, self.id))
        if everyone is not None:
            perms.handle_overwrite(everyone.allow.value, everyone.deny.value)
        allow = deny = 0
        for role in member.roles:
            o = by_target.get((0, role.id))
            if o is not None:
                allow, deny = allow | o.allow.value, deny | o.deny.value
        perms.handle_overwrite(allow, deny)
        own = by_target.get((1, user.id))
        if own is not None:
            perms.handle_overwrite(own.allow.value, own.deny.value)
        if not perms.view_channel:  # a channel one cannot see grants nothing in it
            perms.value &= ~discord.Permissions.all_channel().value
        return perms


@dataclass(eq=False)
class Attachment:
    id: int
    filename: str
    data: bytes
    content_type: str | None
    url: str


@dataclass(eq=False)
class Message:
    id: int
    channel: Channel
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
    mention_users: list[User] = field(default_factory=list)
    mention_roles: list[Role] = field(default_factory=list)
    mention_everyone: bool = False
    reference: Message | None = None
    edited_at: dt.datetime | None = None
    webhook_id: int | None = None
    application_id: int | None = None
    interaction: Interaction | None = None
    deleted: bool = False

    @property
    def ephemeral(self) -> bool:
        return bool(self.flags & FLAG_EPHEMERAL)

    @property
    def guild(self) -> Guild:
        return self.channel.guild


@dataclass(eq=False)
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


# Message component types, as Discord numbers them (the local room implements these two)
COMPONENT_ACTION_ROW = 1
COMPONENT_BUTTON = 2
BUTTON_LINK = 5  # the button style that opens a URL and sends no interaction

# Interaction types, as Discord numbers them
INTERACTION_COMMAND = 2
INTERACTION_COMPONENT = 3  # MESSAGE_COMPONENT: a person pressed a button on a bot's message


@dataclass(eq=False)
class Interaction:
    """One interaction and everything the bot answered: an application-command invocation (a slash
    command, or a message command on `target`), or a press of the button `custom_id` on `source`."""

    id: int
    token: str
    bot: User
    channel: Channel
    user: User
    command: Command | None
    options: list[dict[str, Any]]
    created: float = field(default_factory=time.monotonic)
    callback_type: int | None = None
    original: Message | None = None
    deferred_pending: bool = False  # a type-5 "thinking" message waiting for its first follow-up
    followups: list[Message] = field(default_factory=list)
    responses: list[dict[str, Any]] = field(default_factory=list)
    payload: dict[str, Any] = field(default_factory=dict)  # INTERACTION_CREATE's body, fixed when invoked
    target: Message | None = None  # a message command's (type 3) message: `data.target_id`, resolved
    source: Message | None = None  # a component interaction's message: the one whose button was pressed
    custom_id: str | None = None  # ... and the pressed button's custom_id

    @property
    def type(self) -> int:
        return INTERACTION_COMMAND if self.command is not None else INTERACTION_COMPONENT

    @property
    def name(self) -> str:
        """What the room's API and page call it: the command's name, or the pressed button's custom_id."""
        return self.command.name if self.command is not None else str(self.custom_id)

    @property
    def message_type(self) -> int:
        """The type of the messages that answer it: a slash command's, a context menu command's, or (a
        component's) a plain message."""
        if self.command is None:
            return MSG_DEFAULT
        return MSG_CHAT_INPUT_COMMAND if self.command.type == 1 else MSG_CONTEXT_MENU_COMMAND


@dataclass
class RoomEvent:
    kind: str  # message_create | message_update | message_delete | typing | member_add | member_update
    #            | interaction_create | interaction_response
    message: Message | None = None
    user: User | None = None
    guild: Guild | None = None
    channel: Channel | None = None
    interaction: Interaction | None = None
    response: dict[str, Any] | None = None


Listener = Callable[[RoomEvent], None]
