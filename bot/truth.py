"""The rules about truth, in one pure place.

Every other module asks here what a stop reason means, what a generation's status is, which texts
are stumps, and what the room and the resident are told at a boundary. Nothing here does I/O or
knows about Discord, SQLite or the SDK, so every rule is a small function over plain data and the
wording of a receipt exists exactly once.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

Status = Literal["pending", "completed", "truncated", "refused", "failed", "incomplete"]
Outcome = Literal["streaming", "completed", "truncated", "abandoned", "refused", "failed", "incomplete"]
PostKind = Literal["speech", "partial", "receipt", "notice"]

COMPLETED_STOPS = frozenset({"end_turn", "stop_sequence"})
TRUNCATED_STOPS = frozenset({"max_tokens", "model_context_window_exceeded"})
REFUSAL = "refusal"
TOOL_STOPS = frozenset({"tool_use", "pause_turn"})

# Discard and stump causes that are not provider stop reasons.
RETRY_ABANDONED = "retry-abandoned"
PROVIDER_ERROR = "provider-error"
NO_STOP_REASON = "no-stop-reason"
INTERRUPTED = "interrupted"  # the process stopped while the attempt was streaming

# `disabled`: cut, and the standing grants no continuation; `not-requested`: cut, standing on-request,
# and no (further) segment was asked for.
CONTINUATION_ENDS = ("not-needed", "disabled", "not-requested", "completed", "segment-limit", "token-limit",
                     "no-progress", "repetition", "superseded", "error")


def cut_left_standing(standing: str) -> str:
    """How continuation ended for an output cut at the ceiling that nothing continued (yet)."""
    return "not-requested" if standing == "on-request" else "disabled"

MAX_LINE = 200  # receipts and notices stay compact


def outcome_of_stop(stop_reason: str | None, *, has_tools: bool = False) -> Outcome:
    """What a stream that ended cleanly with this stop reason amounts to. Nothing unknown completes."""
    if stop_reason in COMPLETED_STOPS:
        return "completed"
    if stop_reason in TRUNCATED_STOPS:
        return "truncated"
    if stop_reason == REFUSAL:
        return "refused"
    if stop_reason in TOOL_STOPS and has_tools:
        return "completed"
    return "incomplete"


def status_of_outcome(outcome: Outcome) -> Status:
    """A generation's status is its final attempt's outcome; an abandoned one never stands last."""
    if outcome in ("completed", "truncated", "refused", "failed", "incomplete"):
        return outcome  # type: ignore[return-value]
    if outcome == "streaming":
        return "incomplete"
    raise ValueError(f"an {outcome!r} attempt cannot decide a generation's status")


def stump_cause(status: Status, stop_reason: str | None) -> str | None:
    """Why a generation's canonical text is a stump, or None when it is completed speech."""
    if status == "completed":
        return None
    if status == "failed":
        return PROVIDER_ERROR
    if status == "incomplete" and stop_reason is None:
        return NO_STOP_REASON
    return stop_reason or NO_STOP_REASON


def block_stump_cause(attempt_cause: str | None, block_type: str) -> str | None:
    """Why a non-text block an attempt stopped in is a stump: its attempt's own cause, or None.

    Only text is ever posted, so a reasoning or tool-input block is never speech; it becomes a stump
    when the output stopped inside it (a ceiling reached during reasoning, a tool call's input cut,
    an attempt set aside for a retry), so the cut content stays inspectable. Text blocks are already
    held by the attempt's or the output's stump.
    """
    if attempt_cause is None or block_type == "text":
        return None
    return attempt_cause


# A failure of this process (not of the provider) while calling it: the error kind `internal-<Type>`.
INTERNAL = "internal"


def internal_error(type_name: str) -> str:
    return f"{INTERNAL}-{type_name}"


def is_internal(error: str | None) -> bool:
    """An error kind this process caused; never reported as the provider's."""
    return error is not None and error.startswith(INTERNAL + "-")


def text_kind(status: Status) -> PostKind | None:
    """How a generation's own text is posted: completed → speech; refused → never posted."""
    if status == "completed":
        return "speech"
    if status == "refused":
        return None
    return "partial"


def is_completed_turn(status: Status) -> bool:
    """The one test of whether a text may be treated as a finished, authored turn."""
    return status == "completed"


def fmt_tokens(n: int) -> str:
    return f"{n:,}"


@dataclass(frozen=True)
class Ending:
    """Plain facts about how a generation ended, as the wording below needs them."""
    status: Status
    stop_reason: str | None
    output_tokens: int | None  # the provider's figure for the last segment, None when it gave none
    chars: int
    segments: int = 1
    continuation_ended: str = "not-needed"
    attempts: int = 1
    error: str | None = None  # the last failure's kind, for failed generations
    cut_in: str | None = None  # declared type of the last content block of the output's final attempt
    other_content: bool = False  # that attempt produced content outside text blocks (reasoning, tool input)
    kept_chars: int | None = None  # characters of text kept (a stump), where `chars` counts only visible text


# The process (not the model or provider) stopped mid-output; recovery settles such a generation at
# start-up with stop reason INTERRUPTED and the text that reached the ledger.
INTERRUPTED_SENTENCE = "Process stopped before this output was finished; the remainder was not generated."


def ceiling_sentence(tokens: int | None, during: str = "", tail: str = "the remainder was not generated") -> str:
    at = f" at {fmt_tokens(tokens)} tokens" if tokens is not None else ""
    return f"Output ceiling reached{at}{during}; {tail}."


_CONT_REASON = {
    "segment-limit": "continuation stopped at its segment limit",
    "token-limit": "continuation stopped at its token limit",
    "no-progress": "continuation stopped when a segment added nothing new",
    "repetition": "continuation stopped when a segment repeated earlier text",
    "superseded": "continuation stopped because the room moved on",
    "error": "continuation stopped on a provider error",
}

REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def _during(e: Ending) -> str:
    """Where a cut with no reply text landed, when that was in a block of another kind."""
    if e.cut_in in REASONING_BLOCKS:
        return " during reasoning"
    if e.cut_in is not None and e.cut_in.endswith("tool_use"):
        return " during a tool call's input"
    return ""


def receipt(e: Ending) -> str | None:
    """The one boundary line posted after a cut or interrupted output, or None when none is due.

    The cause is stated as a fact about the model or provider: never as anyone's conduct, never in
    the second person, never quoting the text.
    """
    return _boundary(e, None)


def _boundary(e: Ending, nothing: str | None) -> str | None:
    """The boundary line; `nothing` replaces its tail where no text was generated to post."""
    cut = nothing or "the remainder was not generated"
    maybe = nothing or "the output may be incomplete"
    during = _during(e) if nothing else ""
    parts: list[str] = []
    if e.status == "completed":
        if e.segments <= 1:
            return None
        parts.append(f"Output assembled from {e.segments} segments after the output ceiling; it ended normally.")
    elif e.status == "truncated":
        if e.stop_reason == "model_context_window_exceeded":
            parts.append(f"Model context window filled{during}; {cut}.")
        else:
            parts.append(ceiling_sentence(e.output_tokens, during, cut))
        if e.segments > 1:
            parts.append(f"{e.segments} segments.")
        if e.continuation_ended in _CONT_REASON:
            parts.append(_CONT_REASON[e.continuation_ended].capitalize() + ".")
    elif e.status == "failed":
        if is_internal(e.error):
            assert e.error is not None
            parts.append(f"Internal error ({e.error[len(INTERNAL) + 1:]}) stopped this output; {cut}.")
        else:
            what = f" ({e.error})" if e.error else ""
            parts.append(f"Provider error{what} after {e.attempts} attempt{'s' if e.attempts != 1 else ''}; "
                         f"{cut}.")
    elif e.status == "incomplete":
        if e.stop_reason == INTERRUPTED:
            parts.append(INTERRUPTED_SENTENCE if nothing is None else
                         f"Process stopped before this output was finished; {cut}.")
        elif e.stop_reason is None:
            parts.append(f"Provider stream ended without a stop reason; {maybe}.")
        else:
            parts.append(f"Provider stopped with an unhandled reason ({e.stop_reason}); {maybe}.")
    else:
        return None
    return _compact(" ".join(parts))


def _nothing(e: Ending) -> str:
    """What was generated, where no reply text was: nothing at all, or only reasoning or tool input."""
    return "no reply text was generated" if e.other_content else "no text was generated"


def notice(e: Ending) -> str | None:
    """The factual line for an outcome whose text is not posted at all (a refusal, or no text)."""
    if e.status == "refused":
        kept = e.kept_chars if e.kept_chars is not None else e.chars
        held = "its text is held as a stump" if kept else _nothing(e)
        return f"Provider declined this reply (stop reason: refusal); {held}."
    if e.chars == 0 and e.status in ("failed", "incomplete", "truncated"):
        return _boundary(e, _nothing(e))
    return None


def abandoned_notice(count: int, chars: int) -> str:
    """Optional room line (policy `notices.retry_abandoned`) for attempts set aside for a retry."""
    noun = "attempt" if count == 1 else "attempts"
    return _compact(f"Provider {noun} interrupted and retried; {fmt_tokens(chars)} characters set aside as stumps.")


def declined_continue(reason: str) -> str:
    return _compact(f"Continuation not available: {reason}.")


def context_boundary_note(e: Ending) -> str:
    """The model-visible note placed after a cut output of the resident's own in a later request."""
    if e.status == "truncated":
        if e.stop_reason == "model_context_window_exceeded":
            cause = "the model's context window filled"
        elif e.output_tokens is not None:
            cause = f"the output ceiling of {fmt_tokens(e.output_tokens)} tokens was reached"
        else:
            cause = "the output ceiling was reached"
        return (f"[Boundary: the message above was cut off mid-output because {cause}; the remainder was "
                "not generated. It is an unfinished message, not an authored ending.]")
    if e.status == "failed":
        return ("[Boundary: the message above was interrupted by a provider error; the remainder was not "
                "generated. It is an unfinished message, not an authored ending.]")
    if e.status == "incomplete" and e.stop_reason == INTERRUPTED:
        return ("[Boundary: the message above was cut off mid-output because the process running it stopped; "
                "the remainder was not generated. It is an unfinished message, not an authored ending.]")
    if e.status == "incomplete":
        return ("[Boundary: the message above ended without a stop reason from the provider; it may be "
                "incomplete and is not an authored ending.]")
    return ""


def context_refusal_note() -> str:
    return "[Boundary: the provider declined the previous reply (refusal); its text was not posted.]"


def context_abandoned_note(count: int, chars: int) -> str:
    noun = "attempt" if count == 1 else "attempts"
    return (f"[Note: before the message above, {count} provider {noun} produced {fmt_tokens(chars)} characters "
            "that were set aside when the attempt was retried (retry-abandoned); that text is kept outside "
            "the conversation.]")


def _compact(line: str) -> str:
    line = " ".join(line.split())
    if len(line) > MAX_LINE:
        line = line[: MAX_LINE - 1].rstrip() + "…"
    return line


# A provider key refused (401/403) is the operator's to fix: no retry mends it. Failure kinds as
# `bot.provider` classifies them: the API's error type, or `http-CODE` when the body names none.
KEY_REJECTED = frozenset({"authentication_error", "permission_error", "http-401", "http-403"})
KEY_NOTICE_SECONDS = 600.0  # a room is told of a refused key at most once per channel this often


def key_rejected(error: str | None) -> bool:
    """Whether a failure kind means the provider refused the key itself (HTTP 401 or 403)."""
    return error in KEY_REJECTED


def key_rejected_notice(error: str) -> str:
    """The room's one line, per channel per KEY_NOTICE_SECONDS, when the provider refuses the key."""
    minutes = round(KEY_NOTICE_SECONDS / 60)
    return _compact(f"Provider rejected the API key ({error}); no text was generated. The operator's log has "
                    f"the remedy; further rejections here within {minutes} minutes are not posted.")


def context_room_line_note(author: str, line: str) -> str:
    """Another resident's receipt or notice, as a resident reads it in its context.

    The line is the framework's statement about that resident's output (its wording is this module's),
    so it is set apart as a note, never shown as words the other resident wrote.
    """
    return f"[Boundary note posted with {author}'s output, not written by {author}: {line}]"
