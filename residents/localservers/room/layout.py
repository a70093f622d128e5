"""`residents room --layout LAYOUT.yaml`: the guilds a local room builds, with roles, members and overwrites.

    guilds:
      - name: harbour
        channels: [yard, dock]
        roles: {mods: [manage_messages]}          # role -> discord.Permissions flag names
        members: {alice: [], mo: [mods]}           # person -> role names
        overwrites: {dock: {mods: {deny: [view_channel]}}}   # channel -> role, member or @everyone
    sharding:                                      # optional: the gateway's shard rules (Discord's defaults)
      guilds_per_shard: 1000                       # GET /gateway/bot recommends one shard per this many guilds
      max_guilds_per_session: 2500                 # a session that would carry more is closed with 4011
      max_concurrency: 1                           # IDENTIFYs a bot may send per 5 seconds (/gateway/bot says)

Every mistake is one `LayoutError` line naming the file, the key and (where the YAML has one) the line.
Without a layout the room is one guild whose `moderator` role the /_room/ `moderator` flag gives.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import discord
import yaml

from .model import MODERATOR_PERMS, MODERATOR_ROLE

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
PERSON = re.compile(r"^[^\s/@#:`]{1,32}$")
EVERYONE_TARGETS = ("@everyone", "everyone")
BUNDLED = Path(__file__).resolve().parent / "layouts"


class LayoutError(Exception):
    """One problem in a layout file, as the single line a person reads."""

    def __init__(self, source: str, key: str, message: str, line: int | None = None) -> None:
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {key}: {message}" if key else f"{where}: {message}")


@dataclass(frozen=True)
class ChannelOverwrite:
    target: str  # a role name, a member name, or "@everyone"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


@dataclass(frozen=True)
class GuildLayout:
    name: str
    channels: tuple[str, ...]
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    overwrites: dict[str, tuple[ChannelOverwrite, ...]] = field(default_factory=dict)


# Discord recommends a shard per 1,000 guilds, requires sharding past 2,500 guilds in one session, and
# lets an ordinary bot start one session per 5 seconds (`session_start_limit.max_concurrency`).
GUILDS_PER_SHARD = 1000
MAX_GUILDS_PER_SESSION = 2500
MAX_CONCURRENCY = 1


@dataclass(frozen=True)
class ShardRules:
    """How the room's gateway treats sharding: what `GET /gateway/bot` recommends, and when a session
    carries too many guilds (close code 4011, "sharding required"). Small numbers let a test shard a
    few guilds the way Discord shards thousands."""

    guilds_per_shard: int = GUILDS_PER_SHARD
    max_guilds_per_session: int = MAX_GUILDS_PER_SESSION
    max_concurrency: int = MAX_CONCURRENCY  # told, not enforced: what a bot paces its IDENTIFYs by

    def recommended(self, guilds: int) -> int:
        """The shard count `GET /gateway/bot` recommends for a bot in `guilds` guilds (at least 1)."""
        return max(1, -(-guilds // self.guilds_per_shard))


@dataclass(frozen=True)
class Layout:
    guilds: tuple[GuildLayout, ...]
    source: str = "<default>"
    sharding: ShardRules = ShardRules()


def default_layout(channels: Sequence[str] = ("general",), guild_name: str = "residents") -> Layout:
    """One guild with `channels` and a `moderator` role (Manage Messages and friends)."""
    if not channels:
        raise ValueError("a room needs at least one channel")
    mod = tuple(name for name, on in MODERATOR_PERMS if on)
    return Layout((GuildLayout(guild_name, tuple(channels), {MODERATOR_ROLE: mod}),))


def load_layout(path: str | Path) -> Layout:
    """A layout from a file, or a bundled one by name (`two-guilds`); LayoutError on any problem."""
    p = Path(path)
    if not p.exists() and (BUNDLED / f"{path}.yaml").exists():
        p = BUNDLED / f"{path}.yaml"
    source = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LayoutError(source, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LayoutError(source, "", f"cannot be read: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise LayoutError(source, "", f"invalid YAML: {problem}", mark.line + 1 if mark else None) from None
    return parse_layout(data, source, node)


def parse_layout(data: Any, source: str = "<layout>", node: yaml.Node | None = None) -> Layout:
    return _Parser(source, node).layout(data)


class _Parser:
    def __init__(self, source: str, node: yaml.Node | None) -> None:
        self.source = source
        self.node = node

    def fail(self, loc: tuple[str | int, ...], message: str) -> LayoutError:
        key = ""
        for part in loc:
            key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
        return LayoutError(self.source, key, message, _line(self.node, loc))

    def mapping(self, value: Any, loc: tuple[str | int, ...], what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(loc, f"must be a mapping of {what}, not {type(value).__name__}")
        for k in value:
            if not isinstance(k, str):
                raise self.fail(loc, f"{k!r} is not a name")
        return value

    def names(self, value: Any, loc: tuple[str | int, ...], what: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(loc, f"must be a list of {what}")
        return value

    def permissions(self, value: Any, loc: tuple[str | int, ...]) -> tuple[str, ...]:
        names = self.names(value, loc, "permission names")
        for i, name in enumerate(names):
            if name not in discord.Permissions.VALID_FLAGS:
                raise self.fail(
                    loc + (i,),
                    f"unknown permission {name!r} (discord.Permissions names, "
                    "e.g. view_channel, manage_messages, administrator)",
                )
        return tuple(names)

    def layout(self, data: Any) -> Layout:
        top = self.mapping(data, (), "keys")
        unknown_keys = set(top) - {"guilds", "sharding"}
        if unknown_keys:
            raise self.fail((sorted(unknown_keys)[0],), "unknown key (a layout has `guilds` and `sharding`)")
        guilds = top.get("guilds")
        if not isinstance(guilds, list) or not guilds:
            raise self.fail(("guilds",), "required: a list of at least one guild")
        built = [self.guild(g, ("guilds", i)) for i, g in enumerate(guilds)]
        seen: set[str] = set()
        for i, g in enumerate(built):
            if g.name in seen:
                raise self.fail(("guilds", i, "name"), f"a second guild named {g.name!r}")
            seen.add(g.name)
        return Layout(tuple(built), self.source, self.sharding(top.get("sharding")))

    def sharding(self, data: Any) -> ShardRules:
        rules = self.mapping(data, ("sharding",), "sharding rules")
        defaults = {
            "guilds_per_shard": GUILDS_PER_SHARD,
            "max_guilds_per_session": MAX_GUILDS_PER_SESSION,
            "max_concurrency": MAX_CONCURRENCY,
        }
        extra = set(rules) - set(defaults)
        if extra:
            raise self.fail(("sharding", sorted(extra)[0]), f"unknown key ({', '.join(defaults)})")
        values = {}
        for key, default in defaults.items():
            value = rules.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self.fail(("sharding", key), f"must be a whole number, at least 1 (got {value!r})")
            values[key] = value
        return ShardRules(**values)

    def guild(self, data: Any, loc: tuple[str | int, ...]) -> GuildLayout:
        g = self.mapping(data, loc, "guild keys")
        extra = set(g) - {"name", "channels", "roles", "members", "overwrites"}
        if extra:
            raise self.fail(loc + (sorted(extra)[0],), "unknown key (name, channels, roles, members, overwrites)")
        name = g.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise self.fail(loc + ("name",), "required: letters, digits, `_`, `.` or `-` (no `/`)")
        channels = self.names(g.get("channels"), loc + ("channels",), "channel names")
        if not channels:
            raise self.fail(loc + ("channels",), "required: at least one channel")
        for i, ch in enumerate(channels):
            if not NAME.match(ch) or ch.isdigit():
                raise self.fail(
                    loc + ("channels", i), f"{ch!r} is not a channel name (letters, digits, `_.-`, not only digits)"
                )
            if ch in channels[:i]:
                raise self.fail(loc + ("channels", i), f"a second channel named {ch!r}")
        roles: dict[str, tuple[str, ...]] = {}
        for role, perms in self.mapping(g.get("roles"), loc + ("roles",), "role -> permissions").items():
            if not NAME.match(role) or role in (*EVERYONE_TARGETS, "bots"):
                raise self.fail(loc + ("roles", role), f"{role!r} is not a usable role name")
            roles[role] = self.permissions(perms, loc + ("roles", role))
        members: dict[str, tuple[str, ...]] = {}
        for person, their in self.mapping(g.get("members"), loc + ("members",), "person -> roles").items():
            if not PERSON.match(person) or person.lower() in ("everyone", "here"):
                raise self.fail(loc + ("members", person), f"{person!r} is not a usable member name")
            names = self.names(their, loc + ("members", person), "role names")
            for i, role in enumerate(names):
                if role not in roles:
                    raise self.fail(loc + ("members", person, i), f"no role {role!r} in guild {name}")
            members[person] = tuple(names)
        overwrites: dict[str, tuple[ChannelOverwrite, ...]] = {}
        for ch, targets in self.mapping(g.get("overwrites"), loc + ("overwrites",), "channel -> targets").items():
            if ch not in channels:
                raise self.fail(loc + ("overwrites", ch), f"no channel {ch!r} in guild {name}")
            found = []
            for target, rule in self.mapping(targets, loc + ("overwrites", ch), "role or member -> allow/deny").items():
                where = loc + ("overwrites", ch, target)
                if target not in roles and target not in members and target not in EVERYONE_TARGETS:
                    raise self.fail(where, f"no role or member {target!r} in guild {name}")
                spec = self.mapping(rule, where, "allow/deny")
                if set(spec) - {"allow", "deny"}:
                    raise self.fail(where + (sorted(set(spec) - {"allow", "deny"})[0],), "unknown key (allow, deny)")
                found.append(
                    ChannelOverwrite(
                        "@everyone" if target in EVERYONE_TARGETS else target,
                        self.permissions(spec.get("allow"), where + ("allow",)),
                        self.permissions(spec.get("deny"), where + ("deny",)),
                    )
                )
            overwrites[ch] = tuple(found)
        return GuildLayout(name, tuple(channels), roles, members, overwrites)


def _line(node: yaml.Node | None, loc: tuple[str | int, ...]) -> int | None:
    """The 1-based line of the deepest node along `loc` that the YAML has."""
    best = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    best, node = k.start_mark.line + 1, v
                    break
            else:
                return best
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best
