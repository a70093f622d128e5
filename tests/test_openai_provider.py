"""`provider: openai-compatible`: the real `openai` SDK's streaming chat completions against the local
provider server's `/v1/chat/completions`, through `residents replay --json` (each run's ledger then
passes `ledger verify --strict`) and through one provider call at a time.

Every chat finish reason is held to the same truth rules as Anthropic's stop reasons: `stop` is
speech; `length` a partial and one receipt with the provider's own `completion_tokens` (or a receipt
that says none was reported); `content_filter` a refusal; `tool_calls` a round of the tool loop where
one exists; none at all incomplete. Errors, cut connections and stalls are attempts and stumps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from residents import cli, truth
from residents.config import ConfigError, build_residence
from residents.discord import startup
from residents.localservers.provider import Call, ProviderServer
from residents.provider import KeyRejected, ListSink
from residents.provider.openai_compatible import OpenAICompatibleProvider, make_openai_client, openai_stream_once

ROOT = Path(__file__).resolve().parent.parent
SPECIMENS = ROOT / "scenarios" / "specimens"
HARBOUR = (
    "The harbour wakes before the town does. Fishing boats slip their moorings in the blue hour, "
    "and the gulls follow them out past the breakwater where the swell begins. By noon the quay "
    "smells of diesel and salt, and the nets lie drying in long brown heaps along the stones"
)
RIVERS = (
    "Rivers carry rain from the hills to the sea, and every town along them grew up where a ford or a "
    "bridge could be made."
)
OPENAI_RES = {
    "name": "lumen",
    "model": "gpt-4o-mini",
    "max_tokens": 1024,
    "provider": "openai-compatible",
    "base_url": "https://api.openai.com/v1",
    "api_key_env": "OPENAI_API_KEY",
}


def chat_text(raw: bytes) -> str:
    """The `content` deltas a chat-completions stream carries, joined."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:]).get("choices", []):
                out.append(c["delta"].get("content") or "")
    return "".join(out)


@pytest.fixture
def work(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def replay(work: Path, capsys: pytest.CaptureFixture[str], scenario: str) -> dict[str, Any]:
    db = str(work / "ledger.db")
    assert cli.main(["replay", f"scenarios/{scenario}", "--json", "--db", db]) == 0
    result = json.loads(capsys.readouterr().out)
    assert cli.main(["ledger", "verify", "--db", db, "--strict"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    return result


def kinds(turn: dict[str, Any]) -> list[str]:
    return [p["kind"] for p in turn["posts"]]


def test_stop_is_speech_with_the_providers_own_count_through_the_openai_sdk(work, capsys):
    out = replay(work, capsys, "openai-stop.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["stop_reason"], g["text"], g["output_tokens"]) == ("completed", "stop", RIVERS, 31)
    assert kinds(turn) == ["speech"] and turn["posts"][0]["content"] == RIVERS and out["stumps"] == []
    [req] = turn["requests"]  # the body the local server got, as the openai SDK sent it
    assert req["stream"] is True and req["stream_options"] == {"include_usage": True}
    assert req["messages"][0] == {"role": "system", "content": "You are Lumen, a resident of this room."}
    assert req["messages"][-1]["role"] == "user" and req["max_tokens"] == 1024
    assert [t["function"]["name"] for t in req["tools"]] == ["stumps"] and req["tools"][0]["type"] == "function"


def test_length_is_a_partial_and_one_receipt_with_completion_tokens(work, capsys):
    out = replay(work, capsys, "openai-length.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["stop_reason"], g["output_tokens"], g["text"]) == ("truncated", "length", 1024, HARBOUR)
    assert kinds(turn) == ["partial", "receipt"] and turn["posts"][0]["content"] == HARBOUR
    assert turn["posts"][1]["content"] == "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
    assert g["continuation"] == {"standing": "none", "ended": "disabled"} and turn["provider_calls"] == 1
    [s] = out["stumps"]
    assert (s["cause"], s["chars"], s["published"], s["text"]) == ("length", len(HARBOUR), True, HARBOUR)


def test_length_without_usage_says_the_count_was_not_reported(work, capsys):
    out = replay(work, capsys, "openai-length-no-usage.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["output_tokens"], g["attempts"][0]["output_tokens"]) == ("truncated", None, None)
    assert kinds(turn) == ["partial", "receipt"]
    receipt = turn["posts"][1]["content"]
    assert receipt == (
        "-# Output ceiling reached (token count not reported by the provider); the remainder was not generated."
    )
    assert not any(ch.isdigit() for ch in receipt)  # never an estimate


def test_content_filter_is_a_refusal_never_posted_and_kept_as_a_stump(work, capsys):
    out = replay(work, capsys, "openai-content-filter.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["stop_reason"]) == ("refused", "content_filter")
    assert kinds(turn) == ["notice"]
    assert turn["posts"][0]["content"] == (
        "-# Provider declined this reply (stop reason: content_filter); its text is held as a stump."
    )
    [s] = out["stumps"]
    assert (s["cause"], s["published"], s["text"]) == ("content_filter", False, g["text"]) and g["text"]
    assert turn["resident_sees"] == [
        "[Boundary: the provider declined the previous reply (content_filter); its text was not posted.]"
    ]


def test_no_finish_reason_is_incomplete(work, capsys):
    out = replay(work, capsys, "openai-missing.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["stop_reason"], g["output_tokens"]) == ("incomplete", None, None)
    assert kinds(turn) == ["partial", "receipt"]
    assert "Provider stream ended without a stop reason" in turn["posts"][1]["content"]
    [s] = out["stumps"]
    assert s["cause"] == "no-stop-reason" and s["text"] == g["text"]


def test_an_error_object_mid_stream_is_an_abandoned_attempt_and_a_stump(work, capsys):
    out = replay(work, capsys, "openai-error.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    first, second = g["attempts"]
    assert (first["outcome"], first["error"], first["discard_reason"]) == (
        "abandoned",
        "server_error",
        "retry-abandoned",
    )
    assert first["text"] == chat_text((SPECIMENS / "openai-error-after-text.sse").read_bytes())
    assert (second["outcome"], g["status"], g["text"]) == ("completed", "completed", RIVERS)
    assert kinds(turn) == ["speech"] and first["text"] not in turn["posts"][0]["content"]
    [s] = out["stumps"]
    assert (s["cause"], s["published"], s["text"], s["attempt_id"]) == (
        "retry-abandoned",
        False,
        first["text"],
        first["id"],
    )
    assert turn["provider_calls"] == 2


def test_reasoning_content_is_a_thinking_block_never_posted(work, capsys):
    out = replay(work, capsys, "openai-reasoning.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    [a] = g["attempts"]
    thinking, text = a["blocks"]
    assert (thinking["index"], thinking["type"]) == (0, "thinking") and "moon" in thinking["text"]
    assert (text["index"], text["type"], text["text"]) == (1, "text", g["text"])
    assert g["status"] == "completed" and kinds(turn) == ["speech"]
    assert all(thinking["text"] not in p["content"] for p in turn["posts"])


def test_tool_calls_is_a_round_of_the_tool_loop(work, capsys):
    out = replay(work, capsys, "openai-tool-calls.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    [r] = g["tool_rounds"]
    assert (r["round"], r["name"], r["input"], r["is_error"], r["tool_use_id"]) == (
        1,
        "stumps",
        {"action": "list"},
        False,
        "call_local_1",
    )
    first = g["attempts"][0]
    assert (first["stop_reason"], [b["type"] for b in first["blocks"]]) == ("tool_calls", ["text", "tool_use"])
    assert g["status"] == "completed" and kinds(turn) == ["speech"] and turn["provider_calls"] == 2
    msgs = turn["requests"][1]["messages"]  # the call and its result go back as chat messages
    assert msgs[-2]["role"] == "assistant" and msgs[-2]["tool_calls"] == [
        {"id": "call_local_1", "type": "function", "function": {"name": "stumps", "arguments": '{"action": "list"}'}}
    ]
    assert msgs[-1]["role"] == "tool" and msgs[-1]["tool_call_id"] == "call_local_1"
    assert json.loads(msgs[-1]["content"]) == r["result"]


def test_tool_calls_without_a_tool_loop_is_incomplete(work, capsys):
    (work / "scenarios" / "no-tools.yaml").write_text(
        "residence:\n"
        + "".join(f"  {k}: {v}\n" for k, v in OPENAI_RES.items())
        + "  policy: {stumps: {patient_tool: false}}\n"
        "turns:\n"
        "  - say: {author: alice, content: hello}\n"
        "    calls: [{sse: specimens/openai-tool-list.sse}]\n"
    )
    out = replay(work, capsys, "no-tools.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["stop_reason"], g["tool_rounds"]) == ("incomplete", "tool_calls", [])
    assert "tools" not in turn["requests"][0] and turn["provider_calls"] == 1
    assert kinds(turn) == ["partial", "receipt"] and "unhandled reason (tool_calls)" in turn["posts"][1]["content"]


def test_continuation_uses_the_user_turn_method(work, capsys):
    out = replay(work, capsys, "openai-continuation.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    assert (g["status"], g["continuation"]["ended"], len(g["segments"])) == ("completed", "completed", 2)
    assert g["text"] == HARBOUR + ", waiting for the evening tide." and g["segments"][1]["overlap_removed"] > 0
    msgs = turn["requests"][1]["messages"]
    assert msgs[-2] == {"role": "assistant", "content": HARBOUR}  # the partial, once, never as a prefill
    assert msgs[-1]["role"] == "user" and "cut off by the output ceiling" in msgs[-1]["content"]
    assert sum(HARBOUR in json.dumps(m) for m in msgs) == 1 and "tools" not in turn["requests"][1]


# ------------------------------------------------------------------ one call through the SDK


async def call(server: ProviderServer, request: dict[str, Any], timeout: float | None = None):
    client = make_openai_client(server.url + "/v1", "local")
    sink = ListSink()
    try:
        end = await openai_stream_once(client, request, sink, timeout=timeout)
    finally:
        await client.close()
    return end, sink


REQ = {"model": "gpt-4o", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


async def served(chunks: list[dict[str, Any]]) -> tuple[Any, ListSink]:
    """One stream of these chat-completion chunks (then `[DONE]`) from the local provider, read through the SDK."""
    server = ProviderServer()
    await server.start()
    raw = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    try:
        server.enqueue([Call(sse=raw.encode())])
        return await call(server, REQ)
    finally:
        await server.stop()


async def test_http_errors_cut_connections_and_stalls_are_classified_failures():
    server = ProviderServer()
    await server.start()
    cut = (SPECIMENS / "openai-missing.sse").read_bytes()
    try:
        server.enqueue(
            [
                Call(status=429, headers={"retry-after": "7"}),
                Call(status=401),
                Call(status=503, body={"error": {"message": "down", "type": 5}}),
                Call(sse=cut, end="drop"),
                Call(sse=cut, end="stall", stall_seconds=3.0),
                Call(sse=b'data: {"choices": [{"index": 0, "delta": {"content": 7}}]}\n\n'),
                Call(sse=b"data: {not json\n\n"),
            ]
        )
        got = []
        for _ in range(7):
            end, sink = await call(server, REQ, timeout=0.5)
            assert end.failure is not None
            got.append((end.failure.kind, end.failure.retryable, end.failure.retry_after, sink.text()))
    finally:
        await server.stop()
    fragment = chat_text(cut)
    assert got == [
        ("rate_limit_exceeded", True, 7.0, ""),
        ("http-401", False, None, ""),  # the key refused, whatever type the body names
        ("http-503", True, None, ""),  # a body whose type is not a string names no kind
        ("connection-cut", True, None, fragment),
        ("read-timeout", True, None, fragment),
        ("malformed-stream", True, None, ""),
        ("malformed-stream", True, None, ""),
    ]
    assert truth.key_rejected("http-401")


async def test_the_request_is_translated_to_chat_messages_with_images_and_text_files():
    server = ProviderServer()
    await server.start()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    doc = {
        "type": "document",
        "title": "notes.txt",
        "source": {"type": "text", "media_type": "text/plain", "data": "hi"},
    }
    request = {
        "model": "gpt-4o",
        "max_tokens": 64,
        "system": "Be brief.",
        "temperature": 0.5,
        "stop_sequences": ["\n\nalice:"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look: "}, image, doc]},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Yes."}],
            },
            {"role": "user", "content": "and?"},
        ],
    }
    try:
        server.enqueue([Call(sse=(SPECIMENS / "openai-stop.sse").read_bytes())])
        end, sink = await call(server, request)
        [body] = server.requests
    finally:
        await server.stop()
    assert end.failure is None and end.stop_reason == "stop" and sink.text() == RIVERS
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look: "},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "notes.txt:\nhi"},
            ],
        },
        {"role": "assistant", "content": "Yes."},  # reasoning is never sent back
        {"role": "user", "content": "and?"},
    ]
    assert (body["temperature"], body["stop"], body["max_tokens"]) == (0.5, ["\n\nalice:"], 64)


async def test_a_refusal_field_is_the_provider_declining_kept_in_its_own_block():
    end, sink = await served(
        [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "refusal": "I can't help with that."}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        ]
    )
    assert (end.stop_reason, end.stop_details) == ("refusal", {"finish_reason": "stop"})
    [b] = sink.blocks()
    assert (b.type, b.content) == ("refusal", "I can't help with that.") and sink.text() == ""
    assert truth.outcome_of_stop(end.stop_reason) == "refused"


# ------------------------------------------------------------------ configuration and start-up


@pytest.mark.parametrize(
    "extra, key, words",
    [
        ({"api_key_env": None}, "api_key_env", "required with `provider: openai-compatible`"),
        ({"base_url": None}, "base_url", "required"),
        ({"api_key_env": "sk-proj-abcdef0123456789"}, "api_key_env", "never the key itself"),
        ({"base_url": "api.openai.com"}, "base_url", "not an http(s) URL"),
        ({"provider": "anthropic"}, "base_url", "only with `provider: openai-compatible`"),
        ({"provider": "openai"}, "provider", "openai-compatible"),
    ],
)
def test_provider_settings_are_validated_naming_the_key(extra, key, words):
    data = {k: v for k, v in {**OPENAI_RES, **extra}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        build_residence(data, "residences/lumen.yaml", None, ROOT)
    assert e.value.key == key and words in str(e.value), str(e.value)
    assert "abcdef0123456789" not in str(e.value)  # a key put where its variable's name belongs is never echoed


def test_run_names_a_missing_api_key_env_and_needs_no_anthropic_key_without_an_anthropic_residence():
    lumen = build_residence({**OPENAI_RES, "discord": {"token_env": "LUMEN_TOKEN"}}, "<t>", None, ROOT)
    assert startup.missing_variables([lumen], {"LUMEN_TOKEN": "t"}, local_api=False) == (
        "not set in the environment: OPENAI_API_KEY (residences/lumen.yaml: api_key_env)"
    )
    assert startup.missing_variables([lumen], {"LUMEN_TOKEN": "t", "OPENAI_API_KEY": "k"}, local_api=False) is None


async def test_the_start_up_key_check_asks_get_models_and_names_the_variable():
    server = ProviderServer(api_keys={"good"})
    await server.start()
    bad, good = make_openai_client(server.url + "/v1", "bad"), make_openai_client(server.url + "/v1", "good")
    try:
        with pytest.raises(KeyRejected) as info:
            await OpenAICompatibleProvider(bad, "LUMEN_KEY").check_key()
        assert str(info.value).startswith("LUMEN_KEY: the provider at 127.0.0.1 refused this key (HTTP 401)")
        await OpenAICompatibleProvider(good, "LUMEN_KEY").check_key()
        assert server.model_requests == 2
    finally:
        await bad.close()
        await good.close()
        await server.stop()


async def test_reasoning_is_read_from_either_field_once():
    """OpenRouter sends `reasoning`, vLLM `reasoning_content`; a server sending both sends the same text."""
    deltas = [
        {"reasoning": "Two ", "reasoning_content": ""},
        {"reasoning": "tides.", "reasoning_content": None},
        {"reasoning_content": " Moon.", "reasoning": " Moon."},
        {"content": "Twice a day."},
    ]
    chunks = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    end, sink = await served(chunks)
    thinking, text = sink.blocks()
    assert (thinking.type, thinking.content) == ("thinking", "Two tides. Moon.")
    assert (text.type, text.content, end.stop_reason, end.output_tokens) == ("text", "Twice a day.", "stop", None)


def _tool_delta(call: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


@pytest.mark.parametrize(
    "calls",
    [
        pytest.param(  # OpenAI: index on every delta, id and name on the first only
            [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "look", "arguments": ""}},
                {"index": 0, "function": {"arguments": '{"q":'}},
                {"index": 0, "function": {"arguments": "1}"}},
                {"index": 1, "id": "call_b", "type": "function", "function": {"name": "look", "arguments": '{"q":2}'}},
            ],
            id="openai",
        ),
        pytest.param(  # Gemini's compatible endpoint: no index at all; a new id is a new call
            [
                {"id": "call_a", "type": "function", "function": {"name": "look", "arguments": '{"q":'}},
                {"function": {"arguments": "1}"}},
                {"id": "call_b", "type": "function", "function": {"name": "look", "arguments": '{"q":2}'}},
            ],
            id="no-index",
        ),
        pytest.param(  # Ollama: every call at index 0, each with its own id
            [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "look", "arguments": '{"q":1}'}},
                {"index": 0, "id": "call_b", "type": "function", "function": {"name": "look", "arguments": '{"q":'}},
                {"index": 0, "id": "call_b", "function": {"arguments": "2}"}},
            ],
            id="index-reused",
        ),
    ],
)
async def test_each_tool_call_is_its_own_block_however_the_server_numbers_them(calls):
    """Two calls' arguments are never joined into one block (`{"q":1}{"q":2}` is no call at all)."""
    chunks = [_tool_delta(c) for c in calls]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    end, sink = await served(chunks)
    assert end.failure is None and end.stop_reason == "tool_calls"
    assert [(b.type, b.start, b.content) for b in sink.blocks()] == [
        ("tool_use", {"id": "call_a", "name": "look"}, '{"q":1}'),
        ("tool_use", {"id": "call_b", "name": "look"}, '{"q":2}'),
    ]


def test_tool_calls_ended_with_stop_are_a_round_of_the_tool_loop(work, capsys):
    """Gemini's compatible endpoint ends a reply that calls tools with `stop`, not `tool_calls`: the calls
    still run (a reply that says it will look and then never does is not a completed turn), and the
    finish_reason as given stays on record."""
    specimens = work / "scenarios" / "specimens"
    sse = (specimens / "openai-tool-list.sse").read_text()
    (specimens / "stop-tool-list.sse").write_text(
        sse.replace('"finish_reason": "tool_calls"', '"finish_reason": "stop"')
    )
    scenario = (work / "scenarios" / "openai-tool-calls.yaml").read_text()
    (work / "scenarios" / "stop-tools.yaml").write_text(scenario.replace("openai-tool-list.sse", "stop-tool-list.sse"))
    out = replay(work, capsys, "stop-tools.yaml")
    [turn] = out["turns"]
    g = turn["generation"]
    first = g["attempts"][0]
    assert (first["stop_reason"], first["stop_details"]) == ("tool_calls", {"finish_reason": "stop"})
    assert [r["name"] for r in g["tool_rounds"]] == ["stumps"] and turn["provider_calls"] == 2
    assert g["status"] == "completed" and kinds(turn) == ["speech"]


async def test_an_error_body_that_is_not_an_error_object_keeps_its_words():
    """A proxy's HTML page, Ollama's `404 page not found` at a base_url without `/v1`, or an error given as a
    bare string: the kind is the status (or a stream error), and the message the operator reads in the log
    is what the server said, not only `Error code: 404`."""
    server = ProviderServer()
    await server.start()
    try:
        server.enqueue(
            [
                Call(status=404, body="404 page not found"),
                Call(status=502, body={"error": "upstream connect error"}),
                Call(
                    sse=b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\ndata: {"error": "model unloaded"}\n\n'
                ),
            ]
        )
        got = []
        for _ in range(3):
            end, _sink = await call(server, REQ)
            assert end.failure is not None
            got.append((end.failure.kind, end.failure.retryable, end.failure.message))
    finally:
        await server.stop()
    assert got == [
        ("http-404", False, "HTTP 404: 404 page not found"),
        ("http-502", True, "HTTP 502: upstream connect error"),
        ("stream-error", True, "model unloaded"),
    ]


def test_a_gemini_tool_call_goes_back_with_its_thought_signature(work, capsys):
    """Gemini 3 through its compatible endpoint: the call has no index, carries its thought signature in
    `extra_content`, and ends with `stop`; the next round must send that signature back with the call,
    or Gemini refuses the request (HTTP 400)."""
    extra = {"google": {"thought_signature": "c2lnbmF0dXJl"}}
    call = {
        "id": "function-call-1",
        "type": "function",
        "function": {"name": "stumps", "arguments": '{"action":"list"}'},
    }
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{**call, "extra_content": extra}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    specimens = work / "scenarios" / "specimens"
    (specimens / "gemini-call.sse").write_text(
        "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    )
    scenario = (work / "scenarios" / "openai-tool-calls.yaml").read_text()
    (work / "scenarios" / "gemini.yaml").write_text(scenario.replace("openai-tool-list.sse", "gemini-call.sse"))
    out = replay(work, capsys, "gemini.yaml")
    [turn] = out["turns"]
    assert turn["provider_calls"] == 2 and turn["generation"]["status"] == "completed"
    sent = turn["requests"][1]["messages"][-2]
    [back] = sent["tool_calls"]
    assert (back["id"], back["function"]["name"], back["extra_content"]) == ("function-call-1", "stumps", extra)


async def test_a_429_for_an_exhausted_quota_is_not_retried():
    """OpenAI answers an account out of credit with HTTP 429 `insufficient_quota`: no later attempt mends
    it, unlike a rate limit, so it is not retried (the receipt names it after one attempt)."""
    server = ProviderServer()
    await server.start()
    quota = {"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota", "code": None}}
    try:
        server.enqueue([Call(status=429, body=quota), Call(status=429)])
        got = []
        for _ in range(2):
            end, _sink = await call(server, REQ)
            assert end.failure is not None
            got.append((end.failure.kind, end.failure.retryable))
    finally:
        await server.stop()
    assert got == [("insufficient_quota", False), ("rate_limit_exceeded", True)]
