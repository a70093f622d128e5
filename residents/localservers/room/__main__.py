"""`python -m residents.localservers.room`: run a local Discord-compatible room until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from .layout import LayoutError, load_layout
from .server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m residents.localservers.room", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--channel", action="append", dest="channels", help="a text channel (repeatable; default: general)"
    )
    parser.add_argument("--guild-name", default="residents")
    parser.add_argument("--layout", help="a layout file (guilds, channels, roles, members, overwrites)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        layout = load_layout(args.layout) if args.layout else None
    except LayoutError as e:
        parser.exit(2, f"{e}\n")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.channels or ["general"], args.guild_name, layout))


if __name__ == "__main__":
    main()
