"""A handover between `residents run` processes on one PostgreSQL ledger is told, not waited for: a process
that joins gets its share as soon as it registers (the holder hears it, gives up its surplus and says so; the
joiner hears that and takes it), not a renewal or two later; and a mention that arrives while its bot is
changing hands is answered exactly once. The rig (real processes, server, room and provider) is
`test_leases.py`'s, with long renewals here, so that only the telling can make the handover prompt.
"""

from __future__ import annotations

import time
from pathlib import Path

try:
    import pgkit
    from test_leases import NAMES, mention, rig
except ImportError:  # tests/ collected as a package
    from tests import pgkit
    from tests.test_leases import NAMES, mention, rig

RENEW = 20.0  # seconds between renewals: a handover left to them would take at least this long
LONG = ("--lease-seconds", "60", "--renew-seconds", f"{RENEW:g}", "--log-level", "info")


async def test_a_joining_process_gets_its_share_at_once_and_a_mention_mid_handover_is_answered_once(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    async with rig(tmp_path, pg_server, NAMES, lease=LONG) as r:
        one, two = r.procs
        await one.start()
        everyone = sorted((n, None) for n in NAMES)
        await r.until(lambda: r.holders() == dict.fromkeys(NAMES, r.pid(one)) and sorted(r.sessions()) == everyone)
        await two.start()
        await r.until(lambda: r.rows("SELECT count(*) FROM processes WHERE stopped_at IS NULL") == [(2,)])
        joined = time.monotonic()
        # The two bots the first process gives up (the last of its units in order: `leases.tick`) are mentioned
        # as the second registers, so each mention comes while its bot changes hands (one person's two
        # mentions: the floor's limit of resident replies since a person spoke is not reached).
        moving = ("reed", "sill")
        for name in moving:
            r.room.post("general", "alice", f"Good morning, @{name}", mentions=[name])

        def shared() -> bool:
            held = list(r.holders().values())
            return len(held) == 4 and sorted(held.count(p) for p in (r.pid(one), r.pid(two))) == [2, 2]

        await r.until(lambda: shared() and sorted(r.sessions()) == everyone)
        assert time.monotonic() - joined < RENEW / 2, r.output()
        assert sorted(n for n, pid in r.holders().items() if pid == r.pid(two)) == list(moving)
        assert "another process shares the bots now" in one.output()
        await r.until(lambda: all(len(r.by(name)) == 1 for name in moving))
        for name in NAMES:
            await mention(r, name, "And now")
        # One reply to each mention, whichever process drove the bot when it came, and one turn each.
        replies = {name: len(r.by(name)) for name in NAMES}
        assert replies == {"cairn": 1, "moss": 1, "reed": 2, "sill": 2}, r.output()
        gens = r.rows("SELECT residence, count(*) FROM generations GROUP BY residence")
        assert sorted(gens) == sorted(replies.items())
        assert shared()
