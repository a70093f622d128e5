"""The rules about truth, in one pure place.

Every other module asks here what a stop reason means, what a generation's status is, which texts
are stumps, and what the room and the resident are told at a boundary. Nothing here does I/O or
knows about Discord, SQLite or the SDK, so every rule is a small function over plain data and the
wording of a receipt exists exactly once.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

from .records import Cause, ContinuationEnd, Ending, NotShown, Outcome, PostKind, PostReason, Status

# Stop reasons of both protocols, each kept as the provider gave it: Anthropic Messages' `stop_reason`
# and chat completions' `finish_reason` (`stop`, `length`, `content_filter`, `tool_calls`). The two
# vocabularies share no word, so one rule reads either.
COMPLETED_STOPS = frozenset({"end_turn", "stop_sequence", "stop"})
CEILING_STOPS = frozenset({"max_tokens", "length"})  # the output ceiling: what continuation may continue
TRUNCATED_STOPS = CEILING_STOPS | {"model_context_window_exceeded"}
REFUSAL = Cause.REFUSAL
REFUSAL_STOPS = frozenset({REFUSAL, "content_filter"})
TOOL_STOPS = frozenset({"tool_use", "pause_turn"})
TOOL_USE = "tool_use"  # the stop reason of a round of the tool loop
TOOL_ROUND_STOPS = frozenset({TOOL_USE, "tool_calls"})  # a round of the tool loop, in either protocol


def is_ceiling(stop_reason: str | None) -> bool:
    """Whether a stop reason is the output ceiling (`max_tokens`, or chat completions' `length`)."""
    return stop_reason in CEILING_STOPS


def is_refusal(stop_reason: str | None) -> bool:
    """Whether a stop reason (or a stump's cause) is the provider declining the reply."""
    return stop_reason in REFUSAL_STOPS


def is_tool_round(stop_reason: str | None) -> bool:
    """Whether a stop reason asks for the tool loop's next round (`tool_use`, or chat's `tool_calls`)."""
    return stop_reason in TOOL_ROUND_STOPS


def chat_stop_reason(finish_reason: str | None, refusal_text: bool, tool_calls: bool = False) -> str | None:
    """The stop reason of a chat-completions stream: its `finish_reason` as given, except that a stream
    whose model wrote a `refusal` (not content) and stopped is the provider declining the reply, and one
    that called tools and said `stop` (as Gemini's compatible endpoint does) is a round of the tool loop."""
    if refusal_text and finish_reason in (None, "stop"):
        return REFUSAL
    if tool_calls and finish_reason == "stop":
        return "tool_calls"
    return finish_reason


# Discard and stump causes that are not provider stop reasons.
RETRY_ABANDONED = Cause.RETRY_ABANDONED
PROVIDER_ERROR = Cause.PROVIDER_ERROR
NO_STOP_REASON = Cause.NO_STOP_REASON
INTERRUPTED = Cause.INTERRUPTED  # the process stopped while the attempt was streaming
TAKEN_OVER = Cause.TAKEN_OVER  # streamed on after another process took the bot over (`ledger.Superseded`)


def continuation_ended_words(ended: str, standing: str) -> str:
    """How continuation ended, as a reader is told it. The recorded value stays the contract's
    (`disabled` for a cut nothing continued); under an on-request standing that reads as what it is."""
    if ended == ContinuationEnd.DISABLED and standing == "on-request":
        return "not requested"
    return str(ended).replace("-", " ")


MAX_LINE = 200  # receipts and notices stay compact
LIMIT = 2000  # characters in one Discord message: delivery splits to it, the ledger's verify holds posts to it
RECEIPT_PREFIX = "-# "  # Discord's subtext: a compact line that reads as a boundary, not speech


def outcome_of_stop(stop_reason: str | None, *, has_tools: bool = False) -> Outcome:
    """What a stream that ended cleanly with this stop reason amounts to. Nothing unknown completes."""
    if stop_reason in COMPLETED_STOPS:
        return Outcome.COMPLETED
    if stop_reason in TRUNCATED_STOPS:
        return Outcome.TRUNCATED
    if stop_reason in REFUSAL_STOPS:
        return Outcome.REFUSED
    if stop_reason in TOOL_ROUND_STOPS and has_tools:  # a round of the tool loop; `pause_turn` is never resumed here
        return Outcome.COMPLETED
    return Outcome.INCOMPLETE


def status_of_outcome(outcome: Outcome) -> Status:
    """A generation's status is its final attempt's outcome; an abandoned one never stands last."""
    if outcome in (Outcome.COMPLETED, Outcome.TRUNCATED, Outcome.REFUSED, Outcome.FAILED, Outcome.INCOMPLETE):
        return Status(outcome)
    if outcome == Outcome.STREAMING:
        return Status.INCOMPLETE
    raise ValueError(f"an '{outcome}' attempt cannot decide a generation's status")


def stump_cause(status: Status, stop_reason: str | None) -> Cause | str | None:
    """Why a generation's canonical text is a stump, or None when it is completed speech.

    A stop reason this project names is its `Cause`; one it does not know is kept as given."""
    if status == Status.COMPLETED:
        return None
    if status == Status.FAILED:
        return PROVIDER_ERROR
    if not stop_reason:
        return NO_STOP_REASON
    return _CAUSES.get(stop_reason, stop_reason)


_CAUSES: dict[str, Cause] = {c.value: c for c in Cause}


def block_stump_cause(attempt_cause: Cause | str | None, block_type: str) -> Cause | str | None:
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
    if status == Status.COMPLETED:
        return PostKind.SPEECH
    if status == Status.REFUSED:
        return None
    return PostKind.PARTIAL


def is_completed_turn(status: Status) -> bool:
    """The one test of whether a text may be treated as a finished, authored turn."""
    return status == Status.COMPLETED


def fmt_tokens(n: int) -> str:
    return f"{n:,}"


# The process (not the model or provider) stopped mid-output; recovery settles such a generation at
# start-up with stop reason INTERRUPTED and the text that reached the ledger.
INTERRUPTED_SENTENCE = "Process stopped before this output was finished; the remainder was not generated."


def ceiling_sentence(tokens: int | None, during: str = "", tail: str = "the remainder was not generated") -> str:
    """The provider's own count where it gave one; where it gave none, the line says so (never an estimate)."""
    at = f" at {fmt_tokens(tokens)} tokens" if tokens is not None else " (token count not reported by the provider)"
    return f"Output ceiling reached{at}{during}; {tail}."


_CONT_REASON = {
    ContinuationEnd.SEGMENT_LIMIT: "continuation stopped at its segment limit",
    ContinuationEnd.TOKEN_LIMIT: "continuation stopped at its token limit",
    ContinuationEnd.NO_PROGRESS: "continuation stopped when a segment added nothing new",
    ContinuationEnd.REPETITION: "continuation stopped when a segment repeated earlier text",
    ContinuationEnd.SUPERSEDED: "continuation stopped because the room moved on",
    ContinuationEnd.ERROR: "continuation stopped on a provider error",
}


def _continuation_stop(e: Ending) -> str | None:
    """Why continuation stopped, as it was. `error` (the replay contract's value) stands for every segment
    that neither completed nor was cut at the ceiling, so its wording follows that segment's own outcome."""
    if e.continuation_ended != "error":
        return _CONT_REASON.get(e.continuation_ended)
    if e.last_outcome == "refused":
        return "continuation stopped when the provider declined a segment"
    if e.last_outcome == "incomplete":
        return "continuation stopped when a segment ended without a usable stop reason"
    if e.last_outcome == "failed" and is_internal(e.error):
        return "continuation stopped on an internal error"
    if e.last_outcome == "truncated" and e.stop_reason == "model_context_window_exceeded":
        return "continuation stopped when the model context window filled"
    return _CONT_REASON[ContinuationEnd.ERROR]


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
        why = _continuation_stop(e)
        if why:
            parts.append(why.capitalize() + ".")
    elif e.status == "failed":
        if is_internal(e.error):
            assert e.error is not None
            parts.append(f"Internal error ({e.error[len(INTERNAL) + 1 :]}) stopped this output; {cut}.")
        else:
            what = f" ({e.error})" if e.error else ""
            parts.append(f"Provider error{what} after {e.attempts} attempt{'s' if e.attempts != 1 else ''}; {cut}.")
    elif e.status == "incomplete":
        if e.stop_reason == INTERRUPTED:
            parts.append(
                INTERRUPTED_SENTENCE if nothing is None else f"Process stopped before this output was finished; {cut}."
            )
        elif e.stop_reason == TOOL_ROUND_LIMIT:
            parts.append(f"Tool round limit reached; a further tool call was not run, and {maybe}.")
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


def no_text_line_kind(status: Status) -> PostKind:
    """The kind of the one line posted for an outcome with no text to post.

    A cut is a cut even when it landed before any reply text (inside reasoning, say): its line is the
    output's receipt. A refusal, or a failure with nothing emitted, is told in a notice.
    """
    return PostKind.RECEIPT if status == Status.TRUNCATED else PostKind.NOTICE


def no_text_line_reason(status: Status) -> PostReason:
    """Why the one line posted for an outcome with no text exists: a refusal, or an output with no text."""
    return PostReason.REFUSAL if status == Status.REFUSED else PostReason.NO_TEXT


def notice(e: Ending) -> str | None:
    """The factual line for an outcome whose text is not posted at all (a refusal, or no text)."""
    if e.status == "refused":
        kept = e.kept_chars if e.kept_chars is not None else e.chars
        held = "its text is held as a stump" if kept else _nothing(e)
        return f"Provider declined this reply (stop reason: {e.stop_reason or REFUSAL}); {held}."
    if e.chars == 0 and e.status in ("failed", "incomplete", "truncated"):
        return _boundary(e, _nothing(e))
    return None


def abandoned_notice(count: int, chars: int) -> str:
    """Optional room line (policy `notices.retry_abandoned`) for attempts set aside for a retry."""
    noun = "attempt" if count == 1 else "attempts"
    kept = "as a stump" if count == 1 else "as stumps"
    return _compact(f"Provider {noun} interrupted and retried; {fmt_tokens(chars)} characters set aside {kept}.")


def standing_refusal(standing: str, residence: str, generation_id: str | None = None) -> Declined | None:
    """Why a /continue may not run under a residence's continuation standing, or None: only `on-request` allows it."""
    if standing != "on-request":
        return Declined("standing", residence, generation_id, standing)
    return None


# Shown at the end of a reply's live message while it is still being generated; never in the ledger,
# never left after the reply settles. A cursor, not words: it reads as "still being written".
LIVE_MARKER = " \u258d"


def live_set_aside_notice(chars: int) -> str:
    """One room line when a provider attempt whose text was already shown live is set aside for a retry."""
    return _compact(
        f"Provider attempt set aside after {fmt_tokens(chars)} characters shown; a new attempt follows as new messages."
    )


# Why a /continue makes no provider call, each worded once below from the facts it names.
DeclineReason = Literal[
    "unknown-generation",
    "no-generation-here",
    "standing",
    "not-cut",
    "no-request",
    "tool-calls",
    "stopped",
    "already-continued",
]

_DECLINED: dict[str, str] = {
    "unknown-generation": "no generation {generation_id} of {residence}",
    "no-generation-here": "{residence} has no generation here",
    "standing": "the continuation standing of {residence} is {detail}, not on-request",
    "not-cut": "generation {generation_id} is {detail}, not cut at the output ceiling",
    "no-request": "generation {generation_id} has no recorded request to continue",
    "tool-calls": "generation {generation_id} made tool calls, and continuation never mixes with the tool loop",
    "stopped": "continuation of {generation_id} stopped: {detail}",
    # A Continue button pressed, or a /continue asked, for an output continued since (a double-click, two at once)
    "already-continued": "generation {generation_id} was continued meanwhile; it has {detail} segments now",
}


@dataclass(frozen=True)
class Declined:
    """A /continue declined, as facts: the reason, whose, which generation, and the one fact the reason
    names (`standing`: the standing; `not-cut`: the status; `stopped`: the continuation's ending)."""

    reason: DeclineReason
    residence: str
    generation_id: str | None = None
    detail: str | None = None


def declined_reason(d: Declined) -> str:
    """The reason a /continue was declined, as a clause (in the room's notice and a moderator's answer)."""
    return _DECLINED[d.reason].format(residence=d.residence, generation_id=d.generation_id, detail=d.detail)


def declined_continue(d: Declined) -> str:
    """The room's notice for a declined /continue."""
    return _compact(f"Continuation not available: {declined_reason(d)}.")


def not_continued(d: Declined) -> str:
    """A moderator's own (ephemeral) answer to a /continue that was declined."""
    return f"Not continued: {declined_reason(d)}."


def continue_not_taken(residence: str, generation_id: str, seconds: float) -> str:
    """A moderator's answer to a /continue carried to another process when none driving the resident's bot
    took it in time: nothing ran, and the request was withdrawn so nothing will run of it later."""
    return (
        f"Not continued: no process driving {residence}'s bot took /continue {generation_id} within {seconds:g} s"
        " (its bot may be changing hands); the request is withdrawn and will not run later."
    )


def continue_not_answered(residence: str, generation_id: str, why: str) -> str:
    """A moderator's answer when the process that took a carried /continue gave none back: whether it ran is
    the ledger's to say, not a guess (`why`: it stopped, or the wait's bound passed)."""
    return (
        f"/continue {generation_id} was taken by the process driving {residence}'s bot, which {why};"
        f" /generation show {generation_id} tells what became of it."
    )


def continue_label(left: int) -> str:
    """The Continue button's label on a cut output's receipt: how many continuations its policy still allows."""
    return f"Continue ({left} left)"


# Who may press a Continue button (policy `continuation.button`), as a refused press is told it.
_PRESSERS: dict[str, str] = {
    "moderators": "moderators of this channel",
    "asker": "moderators of this channel and the person this reply answered",
}


def press_refused(button: str, residence: str) -> str:
    """The (ephemeral) answer to a Continue press its policy does not allow: who may press, as a fact."""
    return f"Continuing this output is for {_PRESSERS[button]}, under the continuation policy of {residence}."


def context_boundary_note(e: Ending) -> str:
    """The model-visible note placed after a cut output of the resident's own in a later request."""
    if e.status == "truncated":
        if e.stop_reason == "model_context_window_exceeded":
            cause = "the model's context window filled"
        elif e.output_tokens is not None:
            cause = f"the output ceiling of {fmt_tokens(e.output_tokens)} tokens was reached"
        else:
            cause = "the output ceiling was reached"
        return (
            f"[Boundary: the message above was cut off mid-output because {cause}; the remainder was "
            "not generated. It is an unfinished message, not an authored ending.]"
        )
    if e.status == "failed":
        return (
            "[Boundary: the message above was interrupted by a provider error; the remainder was not "
            "generated. It is an unfinished message, not an authored ending.]"
        )
    if e.status == "incomplete" and e.stop_reason == TOOL_ROUND_LIMIT:
        return (
            "[Boundary: the message above ended at the tool round limit; a further tool call was not run, "
            "so it may be incomplete and is not an authored ending.]"
        )
    if e.status == "incomplete" and e.stop_reason == INTERRUPTED:
        return (
            "[Boundary: the message above was cut off mid-output because the process running it stopped; "
            "the remainder was not generated. It is an unfinished message, not an authored ending.]"
        )
    if e.status == "incomplete":
        return (
            "[Boundary: the message above ended without a stop reason from the provider; it may be "
            "incomplete and is not an authored ending.]"
        )
    return ""


def context_refusal_note(stop_reason: str | None = REFUSAL) -> str:
    """The stop reason as the provider gave it: `refusal`, or chat completions' `content_filter`."""
    return f"[Boundary: the provider declined the previous reply ({stop_reason or REFUSAL}); its text was not posted.]"


def context_set_aside_header(cause: str, chars: int) -> str:
    """The line above a resident's own set-aside text, where its policy lets it read that text
    (`stumps.resident_reads_own`); each line of the text follows it, marked (`residents.context.marks`)."""
    return f"[Text set aside ({cause}, {fmt_tokens(chars)} characters), shown by policy:]"


def context_abandoned_note(count: int, chars: int) -> str:
    noun = "attempt" if count == 1 else "attempts"
    return (
        f"[Note: before the message above, {count} provider {noun} produced {fmt_tokens(chars)} characters "
        "that were set aside when the attempt was retried (retry-abandoned); that text is kept outside "
        "the conversation.]"
    )


def _compact(line: str) -> str:
    line = " ".join(line.split())
    if len(line) > MAX_LINE:
        line = line[: MAX_LINE - 1].rstrip() + "…"
    return line


# A provider key refused (401/403) is the operator's to fix: no retry mends it. Failure kinds as
# `residents.provider` classifies them: the API's error type, or `http-CODE` when the body names none.
KEY_REJECTED = frozenset({"authentication_error", "permission_error", "http-401", "http-403"})
KEY_NOTICE_SECONDS = 600.0  # a room is told of a refused key at most once per channel this often


def key_rejected(error: str | None) -> bool:
    """Whether a failure kind means the provider refused the key itself (HTTP 401 or 403)."""
    return error in KEY_REJECTED


def key_rejected_notice(error: str) -> str:
    """The room's one line, per channel per KEY_NOTICE_SECONDS, when the provider refuses the key."""
    minutes = round(KEY_NOTICE_SECONDS / 60)
    return _compact(
        f"Provider rejected the API key ({error}); no text was generated. The operator's log has "
        f"the remedy; further rejections here within {minutes} minutes are not posted."
    )


# A daily token budget (`policy.budgets`): which tokens it counts, and whose.
BUDGET_TOKENS = ("input", "output")
BUDGET_SCOPES = ("residence", "person")


def budget_notice(tokens: str, scope: str, budget: int) -> str:
    """The room's one line, per channel per UTC day, when a daily budget is spent and a reply is not
    generated: a fact about the budget, never about whoever asked."""
    whose = " per person" if scope == "person" else ""
    return _compact(f"Daily {tokens} budget{whose} of {fmt_tokens(budget)} tokens reached; no reply was generated.")


def context_room_line_note(author: str, line: str) -> str:
    """Another resident's receipt or notice, as a resident reads it in its context.

    The line is the framework's statement about that resident's output (its wording is this module's),
    so it is set apart as a note, never shown as words the other resident wrote.
    """
    return f"[Boundary note posted with {author}'s output, not written by {author}: {line}]"


# ---------------------------------------------------------------- the resident's own `stumps` tool

# The generation's stop reason (not a provider's) when the model asked for one more tool round than
# the policy's `tools.max_rounds` allows: the generation is `incomplete`, and this is its stump cause.
TOOL_ROUND_LIMIT = "tool-round-limit"

STUMPS_TOOL = "stumps"
STUMPS_TOOL_DESCRIPTION = (
    "Texts of this resident's own that exist but were not published as completed speech, in this channel: "
    "attempts set aside when the provider failed and was retried, continuation segments set aside, outputs "
    "cut at the output ceiling or declined by the provider. Actions: `list` (metadata: id, cause, characters, "
    "tokens, when, channel, access, who has read the text and when); `read` with `id` (the exact text); "
    "`set_access` with `id` and `access` (`moderators`: moderators may read the text where the operator's "
    "policy allows; `private`: they may not); `publish` with `id` (posts a set-aside text into its channel, "
    "followed by one line saying it was recovered at this resident's request). The resident decides."
)

# Where a published stump's text came from, by its cause; a cause not listed is named as it is.
_RECOVERED_FROM = {
    RETRY_ABANDONED: "an abandoned attempt",
    "no-progress": "a continuation segment set aside (no progress)",
    "repetition": "a continuation segment set aside (repetition)",
    INTERRUPTED: "an output interrupted by a process stop",
    PROVIDER_ERROR: "an attempt ended by a provider error",
    TAKEN_OVER: "an attempt streamed after its bot moved to another process",
}


def recovered_receipt(chars: int, cause: str) -> str:
    """The one line after a stump's text published at its resident's request (post kind `recovered`)."""
    origin = _RECOVERED_FROM.get(cause, f"a text set aside ({cause})")
    return _compact(
        f"Recovered fragment of {fmt_tokens(chars)} characters from {origin}, published at the resident's request."
    )


def context_recovered_note(chars: int, cause: str) -> str:
    """The model-visible note after a stump's text this resident published, in a later request."""
    origin = _RECOVERED_FROM.get(cause, f"a text set aside ({cause})")
    return (
        f"[Note: the message above is a recovered fragment of {fmt_tokens(chars)} characters from {origin}, "
        "published later at this resident's request; it is not a reply written at that point.]"
    )


# Provenance: anyone who can see a channel may check a resident's post there against the ledger
# (`residents.discord.cogs.provenance`). The answer is figures and hashes; these are its sentences.
PROVENANCE_NOT_FOUND = "No post of a resident is recorded for that message here."
PROVENANCE_HASHES = (
    "Hashes are SHA-256: of a post's content as posted (UTF-8), of a text's exact bytes in the "
    "ledger; each ledger entry's hash covers every entry before it."
)
PROVENANCE_MISMATCH = "The ledger no longer matches this entry: the record was changed after the entry was written."


def provenance_bad_ref(ref: str) -> str:
    """The answer to a `/provenance message:` that is neither a message link nor a message id."""
    return f"Not a message link or id: {ref[:100]!r}."


def provenance_closes(count: int) -> str:
    """Heads the list of the text posts a receipt closes, each with its own hash."""
    return (
        f"This receipt closes {count} text post{'' if count == 1 else 's'}:"
        if count
        else "This receipt closes no text post (none was posted)."
    )


# The chain's head, where witnesses are: a checkpoint line in a channel (`ledger.checkpoints` in
# residents.yaml, `residents.discord.checkpoints`) and /provenance give it as `N:SHA256` — the latest
# entry's sequence number and hash — which a witness keeps and `residents ledger verify --head` checks.
# A checkpoint post is not itself recorded in the ledger: the head it names stays the head until a
# resident's next record, so an idle ledger shows the same head at every checkpoint.


def head_ref(seq: int, digest: str) -> str:
    """A chain head as a witness copies it and `residents ledger verify --head` reads it: `N:SHA256`."""
    return f"{seq}:{digest}"


def checkpoint_line(head: tuple[int, str] | None, at: float) -> str:
    """The subtext line a checkpoint posts: when (UTC, to the second) and the head then, ready to paste."""
    when = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if head is None:
        return f"{RECEIPT_PREFIX}Ledger checkpoint at {when}: the chain is empty (no entry yet)."
    return (
        f"{RECEIPT_PREFIX}Ledger checkpoint at {when}: head `{head_ref(*head)}` "
        "(entry:SHA-256; `residents ledger verify --head` checks it later)"
    )


def provenance_head(head: tuple[int, str] | None) -> str:
    """The last line but one of every /provenance answer: the chain's head as it is now, ready to paste."""
    if head is None:
        return "Ledger head: none yet (the chain is empty)."
    return f"Ledger head now: {head_ref(*head)} (entry {head[0]:,}; keep it to check the ledger later)"


# ----- attachments: what a resident's request carries of the files people post (bot.context.attachments)

IMAGE_LIMIT = 5 * 1024 * 1024  # of one image block's base64 data (what Anthropic counts): 3.75 MB of file
TEXT_LIMIT = 100 * 1024  # bytes of one text file given inline
IMAGE_SIDE_LIMIT = 8000  # pixels on either side of an image Anthropic takes; larger ones refuse the request
IMAGES_PER_MESSAGE = 4
IMAGES_PER_REQUEST = 20  # the newest messages' images first; older ones are described
IMAGE_BYTES_PER_REQUEST = 20 * 1024 * 1024  # raw bytes (base64 adds a third) under the provider's request size

# A request's budget for the files it carries inline (policy `attachments.request_budget_tokens`), in the
# unit of the model's context window. A file is counted before it is sent, so by a stated rule, not by a
# provider's figure: a text file's inline text at 4 bytes (UTF-8) a token, rounded up, and an image at
# the most an image block costs on Anthropic's models (about (width x height) / 750 tokens after it is
# scaled to fit 1,568 pixels a side and 1.15 megapixels: at most ~1,600).
BYTES_PER_TOKEN = 4
IMAGE_TOKENS = 1_600
FILE_BUDGET_SHARE = 4  # without a policy budget, files take at most a quarter of the model's context window


def file_budget(context_window: int) -> int:
    """The default budget for a request's inline files: a quarter of the model's context window, which
    leaves the rest to the system prompt, the room's history and the output."""
    return context_window // FILE_BUDGET_SHARE


def file_tokens(inline_text: str | None, image: bool) -> int:
    """What one file costs the budget: an image `IMAGE_TOKENS`, inline text its UTF-8 bytes at `BYTES_PER_TOKEN`."""
    if image:
        return IMAGE_TOKENS
    return -(-len((inline_text or "").encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)


def fmt_size(n: int) -> str:
    """A file size as people read it: `812 bytes`, `34.2 KB`, `2.1 MB` (powers of 1,024)."""
    if n < 1024:
        return f"{n:,} byte{'' if n == 1 else 's'}"
    value, unit = (n / 1024, "KB") if n < 1024 * 1024 else (n / (1024 * 1024), "MB")
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


def _not_shown(reason: NotShown, kind: str, budget: int) -> str:
    match reason:
        case NotShown.UNSUPPORTED:
            return "type not supported"
        case NotShown.NOT_UTF8:
            return "text not valid UTF-8"
        case NotShown.TOO_LARGE if kind == "image":
            return f"larger than the {fmt_size(IMAGE_LIMIT)} image limit once base64-encoded"
        case NotShown.TOO_LARGE if kind == "text":
            return f"larger than the {fmt_size(TEXT_LIMIT)} text limit"
        case NotShown.TOO_LARGE:  # not read, of no declared kind: over the largest limit there is
            return f"larger than {fmt_size(max(IMAGE_LIMIT, TEXT_LIMIT))}"
        case NotShown.TOO_MANY_PIXELS:
            return f"over {IMAGE_SIDE_LIMIT:,} pixels on a side"
        case NotShown.TOO_MANY:
            return f"more than {IMAGES_PER_MESSAGE} images in one message"
        case NotShown.NO_IMAGES:
            return "this model takes no images"
        case NotShown.REQUEST_LIMIT:
            return "image limit of this request reached"
        case NotShown.OVER_BUDGET:
            return f"does not fit this request's file budget of {fmt_tokens(budget)} tokens (newer files first)"
        case NotShown.UNAVAILABLE:
            return "file could not be fetched"
    return str(reason)


def attachment_line(name: str, size: int, reason: NotShown, kind: str = "", budget: int = 0) -> str:
    """The one line a resident sees for a file not shown: `[attachment: report.pdf, 2.1 MB, not shown: type
    not supported]`. `kind` (`image` or `text`) names the limit a file too large went over; `budget`, the
    request's file budget in tokens, the one a file over it did not fit (`over-budget`)."""
    return f"[attachment: {name}, {fmt_size(size)}, not shown: {_not_shown(reason, kind or 'file', budget)}]"


def attachment_text_header(name: str, size: int) -> str:
    """The line above a text file given inline; each line of the file's text follows it, marked `| `
    (`residents.context.marks`), so no line of a file can pass for a note."""
    return f"[attachment: {name}, {fmt_size(size)}, text:]"


def attachment_image_label(name: str, size: int) -> str:
    """The text block just before an image block: which file the image is."""
    return f"[attachment: {name}, {fmt_size(size)}, image:]"


def image_not_resent(media_type: str, sha256: str) -> str:
    """In a request rebuilt from the ledger (a later /continue), an image whose bytes the ledger does not keep."""
    return f"[image {media_type}, SHA-256 {sha256[:12]}…, not resent: the ledger keeps no attachment bytes]"
