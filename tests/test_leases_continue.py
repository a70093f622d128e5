"""/continue on several `residents run` processes sharing one PostgreSQL ledger: the commands bot runs in one,
a resident's bot perhaps in another, and the request is carried there (`residents.discord.forward`).

The same rig as `test_leases.py` (two real processes, a real PostgreSQL server, the local room, the local
provider): a carried /continue posts as the resident's own bot and is answered as a local one is; a double
request continues once; a request nobody takes in time is told to the moderator and never runs later.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from residents import truth
from residents.discord import forward
from residents.localservers import sse
from residents.localservers.provider import Call, Responder

try:
    import pgkit
    from test_leases import MODEL, Rig, rig
except ImportError:  # tests/ collected as a package
    from tests import pgkit
    from tests.test_leases import MODEL, Rig, rig

# /continue for a resident whose bot the other process drives: carried there (`discord.forward`).
ON_REQUEST = (
    "continuation:\n  standing: on-request\n  max_segments: 3\n  max_output_tokens: 100000\n"
    "  min_progress_chars: 16\n  similarity_abort: 0.92\n"
)
CUT = (
    "The tide tables for the week, harbour by harbour, start with the outer mole where the",
    " pilots board at first light and the channel runs deep along the eastern wall of the quay",
    " until the bell buoy, where the bar shoals at low water and small boats wait for the flood",
    " while the gulls work the shallows and the ferry turns wide of the sandbank off the point",
)


def cut_each_time() -> Responder:
    """Every call cut at the output ceiling, each with new words: the reply, then each continuation of it."""
    calls = iter(CUT)

    def respond(body: dict[str, Any]) -> Call:
        return Call(sse=sse.stream(next(calls), "max_tokens", 1024, model=MODEL))

    return respond


async def cut_reply_of_sill(r: Rig) -> str:
    """Both processes running, one driving cairn (and the commands bot), the other sill; sill's reply to a
    mention is cut at the ceiling and in the room with its receipt: its generation's id."""
    for p in r.procs:
        await p.start()
    await r.until(lambda: len(set(r.holders().values())) == 2 and len(r.sessions()) == 2)
    await r.until(lambda: any(c.name == "continue" for c in r.room.state.commands.values()))  # synced
    r.room.post("general", "alice", "Tide times, @sill", mentions=["sill"])
    await r.until(
        lambda: (
            r.rows("SELECT status FROM generations WHERE residence = 'sill'") == [("truncated",)]
            and r.rows("SELECT count(*) FROM posts WHERE message_id IS NULL") == [(0,)]
            and any(m["components"] for m in r.by("sill"))
        )
    )
    [(gid,)] = r.rows("SELECT id FROM generations WHERE residence = 'sill'")
    return str(gid)


async def continue_(r: Rig, gid: str, timeout: float = 30.0) -> str:
    """A moderator's /continue of `gid`, answered by the commands bot (cairn's): what the moderator read."""
    out = await r.room.invoke_command(
        "general", "moddy", "continue", options=[{"name": "generation", "value": gid}], moderator=True, timeout=timeout
    )
    assert out["bot"] == "cairn" and not out["timed_out"], out
    assert out["responses"][0]["type"] == 5 and all(m["ephemeral"] for m in out["responses"]), out  # deferred
    [said] = [m["content"] for m in out["responses"][1:]]
    return str(said)


def segments(r: Rig, gid: str) -> int:
    [(n,)] = r.rows("SELECT count(*) FROM segments WHERE generation_id = $1", gid)
    return int(n)


async def test_continue_for_a_resident_driven_by_another_process_is_carried_there_and_a_double_runs_once(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    """The commands bot runs in one process, sill's bot in the other: /continue is carried to that one, which
    continues sill (its bot posts the segment, the receipt it continued from loses its button) and answers
    as a local /continue does. Two at once for one generation continue it once; the other is declined."""
    async with rig(tmp_path, pg_server, ("cairn", "sill"), responder=cut_each_time(), policy=ON_REQUEST) as r:
        gid = await cut_reply_of_sill(r)
        [first_receipt] = [m for m in r.by("sill") if m["components"]]
        said = await continue_(r, gid)
        assert said == f"Continued {gid}: now truncated, 2 segment(s), continuation disabled.", r.output()
        assert segments(r, gid) == 2 and len(r.provider.requests) == 2
        assert any(CUT[1].strip() in m["content"] for m in r.by("sill")), r.output()  # posted as sill
        by_id = {m["id"]: m for m in r.by("sill")}
        assert by_id[first_receipt["id"]]["components"] == []  # the receipt it continued from: no button
        [cairns] = [p for p in r.procs if r.holders()["cairn"] == r.pid(p)]
        [sills] = [p for p in r.procs if r.holders()["sill"] == r.pid(p)]
        assert "carried here" in sills.output() and "carried here" not in cairns.output()
        [(taker,)] = r.rows("SELECT p.pid FROM continue_requests r JOIN processes p ON p.id = r.taken_by")
        assert taker == r.pid(sills)

        # A double /continue while one is pending: one continuation, the other declined to the moderator.
        both = await asyncio.gather(continue_(r, gid), continue_(r, gid))
        assert sorted(both) == [
            f"Continued {gid}: now truncated, 3 segment(s), continuation disabled.",
            f"Not continued: generation {gid} was continued meanwhile; it has 3 segments now.",
        ], r.output()
        assert segments(r, gid) == 3 and len(r.provider.requests) == 3
        assert r.rows("SELECT count(*) FROM continue_requests WHERE answer IS NOT NULL") == [(3,)]

        missing = await r.room.invoke_command(
            "general", "moddy", "continue", options=[{"name": "generation", "value": "g-none"}], moderator=True
        )
        assert [m["content"] for m in missing["responses"]] == ["No generation g-none of a resident here."]


async def test_continue_nobody_takes_in_time_is_told_and_never_runs_later(
    tmp_path: Path, pg_server: pgkit.Server
) -> None:
    """sill's holder frozen (its lease long, so nobody takes its bot over meanwhile): the moderator is told no
    process took the /continue, and once thawed the holder does not run it (it was withdrawn)."""
    lease = ("--lease-seconds", "30", "--renew-seconds", "1", "--log-level", "info")
    async with rig(
        tmp_path, pg_server, ("cairn", "sill"), responder=cut_each_time(), policy=ON_REQUEST, lease=lease
    ) as r:
        gid = await cut_reply_of_sill(r)
        [holder] = [p for p in r.procs if r.holders()["sill"] == r.pid(p)]
        assert holder.proc is not None
        room_before = r.by("sill")
        holder.proc.send_signal(signal.SIGSTOP)
        try:
            said = await continue_(r, gid)
        finally:
            holder.proc.send_signal(signal.SIGCONT)
        assert said == truth.continue_not_taken("sill", gid, forward.TAKE_WAIT), r.output()
        [(rid, taken, withdrawn)] = r.rows("SELECT id, taken_by, given_up_at IS NOT NULL FROM continue_requests")
        assert (taken, withdrawn) == (None, True)
        # Thawed, the holder hears the request it missed, finds it withdrawn, and leaves it.
        await r.until(lambda: f"/continue request {rid} is no longer to take" in holder.output())
        [(resumed_at,)] = r.rows("SELECT extract(epoch from clock_timestamp())")
        await r.until(  # and renews (looking for requests it missed each time) twice more
            lambda: r.rows("SELECT heartbeat_at FROM processes WHERE pid = $1", r.pid(holder))[0][0] > resumed_at + 1  # type: ignore[operator]
        )
        assert segments(r, gid) == 1 and len(r.provider.requests) == 1, r.output()
        assert r.rows("SELECT taken_by FROM continue_requests") == [(None,)]
        assert r.by("sill") == room_before
