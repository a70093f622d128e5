"""A `residents run` process cut off from its PostgreSQL ledger (it reaches the server through a loopback
relay that closes its connections and refuses new ones: ending its sessions alone no longer cuts it off,
as it connects again) stops its bot as the lease runs out, saying so once, and the other process takes
the bot over. The rig (real processes, server, room and provider) is `test_leases.py`'s; the relay is
`test_ledger_reconnect.py`'s.
"""

from __future__ import annotations

from pathlib import Path

try:
    import pgkit
    from test_leases import mention, rig
    from test_ledger_reconnect import Relay, end_every_other_session, writer_lock_holders
except ImportError:  # tests/ collected as a package
    from tests import pgkit
    from tests.test_leases import mention, rig
    from tests.test_ledger_reconnect import Relay, end_every_other_session, writer_lock_holders


async def test_a_process_cut_off_from_the_database_stops_its_bot_and_the_other_takes_it_over(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    relay = Relay(pg_server.port)
    await relay.start()
    try:
        async with rig(tmp_path, pg_server, ("cairn",)) as r:
            r.procs[0].db = relay.url(r.url.rsplit("/", 1)[1])
            cut, other = await r.first_holds_cairn_then_second_joins()
            relay.cut()  # every connection it has ends, and it can make none: it can renew nothing from here on
            await r.until(lambda: "leases: cairn stopped here: its lease ran out unrenewed" in cut.output())
            await r.until(lambda: r.holders() == {"cairn": r.pid(other)} and r.sessions() == [("cairn", None)])
            await mention(r, "cairn", "Anyone")
            assert len(r.by("cairn")) == 1
            warned = cut.output().count("WARNING residents.discord.run: leases: renewal failed")
            assert warned == 1  # once, not every try
            relay.down = False  # the server is back for it: it stops as any process does
    finally:
        await relay.stop()


async def test_a_running_process_takes_its_writer_lock_again_after_a_restart_with_no_message(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    """A server restart ends every session, the one holding `residents run`'s shared writer lock among them.
    An idle process (no message, so no ledger write) takes it again with its next lease renewal, so a
    `ledger migrate` or `ledger copy --to` started then is refused rather than let in beside it."""
    async with rig(tmp_path, pg_server, ("cairn",), processes=1) as r:
        [proc] = r.procs
        await proc.start()
        await r.until(lambda: r.holders() == {"cairn": r.pid(proc)} and "cairn ready as cairn" in proc.output())
        before = writer_lock_holders(r.url)
        assert len(before) == 1
        end_every_other_session(r.url)  # its holder among them: whoever holds it after is a new session
        await r.until(lambda: len(writer_lock_holders(r.url) - before) == 1)
        await mention(r, "cairn", "Still there")
