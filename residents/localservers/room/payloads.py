"""Discord-shaped JSON for the model's objects, and the /_room/ rendering people read.

One renderer for the gateway, the REST routes and the room API, so each shows the same object the
same way. Pure functions of the model: no state, no sockets.
"""

from __future__ import annotations

from typing import Any

import discord

from .model import (
    COMPONENT_BUTTON,
    FLAG_EPHEMERAL,
    FLAG_LOADING,
    Attachment,
    Channel,
    Command,
    Guild,
    Interaction,
    Member,
    Message,
    Role,
    User,
)

ATTACHMENT_LIMIT = 10 * 1024 * 1024
INTENT_MESSAGE_CONTENT = 1 << 15


def iso(when: Any) -> str:
    return when.isoformat()


def user(u: User) -> dict[str, Any]:
    return {
        "id": str(u.id),
        "username": u.name,
        "global_name": None if u.bot else u.name,
        "discriminator": "0",
        "avatar": None,
        "bot": u.bot,
        "public_flags": 0,
        "banner": None,
        "accent_color": None,
        "avatar_decoration_data": None,
    }


def member(m: Member, *, with_user: bool = True, permissions: discord.Permissions | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "roles": [str(r.id) for r in m.roles],
        "joined_at": iso(m.joined_at),
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
        data["user"] = user(m.user)
    if permissions is not None:
        data["permissions"] = str(permissions.value)
    return data


def role(r: Role) -> dict[str, Any]:
    return {
        "id": str(r.id),
        "name": r.name,
        "permissions": str(r.permissions.value),
        "position": r.position,
        "color": 0,
        "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
        "hoist": False,
        "managed": False,
        "mentionable": r.mentionable,
        "icon": None,
        "unicode_emoji": None,
        "flags": 0,
    }


def channel(c: Channel) -> dict[str, Any]:
    last = c.last_message_id
    return {
        "id": str(c.id),
        "type": 0,
        "guild_id": str(c.guild.id),
        "name": c.name,
        "position": c.position,
        "permission_overwrites": [
            {"id": str(o.id), "type": o.type, "allow": str(o.allow.value), "deny": str(o.deny.value)}
            for o in c.overwrites
        ],
        "topic": None,
        "nsfw": False,
        "last_message_id": str(last) if last else None,
        "rate_limit_per_user": 0,
        "parent_id": None,
        "flags": 0,
    }


def guild(g: Guild) -> dict[str, Any]:
    """GUILD_CREATE's body; member_count equals the members sent so discord.py won't chunk."""
    members = list(g.members.values())
    first = next(iter(g.channels.values()))
    return {
        "id": str(g.id),
        "name": g.name,
        "icon": None,
        "splash": None,
        "discovery_splash": None,
        "banner": None,
        "description": None,
        "owner_id": str(g.owner_id),
        "afk_channel_id": None,
        "afk_timeout": 300,
        "verification_level": 0,
        "default_message_notifications": 1,
        "explicit_content_filter": 0,
        "mfa_level": 0,
        "nsfw_level": 0,
        "premium_tier": 0,
        "premium_subscription_count": 0,
        "preferred_locale": "en-US",
        "system_channel_id": str(first.id),
        "system_channel_flags": 0,
        "rules_channel_id": None,
        "public_updates_channel_id": None,
        "safety_alerts_channel_id": None,
        "vanity_url_code": None,
        "features": [],
        "roles": [role(r) for r in g.roles.values()],
        "emojis": [],
        "stickers": [],
        "joined_at": iso(g.created),
        "large": False,
        "unavailable": False,
        "member_count": len(members),
        "members": [member(m) for m in members],
        "channels": [channel(c) for c in g.channels.values()],
        "threads": [],
        "presences": [],
        "voice_states": [],
        "stage_instances": [],
        "guild_scheduled_events": [],
        "soundboard_sounds": [],
        "application_id": None,
        "max_members": 500000,
        "premium_progress_bar_enabled": False,
        "widget_enabled": False,
    }


def attachment(a: Attachment) -> dict[str, Any]:
    return {
        "id": str(a.id),
        "filename": a.filename,
        "size": len(a.data),
        "url": a.url,
        "proxy_url": a.url,
        "content_type": a.content_type,
    }


def message(msg: Message, *, nested: bool = False) -> dict[str, Any]:
    g = msg.guild
    data: dict[str, Any] = {
        "id": str(msg.id),
        "type": msg.type,
        "channel_id": str(msg.channel.id),
        "guild_id": str(g.id),
        "author": user(msg.author),
        "content": msg.content,
        "timestamp": iso(discord.utils.snowflake_time(msg.id)),
        "edited_timestamp": iso(msg.edited_at) if msg.edited_at else None,
        "tts": msg.tts,
        "mention_everyone": msg.mention_everyone,
        "mentions": [_mention(g, u) for u in msg.mention_users],
        "mention_roles": [str(r.id) for r in msg.mention_roles],
        "attachments": [attachment(a) for a in msg.attachments],
        "embeds": msg.embeds,
        "components": msg.components,
        "pinned": False,
        "flags": msg.flags,
    }
    author = g.members.get(msg.author.id)
    if msg.webhook_id is not None:
        data["webhook_id"] = str(msg.webhook_id)
    elif author is not None:
        data["member"] = member(author, with_user=False)
    if msg.application_id is not None:
        data["application_id"] = str(msg.application_id)
    if msg.nonce is not None:
        data["nonce"] = msg.nonce
    if msg.interaction is not None:
        inter = msg.interaction
        data["interaction_metadata"] = {
            "id": str(inter.id),
            "type": inter.type,
            "user": user(inter.user),
            "authorizing_integration_owners": {"0": str(g.id)},
        }
        if inter.command is not None:
            data["interaction_metadata"]["name"] = inter.command.name
            data["interaction"] = {"id": str(inter.id), "type": 2, "name": inter.command.name, "user": user(inter.user)}
        elif inter.source is not None:
            data["interaction_metadata"]["interacted_message_id"] = str(inter.source.id)
    if msg.reference is not None:
        data["message_reference"] = {
            "type": 0,
            "message_id": str(msg.reference.id),
            "channel_id": str(msg.channel.id),
            "guild_id": str(g.id),
        }
        if not nested:
            ref = msg.reference
            data["referenced_message"] = None if ref.deleted else message(ref, nested=True)
    return data


def _mention(g: Guild, u: User) -> dict[str, Any]:
    data = user(u)
    m = g.members.get(u.id)
    if m is not None:
        data["member"] = member(m, with_user=False)
    return data


def can_read_content(viewer: User, msg: Message) -> bool:
    """Without the MESSAGE_CONTENT intent a bot reads only its own messages and those that mention it."""
    if viewer.intents is None or viewer.intents & INTENT_MESSAGE_CONTENT:
        return True
    return msg.author is viewer or viewer in msg.mention_users


def visible(msg: Message, viewer: User) -> dict[str, Any]:
    """The message as `viewer` sees it: without MESSAGE_CONTENT, content/embeds are blanked."""
    data = message(msg)
    if not can_read_content(viewer, msg):
        data.update(content="", embeds=[], attachments=[], components=[])
    ref = data.get("referenced_message")
    if ref and msg.reference is not None and not can_read_content(viewer, msg.reference):
        ref.update(content="", embeds=[], attachments=[], components=[])
    return data


def command(c: Command) -> dict[str, Any]:
    body = {
        "type": 1,
        "description": "",
        "options": [],
        "default_member_permissions": None,
        "dm_permission": True,
        "nsfw": False,
        "contexts": None,
        "integration_types": [0],
        **c.data,
    }
    body.update(id=str(c.id), application_id=str(c.application_id), version=str(c.version))
    if c.guild_id is not None:
        body["guild_id"] = str(c.guild_id)
    return body


def interaction(
    inter: Interaction,
    who: Member,
    perms: discord.Permissions,
    app_perms: discord.Permissions,
    resolved: dict[str, Any],
) -> dict[str, Any]:
    """INTERACTION_CREATE: `member.permissions` is the invoker's permissions in the channel, overwrites applied.

    A command's carries its name and options; a button's (type 3) its `custom_id` and the message it is on."""
    g = inter.channel.guild
    extra: dict[str, Any] = {}
    if inter.command is None:
        data: dict[str, Any] = {"custom_id": inter.custom_id, "component_type": COMPONENT_BUTTON}
        if inter.source is not None:
            extra["message"] = message(inter.source)
    else:
        data = {
            "id": str(inter.command.id),
            "name": inter.command.name,
            "type": inter.command.type,
            "resolved": resolved,
        }
        if inter.target is not None:
            data["target_id"] = str(inter.target.id)
        else:
            data["options"] = inter.options
        if inter.command.guild_id is not None:
            data["guild_id"] = str(inter.command.guild_id)
    return {
        "id": str(inter.id),
        "application_id": str(inter.bot.application_id),
        "type": inter.type,
        "data": data,
        **extra,
        "guild_id": str(g.id),
        "guild": {"id": str(g.id), "locale": "en-US", "features": []},
        "channel_id": str(inter.channel.id),
        "channel": {**channel(inter.channel), "permissions": str(perms.value)},
        "member": member(who, permissions=perms),
        "token": inter.token,
        "version": 1,
        "app_permissions": str(app_perms.value),
        "locale": "en-US",
        "guild_locale": "en-US",
        "entitlements": [],
        "authorizing_integration_owners": {"0": str(g.id)},
        "context": 0,
        "attachment_size_limit": ATTACHMENT_LIMIT,
    }


def callback_interaction(inter: Interaction, msg: Message | None) -> dict[str, Any]:
    return {
        "id": str(inter.id),
        "type": inter.type,
        "activity_instance_id": None,
        "response_message_id": str(msg.id) if msg else None,
        "response_message_loading": bool(msg and msg.flags & FLAG_LOADING),
        "response_message_ephemeral": bool(msg and msg.ephemeral),
    }


def room_view(msg: Message) -> dict[str, Any]:
    """The /_room/ rendering: names instead of payloads, and who actually gets pinged."""
    return {
        "id": str(msg.id),
        "channel_id": str(msg.channel.id),
        "channel": msg.channel.name,
        "guild": msg.guild.name,
        "author": msg.author.name,
        "author_id": str(msg.author.id),
        "bot": msg.author.bot,
        "content": msg.content,
        "timestamp": iso(discord.utils.snowflake_time(msg.id)),
        "edited_timestamp": iso(msg.edited_at) if msg.edited_at else None,
        "type": msg.type,
        "reply_to": str(msg.reference.id) if msg.reference else None,
        "allowed_mentions": msg.allowed_mentions,
        "pings": {
            "users": [u.name for u in msg.mention_users],
            "user_ids": [str(u.id) for u in msg.mention_users],
            "roles": [r.name for r in msg.mention_roles],
            "everyone": msg.mention_everyone,
        },
        "embeds": msg.embeds,
        "attachments": [
            {"filename": a.filename, "size": len(a.data), "url": a.url, "content_type": a.content_type}
            for a in msg.attachments
        ],
        "flags": msg.flags,
        "ephemeral": bool(msg.flags & FLAG_EPHEMERAL),
        "loading": bool(msg.flags & FLAG_LOADING),
        "interaction": (
            {"name": msg.interaction.name, "user": msg.interaction.user.name, "id": str(msg.interaction.id)}
            if msg.interaction
            else None
        ),
        "components": msg.components,
        "nonce": msg.nonce,
        "deleted": msg.deleted,
    }
