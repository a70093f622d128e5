"""Discord's REST API under /api/v10: the routes discord.py 2.7 calls for a resident, with Discord's errors."""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from . import payloads
from .faults import FaultPlan
from .interactions import Interactions
from .jsonhttp import json_response, no_content, query_int, read_body, require_dict, truthy
from .model import ApiError, Channel, User
from .state import RoomState

log = logging.getLogger(__name__)

API = "/api/v10"


class DiscordRest:
    def __init__(self, state: RoomState, desk: Interactions, faults: FaultPlan, gateway_url: Callable[[], str]) -> None:
        self.state = state
        self.desk = desk
        self.faults = faults
        self.gateway_url = gateway_url

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(f"{API}/users/@me", self.me)
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
        r.add_put(f"{API}/applications/{{app_id}}/commands", self.overwrite_commands)
        r.add_put(f"{API}/applications/{{app_id}}/guilds/{{guild_id}}/commands", self.overwrite_commands)
        r.add_post(f"{API}/interactions/{{interaction_id}}/{{token}}/callback", self.interaction_callback)
        r.add_post(f"{API}/webhooks/{{app_id}}/{{token}}", self.followup)
        r.add_patch(f"{API}/webhooks/{{app_id}}/{{token}}/messages/{{message_id}}", self.edit_webhook_message)
        r.add_route("*", f"{API}/{{tail:.*}}", self.not_implemented)

    # ----- helpers -------------------------------------------------------------------------

    def auth(self, request: web.Request) -> User:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bot "):
            raise ApiError(401, 0, "401: Unauthorized")
        return self.state.bot_for_token(header[len("Bot ") :])

    def channel(self, request: web.Request, bot: User) -> Channel:
        return self.state.visible_channel(bot, request.match_info["channel_id"])

    async def not_implemented(self, request: web.Request) -> web.Response:
        log.warning("local room has no route for %s %s", request.method, request.path)
        return json_response({"message": "404: Not Found", "code": 0}, status=404)

    # ----- users, application, gateway -------------------------------------------------------

    async def me(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        return json_response(
            {**payloads.user(bot), "verified": True, "mfa_enabled": False, "email": None, "flags": 0, "locale": "en-US"}
        )

    async def application(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        return json_response(
            {
                "id": str(bot.application_id),
                "name": bot.name,
                "icon": None,
                "description": "",
                "bot_public": False,
                "bot_require_code_grant": False,
                "verify_key": "0" * 64,
                "owner": {
                    "id": str(self.state.owner_id),
                    "username": "room-owner",
                    "global_name": None,
                    "discriminator": "0",
                    "avatar": None,
                    "public_flags": 0,
                },
                "team": None,
                "flags": 1 << 18 | 1 << 14 | 1 << 12,
                "bot": payloads.user(bot),
                "summary": "",
                "approximate_guild_count": len(self.state.guilds),
                "interactions_endpoint_url": None,
                "redirect_uris": [],
                "tags": [],
                "integration_types_config": {"0": {}},
            }
        )

    async def gateway(self, request: web.Request) -> web.Response:
        return json_response({"url": self.gateway_url()})

    async def gateway_bot(self, request: web.Request) -> web.Response:
        """Discord's `GET /gateway/bot`: the URL, the shard count it recommends for the bot's guilds (the
        room's `sharding.guilds_per_shard`; what `discord.shards: auto` runs), and session start limits
        (`max_concurrency`: IDENTIFYs per 5 seconds)."""
        bot = self.auth(request)
        rules = self.state.layout.sharding
        guilds = sum(1 for g in self.state.guilds.values() if bot.id in g.members)
        limits = {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": rules.max_concurrency}
        return json_response(
            {"url": self.gateway_url(), "shards": rules.recommended(guilds), "session_start_limit": limits}
        )

    # ----- channels and messages -------------------------------------------------------------

    async def get_channel(self, request: web.Request) -> web.Response:
        return json_response(payloads.channel(self.channel(request, self.auth(request))))

    async def list_messages(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msgs = self.state.history(
            self.channel(request, bot),
            limit=query_int(request, "limit", 50) or 50,
            before=query_int(request, "before"),
            after=query_int(request, "after"),
        )
        return json_response([payloads.visible(m, bot) for m in msgs])

    async def create_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        channel = self.channel(request, bot)
        if not self.state.permissions(bot, channel).send_messages:
            raise ApiError(403, 50013, "Missing Permissions")
        body, files = await read_body(request)
        fault = self.faults.check()
        if fault is not None and not fault.after_create:
            return await self.faults.respond(fault)
        msg = self.state.create_message(channel, bot, require_dict(body), attachments=files)
        if fault is not None:
            return await self.faults.respond(fault)
        return json_response(payloads.message(msg))

    async def get_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msg = self.state.message(self.channel(request, bot), request.match_info["message_id"])
        return json_response(payloads.visible(msg, bot))

    async def edit_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msg = self.state.message(self.channel(request, bot), request.match_info["message_id"])
        body, _ = await read_body(request)
        self.state.edit_message(msg, require_dict(body), editor=bot)
        return json_response(payloads.message(msg))

    async def delete_message(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        msg = self.state.message(self.channel(request, bot), request.match_info["message_id"])
        self.state.delete_message(msg, deleter=bot)
        return no_content()

    async def typing(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        self.state.typing(self.channel(request, bot), bot)
        return no_content()

    # ----- application commands -------------------------------------------------------------

    async def overwrite_commands(self, request: web.Request) -> web.Response:
        bot = self.auth(request)
        if request.match_info["app_id"] != str(bot.application_id):
            raise ApiError(403, 50001, "Missing Access")
        guild_id = (
            self.state.guild_by_id(request.match_info["guild_id"]).id if "guild_id" in request.match_info else None
        )
        body, _ = await read_body(request)
        cmds = self.state.overwrite_commands(bot, guild_id, body)
        log.info("bot %s synced %d %s command(s)", bot.name, len(cmds), "guild" if guild_id else "global")
        return json_response([payloads.command(c) for c in cmds])

    # ----- interactions and webhooks -------------------------------------------------------

    async def interaction_callback(self, request: web.Request) -> web.Response:
        inter = self.desk.for_callback(request.match_info["interaction_id"], request.match_info["token"])
        body, files = await read_body(request)
        result = self.desk.callback(inter, require_dict(body), files)
        if truthy(request.query.get("with_response")):
            return json_response(result)
        return no_content()

    async def followup(self, request: web.Request) -> web.Response:
        inter = self.desk.for_webhook(request.match_info["app_id"], request.match_info["token"])
        body, files = await read_body(request)
        msg = self.desk.followup(inter, require_dict(body), files)
        if truthy(request.query.get("wait")):
            return json_response(payloads.message(msg))
        return no_content()

    async def edit_webhook_message(self, request: web.Request) -> web.Response:
        inter = self.desk.for_webhook(request.match_info["app_id"], request.match_info["token"])
        msg = self.desk.message(inter, request.match_info["message_id"])
        body, _ = await read_body(request)
        self.desk.edit(inter, msg, require_dict(body))
        return json_response(payloads.message(msg))
