"""Delivery planning: posts by kind, within 2,000 characters, covering the text exactly once."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from residents.delivery import plan, split_text
from residents.truth import LIMIT, Ending

OPEN = re.compile(r"^```[^\n`]*\n")
CLOSE = re.compile(r"\n?```[ \t]*$")


def covers(text: str, chunks: list[str]) -> bool:
    """The contract's rule 1: in-order substrings, only whitespace between, fences may be added at a split."""
    pos = 0
    for c in chunks:
        for core in (c, CLOSE.sub("", c), OPEN.sub("", c, count=1), CLOSE.sub("", OPEN.sub("", c, count=1))):
            i = text.find(core, pos)
            if core and i >= 0 and not text[pos:i].strip():
                pos = i + len(core)
                break
        else:
            return False
    return not text[pos:].strip()


words = st.lists(
    st.sampled_from(["river", "bend", "é", "😀", "\n", "\n\n", ". ", " ", "```", "```py\n", "x" * 300, "word" * 700]),
    max_size=400,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(words)
def test_chunks_fit_and_cover_the_text_exactly(text):
    chunks = split_text(text)
    assert all(0 < len(c) <= LIMIT for c in chunks)
    assert all(c.strip() for c in chunks)
    assert covers(text, chunks)


def test_prefers_paragraphs_then_lines_then_sentences_then_words():
    para = ("a" * 900 + "\n\n") * 3
    assert [len(c) for c in split_text(para)] == [1802, 900]
    lines = ("b" * 900 + "\n") * 3
    assert split_text(lines)[0] == "b" * 900 + "\n" + "b" * 900
    sentences = ("Word " * 150 + "end. ") * 4
    first = split_text(sentences)[0]
    assert first.endswith("end.")
    no_breaks = "c" * 4500
    assert [len(c) for c in split_text(no_breaks)] == [2000, 2000, 500]


def test_a_split_inside_a_code_block_closes_and_reopens_the_fence():
    text = "Here:\n```python\n" + "\n".join(f"x_{i} = {i}" for i in range(400)) + "\n```\nDone."
    chunks = split_text(text)
    assert len(chunks) > 1
    assert chunks[0].rstrip().endswith("```")
    assert chunks[1].startswith("```python\n")
    for c in chunks:
        assert c.count("```") % 2 == 0 or c is chunks[-1] or c.endswith("```")
    assert covers(text, chunks)


def test_emoji_are_never_cut():
    text = "😀" * 4100
    chunks = split_text(text)
    assert "".join(chunks) == text


def test_end_turn_posts_speech_only():
    posts = plan(Ending("completed", "end_turn", 200, 11), "Hello room.")
    assert [(p.kind, p.content) for p in posts] == [("speech", "Hello room.")]


def test_max_tokens_posts_the_partial_then_exactly_one_receipt():
    text = "The harbour at dusk holds three boats and a lighth"
    posts = plan(Ending("truncated", "max_tokens", 4096, len(text)), text)
    assert [p.kind for p in posts] == ["partial", "receipt"]
    assert posts[0].content == text
    assert posts[1].content == "-# Output ceiling reached at 4,096 tokens; the remainder was not generated."


def test_refusal_posts_one_notice_and_none_of_its_text():
    text = "Some text the provider stopped."
    posts = plan(Ending("refused", "refusal", 37, len(text)), text)
    assert [p.kind for p in posts] == ["notice"]
    assert text[:10] not in posts[0].content


def test_failure_with_text_is_a_partial_and_a_receipt_and_without_text_one_notice():
    kinds = [p.kind for p in plan(Ending("failed", None, None, 5, attempts=3, error="api_error"), "Half ")]
    assert kinds == ["partial", "receipt"]
    kinds = [p.kind for p in plan(Ending("failed", None, None, 0, attempts=3, error="api_error"), "")]
    assert kinds == ["notice"]


def test_a_whitespace_only_text_is_not_posted_as_an_empty_message():
    posts = plan(Ending("truncated", "max_tokens", 10, 3), " \n ")
    assert [p.kind for p in posts] == ["receipt"]  # a cut with nothing visible still gets its receipt, alone
