"""A `residents run` process cut off from its PostgreSQL ledger (every session the server had with it ended)
stops its bot as the lease runs out, saying so once, and the other process takes the bot over. The rig
(real processes, server, room and provider) is `test_leases.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import pgkit
    from test_leases import mention, rig
except ImportError:  # tests/ collected as a package
    from tests import pgkit
    from tests.test_leases import mention, rig


@pytest.fixture(scope="module")
def pg_server() -> Iterator[pgkit.Server]:
    with pgkit.server() as server:
        yield server


async def test_a_process_cut_off_from_the_database_stops_its_bot_and_the_other_takes_it_over(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    async with rig(tmp_path, pg_server, ("cairn",)) as r:
        cut, other = r.procs
        await cut.start()
        await r.until(lambda: r.holders() == {"cairn": r.pid(cut)} and r.sessions() == [("cairn", None)])
        await other.start()
        await r.until(lambda: len(r.rows("SELECT id FROM processes WHERE stopped_at IS NULL")) == 2)
        # Every session the process has with the server ends: it can renew nothing from here on.
        r.rows(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE $1",
            f"{r.pid(cut)} %",
        )
        await r.until(lambda: "leases: cairn stopped here: its lease ran out unrenewed" in cut.output())
        await r.until(lambda: r.holders() == {"cairn": r.pid(other)} and r.sessions() == [("cairn", None)])
        await mention(r, "cairn", "Anyone")
        assert len(r.by("cairn")) == 1
        assert cut.output().count("WARNING residents.discord.run: leases: renewal failed") == 1  # once, not every try
