"""Discord's rules for what a bot sends, so a resident that breaks one fails here as it would there.

Message content, embeds and components (action rows of buttons), replies, allowed mentions (who a
message really pings), and the shape of application commands a bot syncs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .model import BUTTON_LINK, COMPONENT_ACTION_ROW, COMPONENT_BUTTON, ApiError, Channel, Message, User, form_error

MAX_CONTENT = 2000
USER_MENTION = re.compile(r"<@!?(\d{1,20})>")
ROLE_MENTION = re.compile(r"<@&(\d{1,20})>")
EVERYONE_MENTION = re.compile(r"@(everyone|here)\b")
COMMAND_NAME_OK = re.compile(r"^[-_'\w]{1,32}$")


def check_content(content: Any) -> str:
    if content is None:
        return ""
    if not isinstance(content, str):
        raise form_error(["content"], "BASE_TYPE_STRING", "Must be a string.")
    if len(content) > MAX_CONTENT:
        raise form_error(["content"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT} or fewer in length.")
    return content


def check_embeds(embeds: Any) -> list[dict[str, Any]]:
    """At most 10 embeds, with Discord's title and description lengths (the parts anything here sends)."""
    if embeds is None:
        return []
    if not isinstance(embeds, list):
        raise form_error(["embeds"], "BASE_TYPE_ARRAY", "Must be an array.")
    if len(embeds) > 10:
        raise form_error(["embeds"], "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
    for i, embed in enumerate(embeds):
        if not isinstance(embed, dict):
            raise form_error(["embeds", i], "MODEL_TYPE_CONVERT", "Only dictionaries may be used in a ModelType")
        for key, limit in (("title", 256), ("description", 4096)):
            if embed.get(key) is not None and len(str(embed[key])) > limit:
                raise form_error(["embeds", i, key], "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")
    return [dict(e) for e in embeds]


MAX_ROWS = 5  # action rows in a message
MAX_ROW_BUTTONS = 5  # buttons in an action row
MAX_LABEL = 80
MAX_CUSTOM_ID = 100
MAX_URL = 512


def check_components(components: Any) -> list[dict[str, Any]]:
    """Action rows (type 1) of buttons (type 2), as Discord checks them: at most 5 rows of 1-5 buttons;
    a button has a style 1-5, a label of at most 80 characters, and either a `custom_id` (1-100
    characters, unique in the message; styles 1-4) or a `url` (style 5, a link), never both.
    Other component types exist on Discord; the local room refuses them by name rather than pretend."""
    if components is None:
        return []
    if not isinstance(components, list):
        raise form_error(["components"], "BASE_TYPE_ARRAY", "Must be an array.")
    if len(components) > MAX_ROWS:
        raise form_error(["components"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_ROWS} or fewer in length.")
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    for i, row in enumerate(components):
        path: list[str | int] = ["components", i]
        if not isinstance(row, dict):
            raise form_error(path, "MODEL_TYPE_CONVERT", "Only dictionaries may be used in a ModelType")
        if row.get("type") != COMPONENT_ACTION_ROW:
            raise form_error(
                [*path, "type"],
                "UNION_TYPE_CHOICES",
                'Value of field "type" must be one of (1,): top-level components are action rows here',
            )
        children = row.get("components")
        if not isinstance(children, list) or not 1 <= len(children) <= MAX_ROW_BUTTONS:
            raise form_error(
                [*path, "components"], "BASE_TYPE_BAD_LENGTH", f"Must be between 1 and {MAX_ROW_BUTTONS} in length."
            )
        buttons = [_check_button(b, [*path, "components", j], seen) for j, b in enumerate(children)]
        rows.append({"type": COMPONENT_ACTION_ROW, "components": buttons, **({"id": row["id"]} if "id" in row else {})})
    return rows


def _check_button(button: Any, path: list[str | int], seen: set[str]) -> dict[str, Any]:
    if not isinstance(button, dict):
        raise form_error(path, "MODEL_TYPE_CONVERT", "Only dictionaries may be used in a ModelType")
    if button.get("type") != COMPONENT_BUTTON:
        raise form_error(
            [*path, "type"],
            "UNION_TYPE_CHOICES",
            'Value of field "type" must be one of (2,): the local room implements buttons only',
        )
    style = button.get("style")
    if not isinstance(style, int) or isinstance(style, bool) or not 1 <= style <= BUTTON_LINK:
        raise form_error([*path, "style"], "BASE_TYPE_CHOICES", "Value must be one of {1, 2, 3, 4, 5}.")
    label = button.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL):
        raise form_error([*path, "label"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_LABEL} or fewer in length.")
    if not label and not button.get("emoji"):
        raise form_error(path, "BUTTON_COMPONENT_INVALID", "A button needs a label or an emoji.")
    custom_id, url = button.get("custom_id"), button.get("url")
    if style == BUTTON_LINK:
        if custom_id is not None:
            raise form_error(
                [*path, "custom_id"], "BUTTON_COMPONENT_LINK_HAS_CUSTOM_ID", "A link button cannot have a custom id."
            )
        if not isinstance(url, str) or not 1 <= len(url) <= MAX_URL:
            raise form_error([*path, "url"], "BUTTON_COMPONENT_LINK_REQUIRES_URL", "A link button requires a url.")
    else:
        if url is not None:
            raise form_error([*path, "url"], "BUTTON_COMPONENT_URL_NOT_ALLOWED", "A non-link button cannot have a url.")
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
            raise form_error(
                [*path, "custom_id"], "BASE_TYPE_BAD_LENGTH", f"Must be between 1 and {MAX_CUSTOM_ID} in length."
            )
        if custom_id in seen:
            raise form_error(
                [*path, "custom_id"], "COMPONENT_CUSTOM_ID_DUPLICATED", "Component custom id cannot be duplicated"
            )
        seen.add(custom_id)
    out = {k: button[k] for k in ("type", "style", "label", "emoji", "custom_id", "url", "id") if k in button}
    out["disabled"] = bool(button.get("disabled", False))
    return out


def buttons(components: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every button of a message's (validated) components, row by row."""
    return [b for row in components for b in row.get("components", [])]


def shows_something(embeds: list[dict[str, Any]]) -> bool:
    return any({k for k, v in e.items() if v} - {"type", "flags", "color", "timestamp", "url"} for e in embeds)


def check_reference(channel: Channel, ref: Any) -> Message | None:
    """The message a reply points at (in the same channel), or None."""
    if not ref:
        return None
    if not isinstance(ref, dict) or ref.get("message_id") is None:
        raise form_error(["message_reference"], "BASE_TYPE_REQUIRED", "This field is required")
    if int(ref.get("type", 0) or 0) != 0:
        raise form_error(["message_reference", "type"], "BASE_TYPE_CHOICES", "Only replies are supported here")
    if ref.get("channel_id") is not None and int(ref["channel_id"]) != channel.id:
        raise form_error(
            ["message_reference"],
            "REPLIES_CANNOT_REFERENCE_OTHER_CHANNEL",
            "Cannot reply to a message in a different channel",
        )
    target = channel.by_id.get(int(ref["message_id"]))
    if target is None or target.deleted:
        if ref.get("fail_if_not_exists", True):
            raise form_error(["message_reference"], "REPLIES_UNKNOWN_MESSAGE", "Unknown message")
        return None
    return target


def apply_mentions(msg: Message, users: Mapping[int, User], may_everyone: bool) -> None:
    """Who the message actually pings, per allowed_mentions (absent = parse everything)."""
    content_users: list[User] = []
    for match in USER_MENTION.finditer(msg.content):
        user = users.get(int(match.group(1)))
        if user is not None and user not in content_users:
            content_users.append(user)
    roles = msg.guild.roles
    content_roles = []
    for match in ROLE_MENTION.finditer(msg.content):
        role = roles.get(int(match.group(1)))
        if role is not None and role not in content_roles:
            content_roles.append(role)
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
            raise form_error(
                ["allowed_mentions", "parse"],
                "BASE_TYPE_CHOICES",
                f"Value must be one of ('roles', 'users', 'everyone'), not {sorted(bad)}",
            )
        users_list = {int(u) for u in allowed.get("users") or []}
        roles_list = {int(r) for r in allowed.get("roles") or []}
        if "users" in parse and users_list:
            raise form_error(
                ["allowed_mentions"],
                "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                'parse:["users"] and users: [ids...] are mutually exclusive.',
            )
        if "roles" in parse and roles_list:
            raise form_error(
                ["allowed_mentions"],
                "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                'parse:["roles"] and roles: [ids...] are mutually exclusive.',
            )
        replied = bool(allowed.get("replied_user", False))
    pinged = [u for u in content_users if "users" in parse or u.id in users_list]
    if msg.reference is not None and replied and msg.reference.author not in pinged:
        pinged.append(msg.reference.author)
    msg.mention_users = pinged
    msg.mention_roles = [r for r in content_roles if "roles" in parse or r.id in roles_list]
    msg.mention_everyone = everyone_in_content and "everyone" in parse and may_everyone


def check_command(data: Any, path: list[str | int]) -> None:
    if not isinstance(data, dict):
        raise form_error(path, "MODEL_TYPE_CONVERT", "Only dictionaries may be used in a ModelType")
    name = data.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= 32:
        raise form_error([*path, "name"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 32 in length.")
    if int(data.get("type", 1)) == 1:
        if not COMMAND_NAME_OK.match(name) or name != name.lower():
            raise form_error([*path, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
        _check_description(data.get("description"), [*path, "description"])
    _check_options(data.get("options") or [], [*path, "options"])


def _check_description(desc: Any, path: list[str | int]) -> None:
    if not isinstance(desc, str) or not 1 <= len(desc) <= 100:
        raise form_error(path, "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")


def _check_options(options: Any, path: list[str | int]) -> None:
    if len(options) > 25:
        raise form_error(path, "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
    for i, opt in enumerate(options):
        name = opt.get("name")
        if not isinstance(name, str) or not COMMAND_NAME_OK.match(name) or name != name.lower():
            raise form_error([*path, i, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")
        _check_description(opt.get("description"), [*path, i, "description"])
        if len(opt.get("choices") or []) > 25:
            raise form_error([*path, i, "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        _check_options(opt.get("options") or [], [*path, i, "options"])


def empty_message() -> ApiError:
    return ApiError(400, 50006, "Cannot send an empty message")
