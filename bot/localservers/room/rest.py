"""Discord's REST API under /api/v10: the routes discord.py 2.7 calls, with Discord's errors."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .faults import FaultPlan
from .jsonhttp import json_response, no_content, query_int, read_body, require_dict, truthy
from .state import ApiError, Channel, RoomState, User, unknown

log = logging.getLogger(__name__)

API = "/api/v10"


class DiscordRest:
    def __init__(self, state: RoomState, faults: FaultPlan, gateway_url: Callable[[], str]) -> None:
        self.state = state
        self.faults = faults
        self.gateway_url = gateway_url

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(f"{API}/users/@me", self.me)
        r.add_get(f"{API}/users/{{user_id}}", self.get_user)
        r.add_get(f"{API}/oauth2/applications/@me", self.application)
        r.add_get(f"{API}/applications/@me", self.application)
        r.add_get(f"{API}/gateway", self.gateway)
        r.add_get(f"{API}/gateway/bot", self.gateway_bot)
        r.add_get(f"{API}/channels/{{channel_id}}", self.get_channel)
        r.add_get(f"{API}/channels/{{channel_id}}/messages", self.list_messages)
        r.add_post(f"{API}/channels/{{channel_id}}/messages", self.create_message)
        r.add_get(f"{API}/channels/{{channel_id}}/messages/{{message_id}}", self.get_message)
        r.add_patch(f"{API}/channels/{{channel_id}}/messages/{{message_id}}", self.edit_message)
        r.add_delete(f"{API}/channels/{{channel_id}}/messages/{{message_id}}", self.delete_message)
        r.add_post(f"{API}/channels/{{channel_id}}/typing", self.typing)
        r.add_get(f"{API}/guilds/{{guild_id}}", self.get_guild)
        r.add_get(f"{API}/guilds/{{guild_id}}/channels", self.guild_channels)
        r.add_get(f"{API}/guilds/{{guild_id}}/roles", self.guild_roles)
        r.add_get(f"{API}/guilds/{{guild_id}}/members", self.guild_members)
        r.add_get(f"{API}/guilds/{{guild_id}}/members/{{user_id}}", self.guild_member)
        for base in (f"{API}/applications/{{app_id}}", f"{API}/applications/{{app_id}}/guilds/{{guild_id}}"):
            r.add_get(f"{base}/commands", self.list_commands)
            r.add_put(f"{base}/commands", self.overwrite_commands)
            r.add_post(f"{base}/commands", self.upsert_command)
            r.add_get(f"{base}/commands/{{command_id}}", self.get_command)
            r.add_delete(f"{base}/commands/{{command_id}}", self.delete_command)
        r.add_post(f"{API}/interactions/{{interaction_id}}/{{token}}/callback", self.interaction_callback)
        r.add_post(f"{API}/webhooks/{{app_id}}/{{token}}", self.followup)
        r.add_get(f"{API}/webhooks/{{app_id}}/{{token}}/messages/{{message_id}}", self.get_webhook_message)
        r.add_patch(f"{API}/webhooks/{{app_id}}/{{token}}/messages/{{message_id}}", self.edit_webhook_message)
        r.add_delete(f"{API}/webhooks/{{app_id}}/{{token}}/messages/{{message_id}}", self.delete_webhook_message)
        r.add_route("*", f"{API}/{{tail:.*}}", self.not_implemented)

    # ----- helpers -------------------------------------------------------------------------

    def auth(self, request: web.Request) -> User:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bot "):
            raise ApiError(401, 0, "401: Unauthorized")
        return self.state.bot_for_token(header[len("Bot "):])

    def guild(self, request: web.Request) -> None:
        if request.match_info.get("guild_id") != str(self.state.guild_id):
            raise unknown("Guild", 10004)

    def channel(self, request: web.Request) -> Channel:
        return self.state.channel(request.match_info["channel_id"])

    def own_app(self, request: web.Request, bot: User) -> int | None:
        if request.match_info["app_id"] != str(bot.application_id):
            raise ApiError(403, 50001, "Missing Access")
        if "guild_id" in request.match_info:
            self.guild(request)
            return self.state.guild_id
        return None

    async def not_implemented(self, request: web.Request) -> web.Response:
        log.warning("local room has no route for %s %s", request.method, request.path)
        return json_response({"message": "404: Not Found", "code": 0}, status=404)

    # ----- users, application, gateway -------------------------------------------------------

    async def me(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        return json_response({**bot.payload(), "verified": True, "mfa_enabled": False, "email": None,
                              "flags": 0, "locale": "en-US"})

    async def get_user(self, request: web.Request) -> web.Response:
        self.auth(request)
        try:
            user = self.state.users[int(request.match_info["user_id"])]
        except (KeyError, ValueError):
            raise unknown("User", 10013) from None
        return json_response(user.payload())

    async def application(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        return json_response({
            "id": str(bot.application_id), "name": bot.name, "icon": None, "description": "",
            "bot_public": False, "bot_require_code_grant": False, "verify_key": "0" * 64,
            "owner": {"id": str(self.state.owner_id), "username": "room-owner", "global_name": None,
                      "discriminator": "0", "avatar": None, "public_flags": 0},
            "team": None, "flags": 1 << 18 | 1 << 14 | 1 << 12, "bot": bot.payload(), "summary": "",
            "approximate_guild_count": 1, "interactions_endpoint_url": None, "redirect_uris": [],
            "tags": [], "integration_types_config": {"0": {}},
        })

    async def gateway(self, request: web.Request) -> web.Response:
        return json_response({"url": self.gateway_url()})

    async def gateway_bot(self, request: web.Request) -> web.Response:
        self.auth(request)
        return json_response({"url": self.gateway_url(), "shards": 1, "session_start_limit": {
            "total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1}})

    # ----- channels and messages -------------------------------------------------------------

    async def get_channel(self, request: web.Request) -> web.Response:
        self.auth(request)
        return json_response(self.state.channel_payload(self.channel(request)))

    async def list_messages(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        channel = self.channel(request)
        msgs = self.state.history(channel, limit=query_int(request, "limit", 50) or 50,
                                  before=query_int(request, "before"), after=query_int(request, "after"),
                                  around=query_int(request, "around"))
        return json_response([self.state.visible_payload(m, bot) for m in msgs])

    async def create_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        channel = self.channel(request)
        body, files = await read_body(request)
        fault = self.faults.check()
        if fault is not None and not fault.after_create:
            return await self.faults.respond(fault)
        msg = self.state.create_message(channel, bot, require_dict(body), attachments=files)
        if fault is not None:
            return await self.faults.respond(fault)
        return json_response(self.state.message_payload(msg))

    async def get_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msg = self.state.message(self.channel(request), request.match_info["message_id"])
        return json_response(self.state.visible_payload(msg, bot))

    async def edit_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msg = self.state.message(self.channel(request), request.match_info["message_id"])
        body, _ = await read_body(request)
        self.state.edit_message(msg, require_dict(body), editor=bot)
        return json_response(self.state.message_payload(msg))

    async def delete_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msg = self.state.message(self.channel(request), request.match_info["message_id"])
        self.state.delete_message(msg, deleter=bot)
        return no_content()

    async def typing(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        self.state.typing(self.channel(request), bot)
        return no_content()

    # ----- guild ------------------------------------------------------------------------------

    async def get_guild(self, request: web.Request) -> web.Response:
        self.auth(request)
        self.guild(request)
        data = self.state.guild_payload()
        for key in ("members", "channels", "threads", "presences", "voice_states", "joined_at", "large",
                    "member_count", "unavailable", "stage_instances", "guild_scheduled_events",
                    "soundboard_sounds"):
            data.pop(key, None)
        if truthy(request.query.get("with_counts")):
            data["approximate_member_count"] = len(self.state.users)
            data["approximate_presence_count"] = len(self.state.users)
        return json_response(data)

    async def guild_channels(self, request: web.Request) -> web.Response:
        self.auth(request)
        self.guild(request)
        return json_response([self.state.channel_payload(c) for c in self.state.channels.values()])

    async def guild_roles(self, request: web.Request) -> web.Response:
        self.auth(request)
        self.guild(request)
        return json_response(self.state.roles_payload())

    async def guild_members(self, request: web.Request) -> web.Response:
        self.auth(request)
        self.guild(request)
        limit = query_int(request, "limit", 1) or 1
        after = query_int(request, "after", 0) or 0
        members = sorted((u for u in self.state.members() if u.id > after), key=lambda u: u.id)[:limit]
        return json_response([self.state.member_payload(u) for u in members])

    async def guild_member(self, request: web.Request) -> web.Response:
        self.auth(request)
        self.guild(request)
        try:
            user = self.state.users[int(request.match_info["user_id"])]
        except (KeyError, ValueError):
            raise unknown("Member", 10007) from None
        return json_response(self.state.member_payload(user))

    # ----- application commands -------------------------------------------------------------

    async def list_commands(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        guild_id = self.own_app(request, bot)
        return json_response([c.payload() for c in self.state.list_commands(bot, guild_id)])

    async def overwrite_commands(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        guild_id = self.own_app(request, bot)
        body, _ = await read_body(request)
        cmds = self.state.overwrite_commands(bot, guild_id, body)
        log.info("bot %s synced %d %s command(s)", bot.name, len(cmds), "guild" if guild_id else "global")
        return json_response([c.payload() for c in cmds])

    async def upsert_command(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        guild_id = self.own_app(request, bot)
        body, _ = await read_body(request)
        return json_response(self.state.upsert_command(bot, guild_id, require_dict(body)).payload(), status=201)

    def _command(self, request: web.Request, bot: User) -> Any:
        guild_id = self.own_app(request, bot)
        for cmd in self.state.list_commands(bot, guild_id):
            if str(cmd.id) == request.match_info["command_id"]:
                return cmd
        raise unknown("application command", 10063)

    async def get_command(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        return json_response(self._command(request, bot).payload())

    async def delete_command(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        cmd = self._command(request, bot)
        del self.state.commands[cmd.id]
        return no_content()

    # ----- interactions and webhooks -------------------------------------------------------

    async def interaction_callback(self, request: web.Request) -> web.Response:
        inter = self.state.interaction_for_callback(request.match_info["interaction_id"],
                                                    request.match_info["token"])
        body, files = await read_body(request)
        result = self.state.interaction_callback(inter, require_dict(body), files)
        if truthy(request.query.get("with_response")):
            return json_response(result)
        return no_content()

    async def followup(self, request: web.Request) -> web.Response:
        inter = self.state.interaction_for_webhook(request.match_info["app_id"], request.match_info["token"])
        body, files = await read_body(request)
        msg = self.state.followup(inter, require_dict(body), files)
        if truthy(request.query.get("wait")):
            return json_response(self.state.message_payload(msg))
        return no_content()

    async def get_webhook_message(self, request: web.Request) -> web.Response:
        inter = self.state.interaction_for_webhook(request.match_info["app_id"], request.match_info["token"])
        msg = self.state.interaction_message(inter, request.match_info["message_id"])
        return json_response(self.state.message_payload(msg))

    async def edit_webhook_message(self, request: web.Request) -> web.Response:
        inter = self.state.interaction_for_webhook(request.match_info["app_id"], request.match_info["token"])
        msg = self.state.interaction_message(inter, request.match_info["message_id"])
        body, _ = await read_body(request)
        self.state.edit_interaction_message(inter, msg, require_dict(body))
        return json_response(self.state.message_payload(msg))

    async def delete_webhook_message(self, request: web.Request) -> web.Response:
        inter = self.state.interaction_for_webhook(request.match_info["app_id"], request.match_info["token"])
        msg = self.state.interaction_message(inter, request.match_info["message_id"])
        self.state.delete_message(msg)
        return no_content()
