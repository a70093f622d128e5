"""What `residents run` tells its operator before and as the bots start: every missing variable at
once, then one table of who is running where, with the invite URL each bot needs.

Pure formatting over what run.py already knows (residences, environment, the logged-in bots), so a
person fixes their environment in one go and sees at a glance that each resident is where they meant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import discord

from ..config import Residence
from ..provider import REGISTRY

# What a resident needs in a guild: read the channel and its history, and post; slash commands need
# the applications.commands scope. docs/operations.md, "Bot accounts", lists the same.
INVITE_SCOPES = ("bot", "applications.commands")
INVITE_PERMISSIONS = discord.Permissions(view_channel=True, send_messages=True, read_message_history=True)


def missing_variables(residences: Sequence[Residence], env: Mapping[str, str], local_api: bool) -> str | None:
    """One line naming every environment variable start-up needs and does not find, or None.

    Against a local room any token will do, so only the providers' variables are needed there: the
    key of a provider configured by the environment (ANTHROPIC_API_KEY, unless its base URL variable
    names a server of its own), and the `api_key_env` of each residence that names one.
    """
    wanted: dict[str, list[str]] = {}
    if not local_api:
        for r in residences:
            if r.discord is not None and not env.get(r.discord.token_env, "").strip():
                wanted.setdefault(r.discord.token_env, []).append(f"residences/{r.name}.yaml: discord.token_env")
    for reg in {REGISTRY[r.provider] for r in residences}:
        if reg.key_env is not None and not env.get(reg.key_env) and not env.get(reg.base_url_env or ""):
            wanted[reg.key_env] = [f"the provider key; or set {reg.base_url_env} to {reg.server}"]
    for r in residences:
        if r.api_key_env is not None and not env.get(r.api_key_env, "").strip():
            wanted.setdefault(r.api_key_env, []).append(f"residences/{r.name}.yaml: api_key_env")
    if not wanted:
        return None
    names = ", ".join(f"{var} ({'; '.join(where)})" for var, where in wanted.items())
    return f"not set in the environment: {names}"


def invite_url(application_id: int) -> str:
    """The OAuth2 URL that adds a bot to a server with the scopes and permissions a resident needs."""
    return discord.utils.oauth_url(application_id, permissions=INVITE_PERMISSIONS, scopes=INVITE_SCOPES)


@dataclass(frozen=True)
class Row:
    """One resident as it started: the facts of its table row."""

    resident: str
    bot_user: str
    model: str
    channels: str
    standing: str
    invite: str | None  # None against a local room, where no invite exists


def row(
    residence: Residence, bot_user: str, application_id: int | None, channels: Sequence[str], local_api: bool
) -> Row:
    shown = ", ".join(channels) if channels else "every channel it can see"
    invite = invite_url(application_id) if application_id is not None and not local_api else None
    return Row(residence.name, bot_user, residence.model, shown, residence.policy.continuation.standing, invite)


def table(rows: Sequence[Row], db: str) -> str:
    """The start-up table: one line per resident, then each bot's invite URL (or why there is none)."""
    head = ("resident", "bot user", "model", "channels", "continuation")
    cells = [head] + [(r.resident, r.bot_user, r.model, r.channels, r.standing) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    lines = [f"residents run: {len(rows)} resident{'s' if len(rows) != 1 else ''} connected; ledger {db}"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(cs, widths, strict=False)) + "  " + cs[-1] for cs in cells]
    if any(r.invite for r in rows):
        perms = ", ".join(p.replace("_", " ").title() for p, on in INVITE_PERMISSIONS if on)
        lines.append(f"invite each bot to a server (scopes {' '.join(INVITE_SCOPES)}; permissions {perms}):")
        width = max(len(r.resident) for r in rows)
        lines += [f"  {r.resident.ljust(width)}  {r.invite}" for r in rows if r.invite]
    else:
        lines.append("invites: none needed, the bots are in the local room")
    return "\n".join(lines)
