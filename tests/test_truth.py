"""The rules about truth: statuses, causes and the wording every room and resident reads."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from residents import models, truth
from residents.truth import Ending

SECOND_PERSON = re.compile(r"\byou(r|rs|rself)?\b", re.I)


@pytest.mark.parametrize(
    "stop, outcome",
    [
        ("end_turn", "completed"),
        ("stop_sequence", "completed"),
        ("max_tokens", "truncated"),
        ("model_context_window_exceeded", "truncated"),
        ("refusal", "refused"),
        (None, "incomplete"),
        ("tool_use", "incomplete"),
        ("pause_turn", "incomplete"),
        ("a_reason_from_the_future", "incomplete"),
    ],
)
def test_every_stop_reason_has_an_outcome_and_nothing_unknown_completes(stop, outcome):
    assert truth.outcome_of_stop(stop) == outcome


def test_tool_stops_complete_only_for_residences_with_tools():
    assert truth.outcome_of_stop("tool_use", has_tools=True) == "completed"


def test_abandoned_attempt_can_never_decide_a_status():
    with pytest.raises(ValueError):
        truth.status_of_outcome("abandoned")


@pytest.mark.parametrize(
    "status, stop, cause",
    [
        ("completed", "end_turn", None),
        ("truncated", "max_tokens", "max_tokens"),
        ("truncated", "model_context_window_exceeded", "model_context_window_exceeded"),
        ("refused", "refusal", "refusal"),
        ("failed", None, "provider-error"),
        ("incomplete", None, "no-stop-reason"),
        ("incomplete", "weird", "weird"),
    ],
)
def test_stump_causes(status, stop, cause):
    assert truth.stump_cause(status, stop) == cause


def test_only_completed_text_is_speech_and_refused_text_is_never_posted():
    assert truth.text_kind("completed") == "speech"
    assert truth.text_kind("truncated") == truth.text_kind("failed") == truth.text_kind("incomplete") == "partial"
    assert truth.text_kind("refused") is None
    assert truth.is_completed_turn("completed") and not truth.is_completed_turn("truncated")


@pytest.mark.parametrize("tokens, figure", [(4096, "4,096"), (1024, "1,024"), (128000, "128,000"), (600, "600")])
def test_ceiling_receipt_states_the_providers_figure_with_commas(tokens, figure):
    line = truth.receipt(Ending("truncated", "max_tokens", tokens, 17000))
    assert line == f"Output ceiling reached at {figure} tokens; the remainder was not generated."


@pytest.mark.parametrize("stop", ["max_tokens", "length"])
def test_ceiling_receipt_without_a_provider_figure_says_the_count_is_unknown(stop):
    line = truth.receipt(Ending("truncated", stop, None, 10))
    assert line == "Output ceiling reached (token count not reported by the provider); the remainder was not generated."
    assert not re.search(r"\d", line)


@pytest.mark.parametrize(
    "finish, tools, outcome",
    [
        ("stop", False, "completed"),
        ("length", False, "truncated"),
        ("content_filter", False, "refused"),
        ("tool_calls", True, "completed"),  # a round of the tool loop
        ("tool_calls", False, "incomplete"),  # no tool loop to take it
        ("function_call", True, "incomplete"),
        (None, False, "incomplete"),
        ("something_new", False, "incomplete"),
    ],
)
def test_chat_completions_finish_reasons(finish, tools, outcome):
    assert truth.outcome_of_stop(finish, has_tools=tools) == outcome


def test_a_chat_refusal_is_declined_with_its_own_finish_reason_on_record():
    assert truth.chat_stop_reason("stop", refusal_text=True) == "refusal"
    assert truth.chat_stop_reason("stop", refusal_text=False) == "stop"
    assert truth.chat_stop_reason("length", refusal_text=True) == "length"
    assert truth.chat_stop_reason("stop", refusal_text=False, tool_calls=True) == "tool_calls"  # Gemini's way
    assert truth.chat_stop_reason("length", refusal_text=False, tool_calls=True) == "length"
    line = truth.notice(Ending("refused", "content_filter", None, 0))
    assert line == "Provider declined this reply (stop reason: content_filter); no text was generated."


ENDINGS = [
    Ending("truncated", "max_tokens", 4096, 100),
    Ending("truncated", "model_context_window_exceeded", 9000, 100),
    Ending("truncated", "max_tokens", 600, 100, segments=3, continuation_ended="segment-limit"),
    Ending("truncated", "max_tokens", 600, 100, segments=2, continuation_ended="repetition"),
    Ending("completed", "end_turn", 130, 100, segments=2, continuation_ended="completed"),
    Ending("failed", None, None, 100, attempts=3, error="overloaded_error"),
    Ending("failed", None, None, 0, attempts=3, error="overloaded_error"),
    Ending("incomplete", None, None, 100),
    Ending("incomplete", "pause_turn", None, 100),
    Ending("refused", "refusal", 37, 140),
    Ending("refused", "refusal", 3, 0),
    Ending("truncated", "max_tokens", 1024, 0, cut_in="thinking", other_content=True),
    Ending("truncated", "max_tokens", 256, 0, cut_in="tool_use", other_content=True),
    Ending("failed", None, None, 0, error="internal-UnicodeEncodeError"),
    Ending("incomplete", truth.INTERRUPTED, None, 0, cut_in="thinking", other_content=True),
]


@pytest.mark.parametrize("e", ENDINGS)
def test_every_boundary_line_is_compact_factual_and_impersonal(e):
    for line in (truth.receipt(e), truth.notice(e)):
        if line is None:
            continue
        assert len(line) <= truth.MAX_LINE
        assert not SECOND_PERSON.search(line), line
        for word in ("too long", "should", "please", "sorry", "fault"):
            assert word not in line.lower()


@pytest.mark.parametrize(
    "last, error, stop, why",
    [
        ("failed", "overloaded_error", "max_tokens", "Continuation stopped on a provider error."),
        ("refused", None, "max_tokens", "Continuation stopped when the provider declined a segment."),
        ("incomplete", None, "max_tokens", "Continuation stopped when a segment ended without a usable stop reason."),
        ("failed", "internal-TypeError", "max_tokens", "Continuation stopped on an internal error."),
        (
            "truncated",
            None,
            "model_context_window_exceeded",
            "Continuation stopped when the model context window filled.",
        ),
    ],
)
def test_a_continuation_ended_by_error_is_worded_by_what_stopped_its_segment(last, error, stop, why):
    """`error` is the contract's one value for these; the receipt says which it was, from the facts."""
    e = Ending(
        "truncated",
        stop,
        600,
        100,
        segments=2 if last == "truncated" else 1,
        continuation_ended="error",
        error=error,
        last_outcome=last,
    )
    line = truth.receipt(e)
    assert line is not None and line.endswith(" " + why) and len(line) <= truth.MAX_LINE
    assert ("provider error" in line) == (last == "failed" and error == "overloaded_error")


def test_end_turn_has_no_receipt_and_no_notice():
    e = Ending("completed", "end_turn", 200, 900)
    assert truth.receipt(e) is None and truth.notice(e) is None


def test_refusal_gets_a_notice_not_a_receipt():
    e = Ending("refused", "refusal", 37, 140)
    assert truth.receipt(e) is None
    assert "declined" in truth.notice(e)


def test_a_failure_with_no_text_says_nothing_was_generated():
    assert "no text was generated" in truth.notice(Ending("failed", None, None, 0, attempts=3, error="api_error"))


def test_a_cut_with_no_reply_text_says_where_it_landed_and_that_no_reply_text_was_generated():
    reasoning = Ending("truncated", "max_tokens", 1024, 0, cut_in="thinking", other_content=True)
    assert (
        truth.notice(reasoning)
        == "Output ceiling reached at 1,024 tokens during reasoning; no reply text was generated."
    )
    tool = Ending("truncated", "max_tokens", 256, 0, cut_in="tool_use", other_content=True)
    assert (
        truth.notice(tool)
        == "Output ceiling reached at 256 tokens during a tool call's input; no reply text was generated."
    )
    stopped = Ending("incomplete", truth.INTERRUPTED, None, 0, cut_in="thinking", other_content=True)
    assert truth.notice(stopped) == "Process stopped before this output was finished; no reply text was generated."
    # with reply text, the receipt is the plain one, whatever block the cut landed in
    assert (
        truth.receipt(Ending("truncated", "max_tokens", 1024, 80, cut_in="thinking", other_content=True))
        == "Output ceiling reached at 1,024 tokens; the remainder was not generated."
    )


def test_a_refusal_notice_claims_a_stump_only_where_one_exists():
    assert truth.notice(Ending("refused", "refusal", 37, 140)).endswith("its text is held as a stump.")
    assert (
        truth.notice(Ending("refused", "refusal", 3, 0))
        == "Provider declined this reply (stop reason: refusal); no text was generated."
    )
    # whitespace only: nothing visible to post, but the text exists and is the stump
    assert truth.notice(Ending("refused", "refusal", 3, 0, kept_chars=2)).endswith("its text is held as a stump.")


def test_an_internal_failure_is_never_worded_as_the_providers():
    e = Ending("failed", None, None, 0, error=truth.internal_error("UnicodeEncodeError"))
    assert truth.notice(e) == "Internal error (UnicodeEncodeError) stopped this output; no text was generated."
    assert "Provider" not in truth.receipt(replace(e, chars=10))
    assert truth.is_internal(e.error) and not truth.is_internal("overloaded_error")


@pytest.mark.parametrize(
    "cause, btype, expect",
    [
        ("max_tokens", "thinking", "max_tokens"),
        ("max_tokens", "tool_use", "max_tokens"),
        ("retry-abandoned", "redacted_thinking", "retry-abandoned"),
        ("max_tokens", "text", None),
        (None, "thinking", None),
    ],
)
def test_a_non_text_block_an_output_stopped_in_is_a_stump_with_its_attempts_cause(cause, btype, expect):
    assert truth.block_stump_cause(cause, btype) == expect


def test_context_notes_state_the_cut_without_second_person():
    note = truth.context_boundary_note(Ending("truncated", "max_tokens", 4096, 10))
    assert "4,096" in note and "not generated" in note and "not an authored ending" in note
    abandoned = truth.context_abandoned_note(2, 1561)
    assert "1,561" in abandoned and "retry-abandoned" in abandoned
    for line in (note, abandoned, truth.context_refusal_note()):
        assert not SECOND_PERSON.search(line)


@pytest.mark.parametrize(
    "model, ceiling, prefill",
    [
        ("claude-3-opus-20240229", 4096, True),
        ("claude-3-5-sonnet-20241022", 8192, True),
        ("claude-3-7-sonnet-20250219", 64000, True),
        ("claude-opus-4-1-20250805", 32000, True),
        ("claude-sonnet-4-20250514", 64000, True),
        ("claude-sonnet-4-5", 64000, True),
        ("claude-opus-4-6", 128000, False),
        ("claude-sonnet-4-6", 64000, False),
        ("claude-opus-4-7", 128000, False),
    ],
)
def test_model_table(model, ceiling, prefill):
    c = models.caps(model)
    assert (c.max_output_tokens, c.accepts_prefill) == (ceiling, prefill)


def test_unknown_model_is_assumed_to_reject_prefill():
    assert not models.caps("some-new-model").accepts_prefill
    assert not models.known("some-new-model")


# ---------------------------------------------------------------- the resident's own stumps (issue 12 A)


def test_pause_turn_never_completes_even_with_tools():
    assert truth.outcome_of_stop("pause_turn", has_tools=True) == "incomplete"  # never resumed here


def test_the_tool_round_limit_is_incomplete_with_its_own_receipt_and_note():
    e = Ending(status="incomplete", stop_reason=truth.TOOL_ROUND_LIMIT, output_tokens=30, chars=92)
    assert truth.status_of_outcome(truth.outcome_of_stop(truth.TOOL_ROUND_LIMIT)) == "incomplete"
    assert truth.stump_cause("incomplete", truth.TOOL_ROUND_LIMIT) == "tool-round-limit"
    assert (
        truth.receipt(e)
        == "Tool round limit reached; a further tool call was not run, and the output may be incomplete."
    )
    assert (
        truth.notice(replace(e, chars=0, other_content=True))
        == "Tool round limit reached; a further tool call was not run, and no reply text was generated."
    )
    note = truth.context_boundary_note(e)
    assert "tool round limit" in note and "not an authored ending" in note and not SECOND_PERSON.search(note)


@pytest.mark.parametrize(
    "cause, origin",
    [
        ("retry-abandoned", "from an abandoned attempt"),
        ("repetition", "from a continuation segment set aside (repetition)"),
        ("interrupted", "from an output interrupted by a process stop"),
        ("something-new", "from a text set aside (something-new)"),
    ],
)
def test_a_recovered_fragment_is_named_by_where_it_came_from(cause, origin):
    line = truth.recovered_receipt(1311, cause)
    assert line == f"Recovered fragment of 1,311 characters {origin}, published at the resident's request."
    assert len(line) <= truth.MAX_LINE and not SECOND_PERSON.search(line)
    note = truth.context_recovered_note(1311, cause)
    assert origin in note and "1,311" in note and not SECOND_PERSON.search(note)


def test_the_tool_description_is_impersonal():
    assert not SECOND_PERSON.search(truth.STUMPS_TOOL_DESCRIPTION)
    assert all(a in truth.STUMPS_TOOL_DESCRIPTION for a in ("`list`", "`read`", "`set_access`", "`publish`"))


@pytest.mark.parametrize(
    "d, clause",
    [
        (truth.Declined("unknown-generation", "cairn", "g-000000000001"), "no generation g-000000000001 of cairn"),
        (truth.Declined("no-generation-here", "cairn"), "cairn has no generation here"),
        (
            truth.Declined("standing", "cairn", "g-1", "none"),
            "the continuation standing of cairn is none, not on-request",
        ),
        (
            truth.Declined("not-cut", "cairn", "g-1", "completed"),
            "generation g-1 is completed, not cut at the output ceiling",
        ),
        (truth.Declined("no-request", "cairn", "g-1"), "generation g-1 has no recorded request to continue"),
        (
            truth.Declined("tool-calls", "cairn", "g-1"),
            "generation g-1 made tool calls, and continuation never mixes with the tool loop",
        ),
        (truth.Declined("stopped", "cairn", "g-1", "segment-limit"), "continuation of g-1 stopped: segment-limit"),
        (
            truth.Declined("already-continued", "cairn", "g-1", "2"),
            "generation g-1 was continued meanwhile; it has 2 segments now",
        ),
    ],
)
def test_every_reason_to_decline_a_continue_is_worded_here_from_facts(d, clause):
    """Callers name a reason and its facts; the room's notice and a moderator's answer are worded once, here."""
    assert truth.declined_reason(d) == clause
    notice = truth.declined_continue(d)
    assert notice == f"Continuation not available: {clause}." and len(notice) <= truth.MAX_LINE
    assert not SECOND_PERSON.search(notice)
    assert truth.not_continued(d) == f"Not continued: {clause}."


@pytest.mark.parametrize(
    "button, who",
    [
        ("moderators", "moderators of this channel"),
        ("asker", "moderators of this channel and the person this reply answered"),
    ],
)
def test_a_refused_continue_press_says_who_may_press_as_a_fact(button, who):
    line = truth.press_refused(button, "cairn")
    assert line == f"Continuing this output is for {who}, under the continuation policy of cairn."
    assert len(line) <= truth.MAX_LINE and not SECOND_PERSON.search(line)
    assert truth.continue_label(2) == "Continue (2 left)"


@pytest.mark.parametrize(
    "tokens, scope, budget, line",
    [
        ("output", "residence", 200_000, "Daily output budget of 200,000 tokens reached; no reply was generated."),
        ("input", "residence", 5_000_000, "Daily input budget of 5,000,000 tokens reached; no reply was generated."),
        (
            "output",
            "person",
            20_000,
            "Daily output budget per person of 20,000 tokens reached; no reply was generated.",
        ),
    ],
)
def test_a_spent_budget_is_one_fact_about_the_budget(tokens, scope, budget, line):
    """The room's line states the budget and that no reply was made: never whom it addresses, nor anyone's conduct."""
    said = truth.budget_notice(tokens, scope, budget)
    assert said == line and len(said) <= truth.MAX_LINE and not SECOND_PERSON.search(said)
