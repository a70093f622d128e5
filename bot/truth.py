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

CONTINUATION_ENDS = ("not-needed", "disabled", "completed", "segment-limit", "token-limit",
                     "no-progress", "repetition", "superseded", "error")

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


# The process (not the model or provider) stopped mid-output; recovery settles such a generation at
# start-up with stop reason INTERRUPTED and the text that reached the ledger.
INTERRUPTED_SENTENCE = "Process stopped before this output was finished; the remainder was not generated."


def ceiling_sentence(tokens: int | None) -> str:
    if tokens is None:
        return "Output ceiling reached; the remainder was not generated."
    return f"Output ceiling reached at {fmt_tokens(tokens)} tokens; the remainder was not generated."


_CONT_REASON = {
    "segment-limit": "continuation stopped at its segment limit",
    "token-limit": "continuation stopped at its token limit",
    "no-progress": "continuation stopped when a segment added nothing new",
    "repetition": "continuation stopped when a segment repeated earlier text",
    "superseded": "continuation stopped because the room moved on",
    "error": "continuation stopped on a provider error",
}


def receipt(e: Ending) -> str | None:
    """The one boundary line posted after a cut or interrupted output, or None when none is due.

    The cause is stated as a fact about the model or provider: never as anyone's conduct, never in
    the second person, never quoting the text.
    """
    parts: list[str] = []
    if e.status == "completed":
        if e.segments <= 1:
            return None
        parts.append(f"Output assembled from {e.segments} segments after the output ceiling; it ended normally.")
    elif e.status == "truncated":
        if e.stop_reason == "model_context_window_exceeded":
            parts.append("Model context window filled; the remainder was not generated.")
        else:
            parts.append(ceiling_sentence(e.output_tokens))
        if e.segments > 1:
            parts.append(f"{e.segments} segments.")
        if e.continuation_ended in _CONT_REASON:
            parts.append(_CONT_REASON[e.continuation_ended].capitalize() + ".")
    elif e.status == "failed":
        what = f" ({e.error})" if e.error else ""
        parts.append(f"Provider error{what} after {e.attempts} attempt{'s' if e.attempts != 1 else ''}; "
                     "the remainder was not generated.")
    elif e.status == "incomplete":
        if e.stop_reason == INTERRUPTED:
            parts.append(INTERRUPTED_SENTENCE)
        elif e.stop_reason is None:
            parts.append("Provider stream ended without a stop reason; the output may be incomplete.")
        else:
            parts.append(f"Provider stopped with an unhandled reason ({e.stop_reason}); the output may be incomplete.")
    else:
        return None
    return _compact(" ".join(parts))


def notice(e: Ending) -> str | None:
    """The factual line for an outcome whose text is not posted at all (a refusal, or no text)."""
    if e.status == "refused":
        return "Provider declined this reply (stop reason: refusal); its text is held as a stump."
    if e.chars == 0 and e.status in ("failed", "incomplete", "truncated"):
        line = receipt(e) or ""
        return _compact(line.replace("the remainder was not generated", "no text was generated")
                        .replace("the output may be incomplete", "no text was generated"))
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
