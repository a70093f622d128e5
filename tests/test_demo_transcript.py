"""The headless demo's transcript, as a newcomer reads it: names not ids, every cut marked."""

from __future__ import annotations

from residents.demo.show import TRANSCRIPT_INTRO, Command, shown_answer, transcript_lines


def message(mid: str, author: str, author_id: str, content: str, bot: bool = False, pinged=()) -> dict:
    return {
        "id": mid,
        "author": author,
        "author_id": author_id,
        "bot": bot,
        "content": content,
        "pings": {"users": [n for n, _ in pinged], "user_ids": [i for _, i in pinged]},
    }


def test_mentions_show_as_at_name_and_the_transcript_opens_with_what_to_look_for():
    msgs = [
        message("1", "alice", "11", "<@22> Tell us about the harbour, <@!33> too.", pinged=[("cairn", "22")]),
        message("2", "sill", "33", "The tide.", bot=True),
        message("3", "bob", "44", "<@99> is nobody here"),
    ]
    lines = transcript_lines(msgs, {"2": {"kind": "speech"}}, [])
    assert lines[: len(TRANSCRIPT_INTRO)] == TRANSCRIPT_INTRO and 2 <= len(TRANSCRIPT_INTRO) <= 3
    assert "[alice · person] @cairn Tell us about the harbour, @sill too." in lines
    assert "[bob · person] @99 is nobody here" in lines  # an id nobody answers to stays an id, marked


def test_a_long_answer_is_cut_with_its_fence_closed_and_the_lines_left_out_counted():
    answer = "```\n" + "\n".join(f"line {i}" for i in range(1, 21)) + "\n```"  # 22 lines
    shown = shown_answer(answer)
    assert shown[:14] == answer.splitlines()[:14]
    assert shown[14:] == ["```", "[… 8 more lines not shown]"]
    assert shown_answer("```\na\n```") == ["```", "a", "```"]  # short: as it is
    closed = "```\n" + "a\n" * 5 + "```\n" + "b\n" * 20
    assert shown_answer(closed)[-2:] == ["b", "[… 13 more lines not shown]"]  # no fence to close


def test_the_moderator_section_uses_the_marked_cut():
    cmd = Command("/generation show ref:g-1", "cairn", "generation", [])
    cmd.responses = [{"content": "```\n" + "x\n" * 30 + "```"}]
    lines = transcript_lines([], {}, [cmd])
    looked = lines[lines.index("== a moderator looks") :]
    assert looked[1] == "> /generation show ref:g-1"
    assert looked[-2:] == ["  ```", "  [… 18 more lines not shown]"]


def test_the_real_api_transcript_promises_no_scripted_failure():
    from residents.demo.show import REAL_API_INTRO

    lines = transcript_lines([], {}, [], REAL_API_INTRO)
    assert lines[0].startswith("What to look for: ") and "fails mid-stream" not in " ".join(lines)
