"""`residents demo`: the offline room a newcomer runs first, on the same code that runs in Discord."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path

from ..cli import EXTRA_VERBS, UsageError

log = logging.getLogger(__name__)


def _add(sub) -> None:
    d = sub.add_parser("demo", help="the local room with scripted residents and a web view (no token, no network)")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=8765, help="the room's port (0: any free port)")
    d.add_argument("--headless", action="store_true", help="play the demo script, print the transcript, exit")
    d.add_argument("--provider", choices=["scripted", "anthropic"], default="scripted",
                   help="anthropic: the real API with ANTHROPIC_API_KEY")
    d.add_argument("--model", help="with --provider anthropic: the model every demo resident uses")
    d.add_argument("--db", help="the ledger (default: a new file under data/)")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from ..discord.run import StartupError
    from .run import main_async
    if args.provider == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
        raise UsageError("--provider anthropic needs ANTHROPIC_API_KEY in the environment")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        raise UsageError(f"--host {args.host}: the demo serves on loopback only")
    db = args.db or str(Path("data") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}.db")
    try:
        return asyncio.run(main_async(db, args.host, args.port, args.headless, args.provider, args.model))
    except OSError as e:
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {e.strerror or e}") from None
    except StartupError as e:  # e.g. --provider anthropic with a key the API refuses
        raise UsageError(str(e)) from None
    except KeyboardInterrupt:
        return 0


EXTRA_VERBS["demo"] = _add
