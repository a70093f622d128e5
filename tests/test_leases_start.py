"""Several `residents run` processes starting at once on one PostgreSQL ledger: two racing for one bot leave
exactly one driving it, and a sharded bot's four shards spread over two processes, answering in guilds of
every shard. The rig (real processes, server, room and provider) is `test_leases.py`'s.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from residents.ledger import Ledger
from residents.localservers.room.layout import parse_layout

try:
    import pgkit
    from test_leases import mention, rig
except ImportError:  # tests/ collected as a package
    from tests import pgkit
    from tests.test_leases import mention, rig


async def test_two_processes_racing_for_one_bot_at_start_leave_exactly_one_driving_it(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    async with rig(tmp_path, pg_server, ("cairn",)) as r:
        # A writer of another kind (a replay, a demo, a migration) holds the ledger alone: run is refused.
        async with Ledger.open(r.url):
            first = r.procs[0]
            await first.start()
            assert first.proc is not None and await asyncio.wait_for(first.proc.wait(), 60) == 2
            assert f"in use by process {os.getpid()} on " in first.output()
        await asyncio.gather(*(p.start() for p in r.procs))
        await r.until(lambda: len(r.holders()) == 1 and r.sessions() == [("cairn", None)])
        # Both have renewed a few times since: still one holder, one session, and only one bot ever connected.
        await r.until(
            lambda: all(
                beat - started >= 3
                for started, beat in r.rows("SELECT started_at, heartbeat_at FROM processes")  # type: ignore[operator]
            )
        )
        assert len(r.holders()) == 1 and r.sessions() == [("cairn", None)]
        assert r.room.gateway.identifies == 1, r.output()
        await mention(r, "cairn", "Hello")
        assert len(r.by("cairn")) == 1


def sixteen_guilds() -> Any:
    return parse_layout(
        {"guilds": [{"name": f"g{i}", "channels": ["talk"]} for i in range(16)], "sharding": {"max_concurrency": 16}}
    )


async def test_one_resident_on_four_shards_spread_over_two_processes_answers_in_guilds_of_every_shard(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    async with rig(
        tmp_path, pg_server, ("cairn",), layout=sixteen_guilds(), channels="[]", shards="  shards: {count: 4}\n"
    ) as r:
        one, two = r.procs
        guilds = {g.name: (g.id >> 22) % 4 for g in r.room.state.guilds.values()}
        first = {s: next(name for name, shard in sorted(guilds.items()) if shard == s) for s in range(4)}
        await one.start()
        await two.start()
        pids = {r.pid(one), r.pid(two)}

        def spread() -> bool:
            held = r.holders()
            return (
                sorted(held) == [f"cairn#{s}" for s in range(4)]
                and sorted(list(held.values()).count(p) for p in pids) == [2, 2]
                and sorted(r.sessions()) == [("cairn", s) for s in range(4)]
            )

        await r.until(spread)
        for shard, guild in first.items():
            await mention(r, "cairn", f"ask-{guild}", channel=f"{guild}/talk")
            assert len(r.by("cairn", f"{guild}/talk")) == 1, shard
