"""Text on its way out: look-alike receipts escaped in posts, lone surrogates made valid where text
leaves the process, and the ledger keeping both exactly.

Pure rules first (`residents.text`, the planner, `ledger verify`'s cover check), then the real pipeline:
`residents replay` on a bundled scenario, and a turn after a lone surrogate through the real SDK
against the local provider server.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from residents import cli, truth
from residents.delivery import plan, split_text
from residents.delivery.resume import Seen, recover, resume_delivery
from residents.ledger import Ledger
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.records import Attempt, Generation, new_id
from residents.replay.run import replay
from residents.replay.scenario import load_scenario
from residents.text import REPLACEMENT, cover, escape_subtext, outbound, outbound_json
from residents.truth import LIMIT, Ending

ROOT = Path(__file__).resolve().parent.parent
RECEIPT_LINE = "-# Output ceiling reached at 4,096 tokens; the remainder was not generated."
MODEL = "claude-3-opus-20240229"


# ---------------------------------------------------------------- outbound: valid Unicode, counted


def test_outbound_replaces_each_lone_surrogate_and_counts_it():
    assert outbound("plain é 😀") == ("plain é 😀", 0)
    assert outbound("a\ud83d b") == (f"a{REPLACEMENT} b", 1)
    assert outbound("\ude00x\ud83d") == (f"{REPLACEMENT}x{REPLACEMENT}", 2)
    fixed, n = outbound("half \ud83d")
    fixed.encode("utf-8")  # valid now
    assert n == 1


def test_outbound_joins_a_pair_held_as_two_code_units():
    """Two deltas each carrying half of 😀 assemble into the pair: that is the character, not damage."""
    assert outbound("x\ud83d\ude00y") == ("x😀y", 0)
    assert outbound("\ud83d\ud83d\ude00") == (f"{REPLACEMENT}😀", 1)  # a lone high, then a pair
    assert outbound("\ude00\ud83d") == (REPLACEMENT * 2, 2)  # low then high is no pair


def test_outbound_json_makes_every_string_valid():
    body = {
        "messages": [{"role": "assistant", "content": "a\ud83d"}, {"role": "user", "content": "ok"}],
        "max_tokens": 5,
        "system": "x\ud83d\ude00",
    }
    fixed, n = outbound_json(body)
    assert n == 1
    json.dumps(fixed, ensure_ascii=False).encode("utf-8")
    assert fixed["messages"][0]["content"] == f"a{REPLACEMENT}" and fixed["system"] == "x😀"
    assert body["messages"][0]["content"] == "a\ud83d"  # the original is untouched
    clean = {"a": ["b", 1, None]}
    assert outbound_json(clean) == (clean, 0)


# ---------------------------------------------------------------- the subtext escape


@pytest.mark.parametrize(
    "content, want",
    [
        (RECEIPT_LINE, "\\" + RECEIPT_LINE),
        ("said:\n-# tiny\nmore", "said:\n\\-# tiny\nmore"),
        ("  -# indented is plain text in Discord", "  -# indented is plain text in Discord"),
        ("> -# quoted renders with a quote bar", "> -# quoted renders with a quote bar"),
        ("-#no space is no subtext", "-#no space is no subtext"),
        ("```md\n-# inside a code block\n```\n-# after it", "```md\n-# inside a code block\n```\n\\-# after it"),
        ("x ```-#\n-# still code``` y", "x ```-#\n-# still code``` y"),
        (
            "```\nan unclosed fence is no block\n-# so this renders",
            "```\nan unclosed fence is no block\n\\-# so this renders",
        ),
        ("\\-# already escaped by the model", "\\-# already escaped by the model"),
    ],
)
def test_a_line_that_would_render_as_subtext_is_escaped(content, want):
    assert escape_subtext(content) == want


def test_speech_and_partials_are_escaped_receipts_and_notices_are_not():
    text = f"Quoting the room:\n{RECEIPT_LINE}\nThat is all."
    [speech] = plan(Ending("completed", "end_turn", 20, len(text)), text)
    assert speech.kind == "speech" and speech.content == text.replace("\n-# ", "\n\\-# ")
    posts = plan(Ending("truncated", "max_tokens", 4096, len(text)), text)
    assert [p.kind for p in posts] == ["partial", "receipt"]
    assert posts[0].content == speech.content
    assert posts[1].content == RECEIPT_LINE  # the real one renders as subtext
    notice = plan(Ending("refused", "refusal", 3, len(text)), text)
    assert [p.kind for p in notice] == ["notice"] and notice[0].content.startswith("-# ")


def test_a_chunk_that_a_split_starts_with_a_marker_is_escaped():
    """A hard cut inside a long line can leave `-# ` at the head of the next message."""
    text = "w" * 1999 + " -# " + "tail " * 10
    chunks = split_text(text, escape=True)
    assert len(chunks) == 2 and chunks[1].startswith("\\-# ")
    assert cover(text, chunks) is None


def test_escapes_count_toward_the_2000_character_limit():
    text = "-# x\n" * 900
    chunks = split_text(text, escape=True)
    assert all(len(c) <= LIMIT for c in chunks)
    assert all(line.startswith("\\-# ") for c in chunks for line in c.split("\n"))
    assert cover(text, chunks) is None


def test_a_split_code_block_keeps_its_lines_and_escapes_none_inside():
    body = "\n".join(f"-# line {i} of the block" for i in range(200))
    text = f"Before.\n```md\n{body}\n```\n-# after the block"
    chunks = split_text(text, escape=True)
    assert len(chunks) >= 3
    assert all(len(c) <= LIMIT for c in chunks)
    inside = [line for c in chunks for line in c.split("\n") if "of the block" in line]
    assert inside and all(line.startswith("-# ") for line in inside)
    assert chunks[-1].endswith("\n\\-# after the block")
    assert cover(text, chunks) is None


def _renders_as_subtext(content: str) -> bool:
    """Discord's reading, as `escape_subtext` states it: a `-# ` line outside ``` … ``` blocks."""
    outside = re.sub(r"```[\s\S]*?```", lambda m: re.sub(r"[^\n]", "x", m.group()), content)
    return any(line.startswith("-# ") for line in outside.split("\n"))


pieces = st.lists(
    st.sampled_from(
        [
            "-# ",
            "\n-# ",
            "\n",
            "\n\n",
            "  -# ",
            "```",
            "```md\n",
            "\n```\n",
            "word ",
            "\\-# ",
            "x" * 300,
            "Output ceiling reached. ",
            "😀",
            "a\ud83d",
        ]
    ),
    max_size=300,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(pieces)
def test_no_text_post_renders_as_subtext_and_posts_still_cover_the_text(text):
    chunks = split_text(text, escape=True)
    assert all(0 < len(c) <= LIMIT for c in chunks)
    assert not any(_renders_as_subtext(c) for c in chunks)
    assert cover(text, chunks) is None


def test_verify_accepts_the_escape_and_nothing_else_added():
    text = f"a\n{RECEIPT_LINE}\nb"
    assert cover(text, [f"a\n\\{RECEIPT_LINE}\nb"]) is None
    assert cover(text, [text]) is None
    assert cover(text, [f"a\n{RECEIPT_LINE}\\\nb"]) is not None  # a backslash anywhere else is not the text
    assert cover("a -# b", ["a \\-# b"]) is not None  # mid-line: nothing a planner escapes
    assert cover(f"a\n\\{RECEIPT_LINE}", [f"a\n\\{RECEIPT_LINE}"]) is None  # the text's own backslash


# ---------------------------------------------------------------- the real pipeline: replay


@pytest.fixture
def work(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_replay_escapes_look_alike_lines_and_a_persons_stays_their_words(work, capsys):
    db = str(work / "l.db")
    assert cli.main(["replay", "scenarios/lookalike.yaml", "--json", "--db", db]) == 0
    out = json.loads(capsys.readouterr().out)
    first, second = out["turns"]
    text = first["generation"]["text"]
    assert "\n-# Output ceiling reached at 4,096 tokens" in text  # the ledger keeps the text exactly
    [post] = first["posts"]
    assert post["kind"] == "speech"
    assert post["content"] == text.replace("\n-# Output", "\n\\-# Output", 1).replace("\n-# And", "\n\\-# And")
    assert "```md\n-# Output ceiling" in post["content"]  # inside a code block: left as it is
    assert "\n  -# An indented line" in post["content"]
    assert not any(line.startswith("-# ") for line in post["content"].split("```")[0].split("\n"))
    # the next request: the resident's own words exactly, the person's look-alike line as the person's words
    msgs = second["requests"][0]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"] == text
    assert msgs[2]["content"] == "alice: -# Output ceiling reached at 9 tokens; the remainder was not generated."
    assert cli.main(["ledger", "verify", "--db", db]) == 0


async def test_a_lone_surrogate_is_kept_posted_valid_and_the_next_turn_goes_through(tmp_path):
    """The first reply carries `\\ud83d` (valid JSON escape); the second turn in the channel must reach
    the provider with a valid body and be answered (today it fails before any call)."""
    half = "x\ud83d"
    stream = (
        sse.head(MODEL)
        + sse.delta("Half a wave: ")
        + sse.delta(half)
        + sse.delta(" and a whole 🌊.")
        + sse.tail("end_turn", 12)
    )
    spec = work_scenario(tmp_path, [("Show me a wave.", stream), ("And again?", sse.stream("Again.", "end_turn", 3))])
    db = tmp_path / "s.db"
    out = await replay(load_scenario(spec), str(db))
    first, second = out["turns"]
    text = "Half a wave: x\ud83d and a whole 🌊."
    assert first["generation"]["text"] == text  # kept exactly
    assert [(p["kind"], p["content"], p["replacements"]) for p in first["posts"]] == [("speech", text, 1)]
    assert second["provider_calls"] == 1 and second["generation"]["status"] == "completed"
    assert [p["content"] for p in second["posts"]] == ["Again."]
    sent = second["requests"][0]["messages"][1]["content"]
    assert sent == f"Half a wave: x{REPLACEMENT} and a whole 🌊."  # what left the process is valid
    ledger = await Ledger.open(db)
    try:
        g = await ledger.get_generation(first["generation"]["id"])
        assert g is not None and g.text == text and g.posts[0].content == text and g.posts[0].replacements == 1
        assert await verify(ledger) == []
    finally:
        await ledger.close()


def test_the_readable_replay_shows_posts_as_the_room_gets_them(tmp_path, capsys):
    stream = sse.head(MODEL) + sse.delta("a \ud83d b") + sse.tail("end_turn", 3)
    spec = work_scenario(tmp_path, [("hi", stream)])
    assert cli.main(["replay", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"[cairn · speech] a {REPLACEMENT} b" in out
    out.encode("utf-8")


def work_scenario(tmp_path: Path, turns: list[tuple[str, bytes]]) -> Path:
    lines = [
        "residence:",
        "  name: cairn",
        f"  model: {MODEL}",
        "  max_tokens: 4096",
        "  policy: {retries: {max_attempts: 1, backoff_seconds: 0}}",
        "turns:",
    ]
    for i, (say, body) in enumerate(turns):
        (tmp_path / f"t{i}.sse").write_bytes(body)
        lines += [f"  - say: {{author: alice, content: {json.dumps(say)}}}", f"    calls: [{{sse: t{i}.sse}}]"]
    path = tmp_path / "s.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- crash recovery finds what the room got


class HeldRoom:
    """A channel holding one message that reached Discord before its id reached the ledger (no nonce)."""

    def __init__(self, held: list[Seen]) -> None:
        self.held = held
        self.sent: list[str] = []

    async def own_messages(self, channel: str, after_id: str | None, after_time: float) -> list[Seen]:
        return list(self.held)

    async def send(self, post) -> str:
        self.sent.append(post.id)
        return f"m{len(self.sent) + len(self.held)}"


async def test_recovery_recognises_a_post_the_room_holds_with_its_replacement(tmp_path):
    ledger = await Ledger.open(tmp_path / "r.db")
    try:
        g = Generation(id=new_id("g-"), residence="cairn", channel="100", model=MODEL)
        await ledger.create_generation(g)
        a = Attempt(id=new_id("a-"), generation_id=g.id, segment=1, index=1)
        await ledger.start_attempt(a)
        await ledger.add_chunk(a.id, 0, "a wave \ud83d")
        await recover(ledger, {"cairn"})
        got = await ledger.get_generation(g.id)
        assert got is not None and [p.kind for p in got.posts] == ["partial", "receipt"]
        partial = got.posts[0]
        assert partial.content == "a wave \ud83d" and partial.replacements == 1
        room = HeldRoom([Seen("m-flight", f"a wave {REPLACEMENT}")])  # as Discord holds it
        assert await resume_delivery(ledger, "cairn", room) == 2
        assert room.sent == [got.posts[1].id]  # the partial was recognised, not sent twice
    finally:
        await ledger.close()


def test_a_context_note_for_another_residents_line_is_impersonal():
    note = truth.context_room_line_note("sill", truth.ceiling_sentence(1024))
    assert "sill" in note and "1,024" in note and note.startswith("[") and note.endswith("]")
    assert not re.search(r"\b(you|your)\b", note, re.I)
