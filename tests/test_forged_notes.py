"""Nothing a person writes or attaches reaches a resident's request in the form of a note the framework
writes (issue 22, item 2): the framework's notes, and only they, begin a line with `[`; every line of
anyone else's text is marked as theirs (`residents.context.marks`), in both protocols' shapes.

The pipeline tests read the bodies the local provider server received from the real SDKs."""

from __future__ import annotations

import pytest
from conftest import residence, specimen
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from residents import truth
from residents.context import RoomMessage
from residents.context.attachments import Fetched, shown_name
from residents.context.compile import QUIET_NOTE, START_NOTE, compile_with_files
from residents.continuation.request import CONTINUE_NOTE
from residents.delivery.outbox import Outbox
from residents.generation.attempts import AttemptRunner
from residents.generation.run import Generator
from residents.ledger.attachments import stored_request, without_image_refs
from residents.localservers.provider import Call
from residents.provider.openai_compatible import OpenAICompatibleProvider, chat_request, make_openai_client
from residents.records import ContinuationEnd, Ending, Generation, Post, Status, Stump
from residents.resident import Resident

NOTE = truth.context_boundary_note(Ending(Status.TRUNCATED, "max_tokens", 4096, 120))


def framework_notes() -> set[str]:
    """Every note the framework can write into a request, for a spread of endings and figures."""
    endings = [
        Ending(Status.TRUNCATED, "max_tokens", 4096, 120),
        Ending(Status.TRUNCATED, "max_tokens", None, 120),
        Ending(Status.TRUNCATED, "model_context_window_exceeded", 10, 120),
        Ending(Status.FAILED, None, None, 12, error="overloaded_error"),
        Ending(Status.INCOMPLETE, None, None, 12),
        Ending(Status.INCOMPLETE, truth.INTERRUPTED, None, 12),
        Ending(Status.INCOMPLETE, truth.TOOL_ROUND_LIMIT, None, 12),
        Ending(Status.TRUNCATED, "max_tokens", 8, 3, segments=2, continuation_ended=ContinuationEnd.SEGMENT_LIMIT),
    ]
    notes = {truth.context_boundary_note(e) for e in endings} - {""}
    notes |= {truth.context_refusal_note(), truth.context_refusal_note("content_filter")}
    notes |= {truth.context_abandoned_note(1, 311), truth.context_recovered_note(311, truth.RETRY_ABANDONED)}
    notes |= {truth.context_room_line_note("sill", truth.receipt(e) or "") for e in endings}
    notes |= {truth.context_set_aside_header(truth.RETRY_ABANDONED, 311), START_NOTE, QUIET_NOTE, CONTINUE_NOTE}
    notes |= {truth.image_not_resent("image/png", "ab" * 32), truth.attachment_text_header("n.txt", 2)}
    return notes


NOTES = framework_notes()


def texts(body: dict) -> list[str]:
    """Every text of a request body, in either protocol's shape: message contents and text blocks/parts."""
    out: list[str] = []
    for m in body["messages"]:
        c = m.get("content")
        if isinstance(c, str):
            out.append(c)
        elif isinstance(c, list):
            out += [b["text"] for b in c if b.get("type") == "text"]
    return out


def assert_unforged(request: dict, framework_lines: set[str]) -> None:
    """No text or line of the request, as Anthropic Messages or as chat completions, equals a framework
    note unless the framework put it there; every line that begins with `[` is one the framework wrote."""
    for body in (request, chat_request(request), chat_request(without_image_refs(stored_request(request)))):
        for part in texts(body):
            assert part not in NOTES - framework_lines, part
            for line in part.splitlines():
                assert line not in NOTES - framework_lines, line
                if line.startswith("["):
                    assert line in framework_lines, line


def said(mid: str, content: str, *files: Fetched, author: str = "alice", is_bot: bool = False) -> RoomMessage:
    return RoomMessage(mid, author, False, content, is_bot=is_bot, files=files)


def text_file(name: str, text: str) -> Fetched:
    data = text.encode()
    return Fetched(name, len(data), "text/plain", data)


# ---------------------------------------------------------------- through the real pipeline

CASES = {
    "the note alone": [said("m1", NOTE)],
    "after other lines": [said("m1", f"look at this:\n{NOTE}")],
    "after a blank line": [said("m1", f"look at this:\n\n{NOTE}")],
    "after a carriage return": [said("m1", f"look at this:\r{NOTE}")],
    "after a line separator": [said("m1", f"look at this:\u2028{NOTE}")],
    "in a text file": [said("m1", "see the file", text_file("notes.txt", f"intro\n{NOTE}\n"))],
    "a file that is the note": [said("m1", "", text_file("note.txt", NOTE))],
    "in a name": [said("m1", "hi", author=NOTE)],
    "by another resident": [said("m1", f"quoting:\n{NOTE}", author="sill", is_bot=True)],
}


def framework_lines_of(history: list[RoomMessage]) -> set[str]:
    return {truth.attachment_text_header(shown_name(f.name), f.size) for m in history for f in m.files} | {
        QUIET_NOTE,
        START_NOTE,
    }


@pytest.mark.parametrize("case", list(CASES))
async def test_a_note_a_person_writes_reaches_the_resident_marked_as_theirs(pipeline, case):
    history = CASES[case]
    pipeline.server.reset([Call(sse=specimen("end-turn.sse"))])

    class Room:
        async def send(self, post) -> str:
            return "m-reply"

    room = Room()
    await pipeline.resident(residence(), room).respond(room, "room", history, trigger="m1")
    [body] = pipeline.server.requests
    assert_unforged(body, framework_lines_of(history))
    assert NOTE not in "\n".join(texts(body)).splitlines()


def test_each_line_of_a_message_carries_its_authors_name_and_each_file_line_its_mark():
    history = [said("m1", f"one\n\n{NOTE}", text_file("n.txt", f"{NOTE}\r\nlast"))]
    request, _ = compile_with_files(residence(), history, {}, {})
    assert request["messages"] == [
        {
            "role": "user",
            "content": f"alice: one\nalice:\nalice: {NOTE}\n[attachment: n.txt, {len(NOTE) + 6} bytes, text:]\n"
            f"| {NOTE}\r\n| last",
        }
    ]


async def test_a_note_in_a_file_reaches_a_chat_completions_model_marked(pipeline):
    """The same rule on the wire of chat completions, through the openai SDK."""
    res = residence(
        name="lumen",
        model="gpt-4o-mini",
        max_tokens=1024,
        provider="openai-compatible",
        base_url=pipeline.server.url + "/v1",
        api_key_env="LUMEN_TEST_KEY",
    )
    client = make_openai_client(res.base_url or "", "k", timeout=5)
    provider = OpenAICompatibleProvider(client, "LUMEN_TEST_KEY")
    history = [said("m1", f"see\n{NOTE}", text_file("notes.txt", f"\n{NOTE}"))]
    pipeline.server.reset([Call(sse=specimen("openai-stop.sse"))])

    class Room:
        async def send(self, post) -> str:
            return "m-reply"

    room = Room()
    outbox = Outbox.of_room(pipeline.ledger, res.name, room)
    resident = Resident(res, Generator(AttemptRunner(provider, pipeline.ledger)), pipeline.ledger, outbox)
    try:
        await resident.respond(room, "room", history, trigger="m1")
    finally:
        await client.close()
    [body] = pipeline.server.requests
    [user] = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert user.splitlines() == [
        "alice: see",
        f"alice: {NOTE}",
        f"[attachment: notes.txt, {len(NOTE) + 1} bytes, text:]",
        "|",
        f"| {NOTE}",
    ]


# ---------------------------------------------------------------- whatever the text holds

PIECES = st.one_of(
    st.sampled_from(sorted(NOTES)),
    st.sampled_from(["\n", "\r\n", "\r", "\u2028", "\u2029", "\x0b", "\x0c", "\x85", "\x1e", "\n\n", ""]),
    st.sampled_from(["\u200b", "\ufeff", "［", "］", "[", "]", "| ", "alice: ", ": "]),
    st.text(max_size=20),
)
TEXTS = st.lists(PIECES, max_size=8).map("".join)
NAMES = st.one_of(st.sampled_from(["alice", "sill", NOTE, "[", "\n[Boundary", "", " "]), st.text(max_size=12))


@st.composite
def rooms(draw: st.DrawFn) -> list[RoomMessage]:
    history = []
    for i in range(draw(st.integers(1, 4))):
        files = tuple(
            text_file(draw(NAMES), t) for t in draw(st.lists(TEXTS.filter(lambda t: "\x00" not in t), max_size=2))
        )
        history.append(said(f"m{i}", draw(TEXTS), *files, author=draw(NAMES), is_bot=draw(st.booleans())))
    return history


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rooms())
def test_no_text_of_anyone_compiles_into_a_part_equal_to_a_framework_note(history):
    request, _ = compile_with_files(residence(), history, {}, {})
    assert_unforged(request, framework_lines_of(history))


@settings(max_examples=150, deadline=None)
@given(TEXTS)
def test_set_aside_text_shown_by_policy_is_marked_too(text):
    g = Generation(
        id="g-1", residence="cairn", channel="room", model="m", status="completed", stop_reason="end_turn", text="ok"
    )
    g.stumps = [Stump("s-1", "g-1", "a-1", truth.RETRY_ABANDONED, text, None, scope="attempt")]
    posts = {"m2": Post("p", "g-1", 1, "speech", "ok", message_id="m2")}
    history = [said("m1", "hi"), RoomMessage("m2", "cairn", True, "ok"), said("m3", "and?")]
    granted = residence(policy={"stumps": {"resident_reads_own": True}})
    request, _ = compile_with_files(granted, history, posts, {g.id: g})
    header = truth.context_set_aside_header(truth.RETRY_ABANDONED, len(text))
    assert_unforged(request, {header, QUIET_NOTE, START_NOTE} if text else {QUIET_NOTE, START_NOTE})
