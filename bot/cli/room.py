"""`residents room`: a local Discord-compatible room server for bots and people, offline."""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import click

from ..config import ConfigError, load_all_residences
from .common import config_dir


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to serve on.")
@click.option("--port", type=int, default=8765, show_default=True, help="The port to serve on.")
@click.option("--channel", "channels", multiple=True, metavar="NAME",
              help="A text channel (repeatable; default: the channels the configuration folder's residences name, or general).")
def room(host: str, port: int, channels: tuple[str, ...]) -> int:
    """Serve a local Discord-compatible room (no token, no network).

    Bots log in to it with `residents run --discord-api URL`; people post through its web page.

    \b
    Example:
      residents room --port 8765 --channel general --channel dock
    """
    from ..localservers.room.server import serve
    names = list(channels) or room_channels(config_dir())
    print(f"local room on http://{host}:{port} (channels: {', '.join(names)}); "
          f"bots: residents run --discord-api http://{host}:{port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, port, names))
    return 0


def room_channels(base: Path) -> list[str]:
    """The channel names the residences under `base` listen in (ids left out), or `general`."""
    try:
        names = [c for r in load_all_residences(base) if r.discord for c in r.discord.channels if not c.isdigit()]
    except ConfigError:
        names = []
    return list(dict.fromkeys(names)) or ["general"]
