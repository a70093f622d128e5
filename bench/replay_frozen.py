"""`residents` with gc.freeze() once its modules are imported: an experiment for the process benchmark.

CPython's full collections walk every tracked object, and the objects made by importing the SDK,
pydantic and the bot are most of them; freezing them leaves the collector only the run's own
objects. Run as `python -m bench.replay_frozen replay SCENARIO --json`.
"""

from __future__ import annotations

import gc
import sys

import bot.cli
import bot.generation.attempts  # noqa: F401  (the SDK, pydantic and aiohttp come with these)
import bot.replay.run  # noqa: F401

if __name__ == "__main__":
    gc.freeze()
    sys.exit(bot.cli.main(sys.argv[1:]))
