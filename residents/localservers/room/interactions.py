"""Slash commands as people invoke them, buttons as people press them, and every way a bot answers:
callback, defer, follow-ups, edits.

The invoking member's roles and the channel's overwrites decide the permissions the bot is told
(`member.permissions`), as on Discord. A button press (MESSAGE_COMPONENT, type 3) goes to the
application whose message carries the button; besides a message (4) or "thinking" (5), it may be
answered by acknowledging it quietly (6, DEFERRED_UPDATE_MESSAGE) or by editing the message it is on
(7, UPDATE_MESSAGE), after which `@original` is that message.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from . import payloads, validation
from .model import (
    BUTTON_LINK,
    FLAG_EPHEMERAL,
    FLAG_LOADING,
    ApiError,
    Channel,
    Command,
    Interaction,
    Message,
    RoomEvent,
    form_error,
    unknown,
)
from .state import RoomState, Upload

FOLLOWUP_WINDOW_S = 15 * 60.0  # interaction tokens stay valid 15 minutes
USER_OPTIONS = (6, 9)  # USER, MENTIONABLE


class Interactions:
    def __init__(self, state: RoomState) -> None:
        self.state = state

    def create(
        self,
        channel: Channel,
        member: str,
        command: Command,
        options: list[dict[str, Any]] | None,
        *,
        moderator: bool | None,
        target: str | None = None,
    ) -> Interaction:
        """`member` runs `command` in `channel`; dispatched to the command's bot as INTERACTION_CREATE.

        A message command (type 3) runs on `target`, a message of `channel`, sent resolved as on Discord."""
        state = self.state
        user = state.person(member, channel.guild, moderator=moderator)
        perms = state.permissions(user, channel)
        if not perms.view_channel:
            raise ApiError(403, 50001, f"{user.name} cannot see {channel.ref}")
        bot = state.users[command.application_id]
        message = None
        if command.type == 3:
            if target is None:
                raise ApiError(400, 50035, f"the message command {command.name!r} needs a target message id")
            message = state.message(channel, target)
            opts: list[dict[str, Any]] = []
        else:
            opts = self._typed(list(options or []), command.data.get("options") or [])
        inter = Interaction(
            id=state.ids.next(),
            token=secrets.token_urlsafe(32).replace("-", "x").replace("_", "y"),
            bot=bot,
            channel=channel,
            user=user,
            command=command,
            options=opts,
            target=message,
        )
        resolved = self._resolved(channel, opts)
        if message is not None:
            resolved["messages"] = {str(message.id): payloads.message(message)}
        inter.payload = payloads.interaction(
            inter, channel.guild.members[user.id], perms, state.permissions(bot, channel), resolved
        )
        state.interactions[inter.id] = inter
        state.emit(RoomEvent("interaction_create", interaction=inter, channel=channel))
        return inter

    def press(self, channel: Channel, member: str, message_id: str, custom_id: str) -> Interaction:
        """`member` presses the button `custom_id` on a message of `channel`; dispatched as INTERACTION_CREATE
        (type 3) to the application that sent the message. Only an enabled button that sends interactions
        (not a link) can be pressed, by someone who can see the channel."""
        state = self.state
        user = state.person(member, channel.guild)
        perms = state.permissions(user, channel)
        if not perms.view_channel:
            raise ApiError(403, 50001, f"{user.name} cannot see {channel.ref}")
        message = state.message(channel, message_id)
        button = next(
            (b for b in validation.buttons(message.components) if b.get("custom_id") == custom_id),
            None,
        )
        if button is None or button.get("style") == BUTTON_LINK:
            raise ApiError(400, 50035, f"message {message.id} has no button with custom_id {custom_id!r}")
        if button.get("disabled"):
            raise ApiError(400, 50035, f"the button {custom_id!r} on message {message.id} is disabled")
        if not message.author.bot:
            raise ApiError(400, 50035, f"message {message.id} was not sent by an application")
        bot = message.author
        inter = Interaction(
            id=state.ids.next(),
            token=secrets.token_urlsafe(32).replace("-", "x").replace("_", "y"),
            bot=bot,
            channel=channel,
            user=user,
            command=None,
            options=[],
            source=message,
            custom_id=custom_id,
        )
        inter.payload = payloads.interaction(
            inter, channel.guild.members[user.id], perms, state.permissions(bot, channel), {}
        )
        state.interactions[inter.id] = inter
        state.emit(RoomEvent("interaction_create", interaction=inter, channel=channel))
        return inter

    def _typed(self, given: list[dict[str, Any]], schema: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Fill in option `type`s from the synced schema; a user option may name the user."""
        out = []
        by_name = {s.get("name"): s for s in schema}
        for opt in given:
            opt = dict(opt)
            spec = by_name.get(opt.get("name"), {})
            otype = int(opt.get("type", spec.get("type", 3)))
            opt["type"] = otype
            if otype in (1, 2):
                opt["options"] = self._typed(list(opt.get("options") or []), spec.get("options") or [])
            elif otype in USER_OPTIONS and isinstance(opt.get("value"), str) and not opt["value"].isdigit():
                user = self.state.user_by_name(opt["value"].lstrip("@"))
                if user is None:
                    raise ApiError(400, 50035, f"unknown user {opt['value']!r}")
                opt["value"] = str(user.id)
            out.append(opt)
        return out

    def _resolved(self, channel: Channel, options: list[dict[str, Any]]) -> dict[str, Any]:
        resolved: dict[str, dict[str, Any]] = {}
        guild = channel.guild

        def walk(opts: list[dict[str, Any]]) -> None:
            for opt in opts:
                if opt["type"] in (1, 2):
                    walk(opt.get("options") or [])
                elif opt["type"] in USER_OPTIONS and str(opt.get("value", "")).isdigit():
                    user = self.state.users.get(int(opt["value"]))
                    if user is None:
                        continue
                    resolved.setdefault("users", {})[str(user.id)] = payloads.user(user)
                    member = guild.members.get(user.id)
                    if member is not None:
                        resolved.setdefault("members", {})[str(user.id)] = payloads.member(
                            member, with_user=False, permissions=self.state.permissions(user, channel)
                        )

        walk(options)
        return resolved

    # ----- the bot's side ---------------------------------------------------------------------

    def for_callback(self, interaction_id: str, token: str) -> Interaction:
        try:
            inter = self.state.interactions[int(interaction_id)]
        except (KeyError, ValueError):
            raise unknown("interaction", 10062) from None
        if not secrets.compare_digest(inter.token, token):
            raise unknown("interaction", 10062)
        if inter.callback_type is not None:
            raise ApiError(400, 40060, "Interaction has already been acknowledged.")
        if time.monotonic() - inter.created > self.state.interaction_deadline:
            raise unknown("interaction", 10062)
        return inter

    def for_webhook(self, app_id: str, token: str) -> Interaction:
        for inter in self.state.interactions.values():
            if secrets.compare_digest(inter.token, token) and str(inter.bot.application_id) == str(app_id):
                if inter.callback_type is None or time.monotonic() - inter.created > FOLLOWUP_WINDOW_S:
                    break
                return inter
        raise unknown("Webhook", 10015)

    def record(
        self, inter: Interaction, kind: str, *, ctype: int | None = None, message: Message | None = None
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "kind": kind,
            "type": ctype,
            "content": message.content if message is not None else None,
            "ephemeral": bool(message.flags & FLAG_EPHEMERAL) if message is not None else False,
            "embeds": list(message.embeds) if message is not None else [],
            "components": list(message.components) if message is not None else [],
            "message_id": str(message.id) if message is not None else None,
            "flags": message.flags if message is not None else 0,
            "allowed_mentions": message.allowed_mentions if message is not None else None,
        }
        inter.responses.append(entry)
        self.state.emit(RoomEvent("interaction_response", interaction=inter, response=entry, message=message))
        return entry

    def callback(self, inter: Interaction, body: dict[str, Any], attachments: Sequence[Upload] = ()) -> dict[str, Any]:
        """Apply an interaction callback (4: a message, 5: "thinking"; for a button, also 6: acknowledged,
        7: its message edited); returns the `?with_response=1` body."""
        ctype = int(body.get("type", 0))
        data = body.get("data") or {}
        state = self.state
        message: Message | None
        if ctype in (6, 7) and inter.source is not None:
            message = inter.source
            if ctype == 7:
                state.edit_message(message, data)
            inter.callback_type = ctype
            inter.original = message  # from here on `@original` is the message the button is on
            self.record(inter, "callback", ctype=ctype, message=message if ctype == 7 else None)
            return {
                "interaction": payloads.callback_interaction(inter, message),
                "resource": {"type": ctype, **({"message": payloads.message(message)} if ctype == 7 else {})},
            }
        if ctype == 4:
            message = state.create_message(
                inter.channel,
                inter.bot,
                data,
                attachments=attachments,
                mtype=inter.message_type,
                interaction=inter,
                allow_ephemeral=True,
            )
        elif ctype == 5:
            message = state.create_message(
                inter.channel,
                inter.bot,
                {"content": ""},
                mtype=inter.message_type,
                interaction=inter,
                allow_empty=True,
                store=False,
            )
            message.flags = FLAG_LOADING | (int(data.get("flags") or 0) & FLAG_EPHEMERAL)
            if not message.ephemeral:
                state.store(message)
            inter.deferred_pending = True
        else:
            raise form_error(
                ["type"],
                "INTERACTION_RESPONSE_TYPE_INVALID",
                f"Interaction response type {ctype} is not valid for "
                + ("an application command" if inter.command is not None else "a message component"),
            )
        inter.callback_type = ctype
        inter.original = message
        self.record(inter, "callback", ctype=ctype, message=message)
        return {
            "interaction": payloads.callback_interaction(inter, message),
            "resource": {"type": ctype, "message": payloads.message(message)},
        }

    def followup(self, inter: Interaction, body: dict[str, Any], attachments: Sequence[Upload] = ()) -> Message:
        """A follow-up; the first one after a defer replaces the "thinking" message, as on Discord."""
        state = self.state
        if inter.deferred_pending and inter.original is not None:
            original = inter.original
            probe = state.create_message(
                inter.channel,
                inter.bot,
                body,
                attachments=attachments,
                allow_ephemeral=True,
                mtype=inter.message_type,
                interaction=inter,
                store=False,
            )  # validates like a new message
            inter.deferred_pending = False
            original.flags &= ~FLAG_LOADING
            original.content, original.embeds, original.components = probe.content, probe.embeds, probe.components
            original.attachments, original.allowed_mentions = probe.attachments, probe.allowed_mentions
            original.mention_users, original.mention_roles = probe.mention_users, probe.mention_roles
            original.mention_everyone = probe.mention_everyone
            if not original.ephemeral:
                state.emit(RoomEvent("message_update", message=original))
            self.record(inter, "followup", message=original)
            return original
        msg = state.create_message(
            inter.channel,
            inter.bot,
            body,
            attachments=attachments,
            allow_ephemeral=True,
            mtype=inter.message_type,
            interaction=inter,
        )
        inter.followups.append(msg)
        self.record(inter, "followup", message=msg)
        return msg

    def message(self, inter: Interaction, message_id: str) -> Message:
        if message_id == "@original":
            if inter.original is None:
                raise unknown("Message", 10008)
            return inter.original
        for msg in [inter.original, *inter.followups]:
            if msg is not None and str(msg.id) == message_id and not msg.deleted:
                return msg
        raise unknown("Message", 10008)

    def edit(self, inter: Interaction, msg: Message, body: dict[str, Any]) -> Message:
        """PATCH an answer (`edit_original_response`); editing the "thinking" message ends the thinking."""
        if msg is inter.original and inter.deferred_pending:
            msg.flags &= ~FLAG_LOADING
            try:
                self.state.edit_message(msg, body)
            except ApiError:
                msg.flags |= FLAG_LOADING
                raise
            inter.deferred_pending = False
        else:
            self.state.edit_message(msg, body)
        self.record(inter, "edit", message=msg)
        return msg
