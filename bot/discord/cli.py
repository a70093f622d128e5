"""The Discord verbs, registered with the CLI: `residents run` and `residents room`."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

from ..cli import DEFAULT_DB, EXTRA_VERBS, UsageError

log = logging.getLogger(__name__)


def _add(sub) -> None:
    r = sub.add_parser("run", help="run every residence with Discord settings, each as its own bot")
    r.add_argument("--discord-api", metavar="URL", help="a Discord-compatible API to use instead of discord.com "
                                                        "(e.g. the local room: http://127.0.0.1:8765)")
    r.add_argument("--db", default=DEFAULT_DB, help=f"the SQLite ledger (default {DEFAULT_DB})")
    r.set_defaults(func=cmd_run)
    room = sub.add_parser("room", help="serve a local Discord-compatible room (no token, no network)")
    room.add_argument("--host", default="127.0.0.1")
    room.add_argument("--port", type=int, default=8765)
    room.add_argument("--channel", action="append", dest="channels", help="a text channel (repeatable; default: "
                                                                          "the channels residences name, or general)")
    room.add_argument("--layout", metavar="LAYOUT.yaml", help="several guilds with channels, roles, members and "
                                                              "permission overwrites (a file, or a bundled layout "
                                                              "by name: two-guilds)")
    room.set_defaults(func=cmd_room)


def cmd_run(args: argparse.Namespace) -> int:
    from .run import StartupError, main
    try:
        return main(Path.cwd(), args.db, args.discord_api)
    except StartupError as e:
        raise UsageError(str(e)) from None


def room_channels(base: Path) -> list[str]:
    from ..config import ConfigError, load_all_residences
    try:
        names = [c.rpartition("/")[2] for r in load_all_residences(base) if r.discord for c in r.discord.channels
                 if not c.isdigit()]
    except ConfigError:
        names = []
    return list(dict.fromkeys(names)) or ["general"]


def cmd_room(args: argparse.Namespace) -> int:
    from ..localservers.room import LayoutError, RoomServer, load_layout
    from ..localservers.room.server import serve
    layout = None
    if args.layout:
        if args.channels:
            raise UsageError("--channel and --layout: a layout names its guilds' channels itself")
        try:
            layout = load_layout(args.layout)
        except LayoutError as e:
            raise UsageError(str(e)) from None

    def announce(server: RoomServer) -> None:
        where = "; ".join(f"{g.name}: {', '.join(c.name for c in g.channels.values())}"
                          for g in server.state.guilds.values())
        print(f"local room on {server.url} ({where}); bots: residents run --discord-api {server.url}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.channels or room_channels(Path.cwd()), layout=layout,
                          announce=announce))
    return 0


EXTRA_VERBS["discord"] = _add
