"""What a resident keeps in memory after a reply (the figures themselves: `python -m bench.memory`).

Real parts: `run_bots` on the local room (discord.py over real sockets), the SDK against the local
provider, the ledger on disk; and the pipeline's own `LedgerSink` on a real stream.
"""

from __future__ import annotations

from pathlib import Path

from discordkit import deployed
from test_discord_e2e import res

from residents.generation.attempts import FLUSH_CHARS, LedgerSink
from residents.ledger import Ledger
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider.anthropic_messages import make_client, stream_once
from residents.records import Attempt, Generation, new_id

MODEL = "claude-3-opus-20240229"
LONG = "The harbour wall is old, and the tide comes in twice a day. " * 100  # ~6,000 characters


async def test_residents_keep_no_copy_of_the_messages_they_see(tmp_path: Path) -> None:
    """Two residents, one long reply posted in three messages: afterwards neither bot holds any message
    (discord.py's cache of 1,000 per bot kept every message each bot saw, other bots' long replies too)."""
    async with deployed(
        tmp_path, [res("cairn"), res("sill")], calls=[Call(sse=sse.stream(LONG, "end_turn", 1500))]
    ) as d:
        d.room.post("general", "alice", "Tell me about the harbour, @cairn", mentions=["cairn"])
        await d.room.wait_until(
            lambda: True if len([m for m in d.messages() if m["author"] == "cairn"]) >= 3 else None, timeout=20
        )
        await d.quiet(0.3)
        assert [len(b.cached_messages) for b in d.bots] == [0, 0]


async def test_a_long_stream_is_held_as_its_written_chunks_not_its_deltas(tmp_path: Path) -> None:
    """~6,000 characters in 12-character deltas: the sink holds what it wrote to the ledger as the two
    strings it wrote, not as ~340 delta strings (only the unwritten tail is kept as deltas), and the
    text is the same."""
    server = ProviderServer()
    await server.start()
    server.reset([Call(sse=sse.stream(LONG, "end_turn", 1500, model=MODEL))])
    client = make_client(server.url, "test-key")
    try:
        async with Ledger.open(tmp_path / "ledger.db") as ledger:
            g = Generation(id=new_id("g-"), residence="cairn", channel="c", model=MODEL)
            a = Attempt(id=new_id("a-"), generation_id=g.id, segment=0, index=1)
            await ledger.start_attempt(a, g)
            sink = LedgerSink(ledger, a.id)
            end = await stream_once(client, {"model": MODEL, "max_tokens": 2048, "messages": []}, sink)
            await sink.close()
            assert end.failure is None
            [block] = sink._open
            # Each write's deltas are held as the one string it wrote; only the unwritten tail is deltas.
            writes = len(LONG) // FLUSH_CHARS
            assert block.written == writes, f"{block.written} strings hold the {writes} writes' text"
            assert len(block.parts) - block.written <= FLUSH_CHARS // 12 + 1
            assert sink.text() == LONG
    finally:
        await client.close()
        await server.stop()


def test_a_room_of_claude_residents_never_loads_the_openai_sdk() -> None:
    """Importing the openai SDK costs a process about 30 MB, a quarter of the idle budget: `residents run`
    with only Anthropic residences, and a call through the provider registry, leave it out."""
    import subprocess
    import sys

    probe = (
        "import sys, asyncio, pathlib\n"
        f"REPO = pathlib.Path({str(Path(__file__).resolve().parents[1])!r})\n"
        "import residents.cli, residents.cli.run, residents.discord.run, residents.generation.attempts, residents.replay.run\n"
        "from residents.provider import ListSink, connect_all\n"
        "from residents.config import load_all_residences\n"
        "env = {'ANTHROPIC_BASE_URL': 'http://127.0.0.1:9', 'ANTHROPIC_API_KEY': 'k'}\n"
        "found = residents.discord.run.provider_endpoints(load_all_residences(REPO), env)\n"
        "providers = connect_all((name, kind, where) for name, (kind, where) in found.items())\n"
        "p = next(iter(providers.values()))\n"
        "asyncio.run(p.stream({'model': 'm', 'max_tokens': 1, 'messages': []}, ListSink(), timeout=0.5))\n"
        "print('openai' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
