"""The order of an attempt's writes: no streamed chunk lands after the attempt settled.

An attempt's chunks are written as it streams (`LedgerSink`), by the stream, by the sink's timer and
by a live view showing the reply; settling writes the attempt's whole content and removes its chunks.
A chunk written after that would outlive its attempt (`verify`: "settled (completed) but 1 streamed
chunk(s) left in attempt_chunks"), which every demo run left until the sink stopped writing at close.
"""

from __future__ import annotations

from residents.generation.attempts import LedgerSink
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.records import Attempt, Generation, Outcome, Status


async def test_a_flush_asked_for_after_the_sink_closed_lands_nothing_after_settlement(tmp_path) -> None:
    """The interleaving a live view made: text still pending when the stream ends, the sink closed and the
    attempt settled, then the view's step runs its flush. The settled attempt holds every character, and
    no chunk of it is left behind."""
    async with Ledger.open(tmp_path / "l.db") as ledger:
        g = Generation(id="g-order", residence="cairn", channel="general", model="m")
        a = Attempt(id="a-order", generation_id=g.id, segment=1, index=1)
        await ledger.start_attempt(a, g)
        sink = LedgerSink(ledger, a.id)
        sink.start(0, "text", "", None)
        sink.add("Shown live, ")
        await sink.flush()  # a write while streaming: one chunk on disk
        sink.add("and the tail the stream ended with.")  # pending when the stream ends

        await sink.close()  # the stream ended: run_segment closes the sink, then settles the attempt
        a.blocks = sink.blocks()
        a.text = "".join(b.content for b in a.blocks)
        a.outcome, a.stop_reason = Outcome.COMPLETED, "end_turn"
        g.status, g.stop_reason, g.text = Status.COMPLETED, "end_turn", a.text
        await ledger.finish_attempt(a)
        await sink.flush()  # the live view's step, resumed after settlement

        left = await ledger.db.execute_fetchall("SELECT count(*) FROM attempt_chunks WHERE attempt_id=$1", (a.id,))
        assert list(left)[0][0] == 0
        stored = await ledger.get_generation(g.id)
        assert stored is not None and stored.attempts[0].text == "Shown live, and the tail the stream ended with."
        assert [v for v in await verify(ledger) if a.id in v] == []
