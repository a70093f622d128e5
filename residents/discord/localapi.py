"""Point discord.py at a local Discord-compatible server instead of discord.com.

One place sets the two class attributes discord.py reads (REST base and gateway URL), so
nothing edits discord.py itself and the bot's start-up calls this only when configured.
"""

from __future__ import annotations

import logging

import discord
import yarl

log = logging.getLogger(__name__)


def point_at_local(api_url: str) -> None:
    """Send discord.py's REST calls and gateway connection to `api_url` (e.g. http://127.0.0.1:8765).

    Process-wide: every Client in this process talks to that server afterwards.
    """
    base = api_url.rstrip("/")
    url = yarl.URL(base)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"expected an http(s) base URL, got {api_url!r}")
    ws_scheme = "wss" if url.scheme == "https" else "ws"
    discord.http.Route.BASE = f"{base}/api/v10"
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = url.with_scheme(ws_scheme).with_path("/gateway/")
    log.info("discord.py now talks to %s", base)
