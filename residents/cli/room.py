"""`residents room`: a local Discord-compatible room server for bots and people, offline."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import click

from ..config import ConfigError, load_all_residences
from .common import UsageError, cannot_serve, config_dir


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to serve on.")
@click.option("--port", type=int, default=8765, show_default=True, help="The port to serve on (0: any free port).")
@click.option(
    "--channel",
    "channels",
    multiple=True,
    metavar="NAME",
    help="A text channel (repeatable; default: the channels the configuration folder's residences name, or general).",
)
@click.option(
    "--layout",
    metavar="LAYOUT.yaml",
    help="Several guilds with channels, roles, members and permission overwrites "
    "(a file, or a bundled layout by name: two-guilds).",
)
def room(host: str, port: int, channels: tuple[str, ...], layout: str | None) -> int:
    """Serve a local Discord-compatible room (no token, no network).

    Bots log in to it with `residents run --discord-api URL`; people post through its web page.

    \b
    Example:
      residents room --port 8765 --channel general --channel dock
      residents room --layout two-guilds
    """
    from ..localservers.room import LayoutError, RoomServer, load_layout
    from ..localservers.room.server import serve

    built = None
    if layout:
        if channels:
            raise UsageError("--channel and --layout: a layout names its guilds' channels itself")
        try:
            built = load_layout(layout)
        except LayoutError as e:
            raise UsageError(str(e)) from None

    def announce(server: RoomServer) -> None:
        where = "; ".join(
            f"{g.name}: {', '.join(c.name for c in g.channels.values())}" for g in server.state.guilds.values()
        )
        print(f"local room on {server.url} ({where}); bots: residents run --discord-api {server.url}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        try:
            asyncio.run(
                serve(host, port, list(channels) or room_channels(config_dir()), layout=built, announce=announce)
            )
        except OSError as e:
            raise cannot_serve(host, port, e) from None
    return 0


def room_channels(base: Path) -> list[str]:
    """The channel names the residences under `base` listen in (ids left out, guild parts dropped), or `general`."""
    try:
        names = [
            c.rpartition("/")[2]
            for r in load_all_residences(base)
            if r.discord
            for c in r.discord.channels
            if not c.isdigit()
        ]
    except ConfigError:
        names = []
    return list(dict.fromkeys(names)) or ["general"]
