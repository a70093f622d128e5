"""Every content block of every attempt (issue 11, items 1–4), through `residents replay --json`.

The scenarios replay recorded streams shaped like real Messages API streams (reasoning then text;
text, reasoning, text; text around a server tool; a ceiling reached inside the reasoning or inside
a tool call's input; a refusal with no content block; a block of an unknown type carrying text
deltas; an event whose data is not a JSON object) on the real path: the SDK over loopback, the
ledger, delivery planning. Each is checked in the JSON output, then in the ledger it left
(`ledger show`, `ledger verify`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from residents import cli
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer
from residents.provider import ListSink
from residents.provider.anthropic_messages import make_client, stream_once

ROOT = Path(__file__).resolve().parent.parent
SPECIMENS = ROOT / "scenarios" / "specimens"

_FIELD = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def streamed_blocks(name: str) -> list[tuple[int, str, str]]:
    """(index, type, content) of each block of a recorded stream, read straight from its bytes."""
    out: dict[int, list[Any]] = {}
    for event in (SPECIMENS / name).read_text().split("\n\n"):
        data = [line[6:] for line in event.splitlines() if line.startswith("data: ")]
        d = json.loads(data[0]) if data else None
        if not isinstance(d, dict):
            continue
        if d["type"] == "content_block_start":
            out[d["index"]] = [d["content_block"]["type"], ""]
        elif d["type"] == "content_block_delta" and _FIELD.get(d["delta"]["type"]):
            out[d["index"]][1] += d["delta"][_FIELD[d["delta"]["type"]]]
    return [(i, t, c) for i, (t, c) in out.items()]


@pytest.fixture
def work(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def replay(work: Path, capsys: pytest.CaptureFixture[str], scenario: str) -> tuple[dict[str, Any], str]:
    db = str(work / "ledger.db")
    assert cli.main(["replay", f"scenarios/{scenario}", "--json", "--db", db]) == 0
    result = json.loads(capsys.readouterr().out)
    assert cli.main(["ledger", "verify", "--db", db, "--strict"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    return result, db


def shown(capsys: pytest.CaptureFixture[str], db: str, gid: str) -> str:
    assert cli.main(["ledger", "show", gid, "--db", db]) == 0
    return capsys.readouterr().out


def kinds(turn: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["kind"], p["content"]) for p in turn["posts"]]


def test_reasoning_then_text_keeps_both_blocks_and_posts_only_the_text(work, capsys):
    result, db = replay(work, capsys, "thinking.yaml")
    (_, _, thinking), (_, _, text) = streamed_blocks("thinking-then-text.sse")
    turn = result["turns"][0]
    g = turn["generation"]
    (a,) = g["attempts"]
    assert [(b["index"], b["type"], b["chars"], b.get("text")) for b in a["blocks"]] == [
        (0, "thinking", len(thinking), thinking),
        (1, "text", len(text), text),
    ]
    assert a["blocks"][0]["extras"][0]["type"] == "signature_delta"  # the signature kept as given
    assert (g["status"], g["text"], a["text"]) == ("completed", text, text)
    assert kinds(turn) == [("speech", text)]
    assert thinking[:40] not in json.dumps(turn["posts"]) and result["stumps"] == []
    listing = shown(capsys, db, g["id"])
    assert f"#0 thinking {len(thinking)} chars · #1 text {len(text)} chars" in listing
    assert thinking[:40] not in listing  # provenance and the canonical text: never the reasoning


def test_two_text_blocks_are_joined_by_a_paragraph_break_with_their_spans(work, capsys):
    result, _ = replay(work, capsys, "thinking.yaml")
    first, second = "Two plus two. Let me check the arithmetic before finalizing.", "The answer is **4**."
    g = result["turns"][1]["generation"]
    assert g["text"] == first + "\n\n" + second  # never glued as "…finalizing.The answer…"
    blocks = g["attempts"][0]["blocks"]
    assert [b["type"] for b in blocks] == ["text", "thinking", "text"]
    for b in (blocks[0], blocks[2]):
        start, end = b["span"]
        assert g["text"][start:end] == b["text"]
    assert kinds(result["turns"][1]) == [("speech", g["text"])]


def test_text_around_a_server_tool_keeps_the_tool_blocks_and_posts_the_two_texts(work, capsys):
    result, _ = replay(work, capsys, "thinking.yaml")
    expect = streamed_blocks("text-around-server-tool.sse")
    g = result["turns"][2]["generation"]
    blocks = g["attempts"][0]["blocks"]
    assert [b["type"] for b in blocks] == ["text", "server_tool_use", "web_search_tool_result", "text"]
    assert blocks[1]["input_json"] == expect[1][2] == '{"query": "harbour tide times today"}'  # as streamed
    assert blocks[1]["start"]["name"] == "web_search"
    assert json.loads(blocks[2]["content"])[0]["url"] == "https://tides.example.org/harbour"
    assert blocks[3]["extras"][0]["type"] == "citations_delta"
    assert g["text"] == expect[0][2] + "\n\n" + expect[3][2]
    assert kinds(result["turns"][2]) == [("speech", g["text"])]


def test_a_ceiling_inside_the_reasoning_posts_no_partial_and_keeps_the_reasoning_as_a_stump(work, capsys):
    result, db = replay(work, capsys, "thinking-cut.yaml")
    ((_, _, thinking),) = streamed_blocks("thinking-cut-1024.sse")
    turn = result["turns"][0]
    g = turn["generation"]
    assert (g["status"], g["stop_reason"], g["text"], g["output_tokens"]) == ("truncated", "max_tokens", "", 1024)
    assert [(b["type"], b["text"]) for b in g["attempts"][0]["blocks"]] == [("thinking", thinking)]
    assert kinds(turn) == [
        ("receipt", "-# Output ceiling reached at 1,024 tokens during reasoning; no reply text was generated.")
    ]
    (stump,) = result["stumps"]
    assert (stump["cause"], stump["text"], stump["published"], stump["scope"], stump["block"], stump["block_type"]) == (
        "max_tokens",
        thinking,
        False,
        "block",
        0,
        "thinking",
    )
    assert "max_tokens" in shown(capsys, db, g["id"]) and turn["provider_calls"] == 1


def test_a_ceiling_inside_a_tool_input_keeps_the_partial_json_as_a_stump(work, capsys):
    result, _ = replay(work, capsys, "tool-input-cut.yaml")
    (_, _, text), (_, _, partial_json) = streamed_blocks("tool-input-cut.sse")
    turn = result["turns"][0]
    g = turn["generation"]
    assert (g["status"], g["text"]) == ("truncated", text)
    assert g["attempts"][0]["blocks"][1]["input_json"] == partial_json
    assert partial_json.endswith('"from": "2025-06-0')  # cut mid-value: kept exactly as streamed
    assert kinds(turn) == [
        ("partial", text),
        ("receipt", "-# Output ceiling reached at 256 tokens; the remainder was not generated."),
    ]
    assert [(s["scope"], s["cause"], s["text"], s["published"]) for s in result["stumps"]] == [
        ("output", "max_tokens", text, True),
        ("block", "max_tokens", partial_json, False),
    ]


def test_a_refusal_with_no_content_says_no_text_was_generated(work, capsys):
    result, _ = replay(work, capsys, "refusal-empty.yaml")
    turn = result["turns"][0]
    g = turn["generation"]
    assert (g["status"], g["text"], g["attempts"][0]["blocks"]) == ("refused", "", [])
    assert kinds(turn) == [("notice", "-# Provider declined this reply (stop reason: refusal); no text was generated.")]
    assert result["stumps"] == []  # no stump is claimed, because none exists


def test_text_deltas_of_an_unknown_block_type_are_kept_as_that_block_and_never_posted(work, capsys):
    result, _ = replay(work, capsys, "unknown-block.yaml")
    (_, _, hidden), (_, _, text) = streamed_blocks("unknown-block-with-text.sse")
    turn = result["turns"][0]
    g = turn["generation"]
    unknown, known = g["attempts"][0]["blocks"]
    assert (unknown["type"], unknown["content"], known["type"], known["text"]) == ("scratchpad", hidden, "text", text)
    assert "text" not in unknown  # not text: content of its own declared type
    assert (g["status"], g["text"]) == ("completed", text)
    assert kinds(turn) == [("speech", text)]
    assert hidden not in json.dumps(turn["posts"])


def test_an_event_whose_data_is_not_an_object_is_a_malformed_stream_retried(work, capsys):
    result, _ = replay(work, capsys, "malformed-event.yaml")
    turn = result["turns"][0]
    g = turn["generation"]
    first, second = g["attempts"]
    assert (first["outcome"], first["error"], first["text"]) == ("abandoned", "malformed-stream", "The tide turns at ")
    assert second["outcome"] == "completed" and g["status"] == "completed" and turn["provider_calls"] == 2
    assert [(s["cause"], s["text"]) for s in result["stumps"]] == [("retry-abandoned", "The tide turns at ")]
    assert [p["kind"] for p in turn["posts"]] == ["speech"]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def test_each_block_keeps_its_content_as_given_over_the_real_sdk():
    """Redacted reasoning keeps its data; a text block may begin in its start event; a delta of a type
    not known here is kept as given beside its block; a tool call keeps its start and its input as
    streamed; a stop with no content block at all gives an attempt with none."""

    def delta(i: int, d: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})

    def start(i: int, block: dict[str, Any]) -> bytes:
        return _event("content_block_start", {"type": "content_block_start", "index": i, "content_block": block})

    raw = (
        _event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_blocks",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 9, "output_tokens": 1},
                },
            },
        )
        + start(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw=="})
        + start(1, {"type": "text", "text": "Begun in the start. "})
        + delta(1, {"type": "text_delta", "text": "Then a delta."})
        + delta(1, {"type": "future_delta", "payload": {"x": 1}})
        + start(2, {"type": "tool_use", "id": "toolu_01", "name": "tides", "input": {}})
        + delta(2, {"type": "input_json_delta", "partial_json": '{"port": '})
        + delta(2, {"type": "input_json_delta", "partial_json": '"harbour"}'})
        + sse.tail("tool_use", 40)
    )
    server = ProviderServer()
    await server.start()
    client = make_client(server.url, "test-key", timeout=5)
    try:
        server.reset([Call(sse=raw)])
        sink = ListSink()
        end = await stream_once(
            client,
            {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Tides?"}]},
            sink,
        )
    finally:
        await client.close()
        await server.stop()
    assert end.failure is None and end.stop_reason == "tool_use"
    blocks = sink.blocks()
    assert [(b.index, b.type, b.content) for b in blocks] == [
        (0, "redacted_thinking", "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw=="),
        (1, "text", "Begun in the start. Then a delta."),
        (2, "tool_use", '{"port": "harbour"}'),
    ]
    assert blocks[1].extras == [{"type": "future_delta", "payload": {"x": 1}}]
    assert blocks[2].start == {"id": "toolu_01", "name": "tides", "input": {}}
    assert blocks[0].start is None and blocks[1].start is None  # nothing but their type and content
    assert sink.text() == "Begun in the start. Then a delta." and blocks[1].offset == 0


async def _stream(raw: bytes) -> tuple[Any, ListSink]:
    """`raw` served by the local provider, read by `stream_once` through the real SDK."""
    server = ProviderServer()
    await server.start()
    client = make_client(server.url, "test-key", timeout=5)
    try:
        server.reset([Call(sse=raw)])
        sink = ListSink()
        end = await stream_once(
            client,
            {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Tides?"}]},
            sink,
        )
    finally:
        await client.close()
        await server.stop()
    return end, sink


def _data_only(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def test_events_with_no_event_line_are_read_by_their_datas_type():
    """An SSE event may leave out its `event:` line; its data's `type` still says what it is. Its text
    is kept in order (the SDK's typed stream drops such an event, text and all), a ping is skipped, and
    a stop reason and token figure said that way are the provider's."""
    raw = (
        sse.head("claude-sonnet-4-5")
        + sse.delta("The tide ")
        + _data_only(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "turns at noon"}}
        )
        + _data_only({"type": "ping"})
        + sse.delta(", twice.")
        + _data_only({"type": "content_block_stop", "index": 0})
        + _data_only({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}})
        + _data_only({"type": "message_stop"})
    )
    end, sink = await _stream(raw)
    assert end.failure is None and (end.stop_reason, end.output_tokens) == ("end_turn", 7)
    assert sink.text() == "The tide turns at noon, twice."


async def test_stop_details_and_token_figures_are_kept_as_the_provider_sent_them():
    """The ledger's stop details are the provider's JSON, with no keys a client library would add;
    a token figure that is not an integer is no figure (null), never coerced."""
    details = {"type": "refusal", "category": "cyber"}
    end, _ = await _stream(sse.head("claude-sonnet-4-5") + sse.tail("refusal", 3, details))
    assert end.stop_details == details
    tail = sse.event(
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": "5"}},
    )
    end, _ = await _stream(sse.head("claude-sonnet-4-5") + tail + sse.event("message_stop", {"type": "message_stop"}))
    assert end.failure is None and end.stop_reason == "end_turn" and end.output_tokens is None
