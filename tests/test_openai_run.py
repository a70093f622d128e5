"""Both providers in one room, end to end: `run_bots` (as `residents run`) on the local room with real
discord.py bots; cairn speaks Anthropic Messages through the anthropic SDK, lumen (`provider:
openai-compatible`) speaks chat completions through the openai SDK to its own `base_url`, with its key
read from the variable its `api_key_env` names and checked once at start-up (`GET /models`)."""

from __future__ import annotations

import json

import pytest
from conftest import specimen
from discordkit import deployed
from test_discord_e2e import END_TEXT, res

from residents.config import Residence
from residents.discord.run import ProviderKeyRejected, StartupError
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.localservers.provider import Call, ProviderServer

HARBOUR_LEN = 270  # characters of scenarios/specimens/openai-length-1024.sse's text


def lumen(url: str) -> Residence:
    return res(
        "lumen",
        model="gpt-4o-mini",
        max_tokens=1024,
        provider="openai-compatible",
        base_url=url + "/v1",
        api_key_env="LUMEN_TEST_KEY",
    )


def chat_text(name: str) -> str:
    out = []
    for line in specimen(name).decode().splitlines():
        if line.startswith("data: {"):
            out += [c["delta"].get("content") or "" for c in json.loads(line[6:]).get("choices", [])]
    return "".join(out)


async def test_one_resident_of_each_provider_in_one_room(tmp_path):
    chat = ProviderServer(api_keys={"lumen-key"})
    await chat.start()
    try:
        chat.enqueue([Call(sse=specimen("openai-length-1024.sse"))])
        cast = [res("cairn"), lumen(chat.url)]
        async with deployed(
            tmp_path, cast, calls=[Call(sse=specimen("end-turn.sse"))], env={"LUMEN_TEST_KEY": "lumen-key"}
        ) as d:
            assert chat.model_requests == 1 and chat.rejected == 0  # the key checked once, before any bot connected
            d.room.post("general", "alice", "the harbour, @lumen?", mentions=["lumen"])
            partial, receipt = await d.wait_bot_messages(2, timeout=10)
            assert partial["author"] == "lumen" and partial["content"] == chat_text("openai-length-1024.sse")
            assert receipt["content"] == "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
            d.room.post("general", "bob", "and you, @cairn?", mentions=["cairn"])
            msgs = await d.wait_bot_messages(3, timeout=10)
            assert msgs[-1]["author"] == "cairn" and msgs[-1]["content"] == END_TEXT
            await d.quiet(0.1)
            [g] = await d.generations("lumen")
            assert (g.status, g.stop_reason, g.output_tokens, g.chars) == ("truncated", "length", 1024, HARBOUR_LEN)
            [h] = await d.generations("cairn")
            assert (h.status, h.stop_reason) == ("completed", "end_turn")
            [body] = chat.requests  # lumen's one call went to its own server, as chat completions
            assert body["model"] == "gpt-4o-mini" and body["stream_options"] == {"include_usage": True}
            assert len(d.provider.requests) == 1 and "messages" in d.provider.requests[0]  # cairn's, to Anthropic's
        ledger = await Ledger.open(tmp_path / "ledger.db")
        try:
            assert await verify(ledger, unsettled_as_violations=True) == []
        finally:
            await ledger.close()
    finally:
        await chat.stop()


async def test_a_refused_chat_key_stops_start_up_naming_its_variable(tmp_path):
    chat = ProviderServer(api_keys={"lumen-key"})
    await chat.start()
    try:
        with pytest.raises(StartupError) as info:
            async with deployed(tmp_path, [lumen(chat.url)], env={"LUMEN_TEST_KEY": "wrong"}):
                pass
        assert isinstance(info.value, ProviderKeyRejected)
        assert str(info.value).startswith("LUMEN_TEST_KEY: the provider at 127.0.0.1 refused this key (HTTP 401)")
        assert "wrong" not in str(info.value) and chat.requests == []
    finally:
        await chat.stop()
