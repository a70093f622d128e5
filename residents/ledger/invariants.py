"""The ledger's promises about its records, checked on rows (`rows.dicts`: texts decoded once) one
generation at a time: every emitted text kept exactly, every cut surfaced once, posts covering each
text exactly once, nothing uncompleted posted as speech. `verify` reads the rows and orders the lines."""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .. import truth
from ..records import Block, PostReason, join_text
from ..text import cover
from ..truth import LIMIT, RECEIPT_PREFIX
from .verify_tools import joined_upto

CUT = frozenset({"truncated", "failed", "incomplete"})
SETTLED = frozenset({"completed", "truncated", "refused", "failed", "incomplete"})
TEXT_KINDS = frozenset({"speech", "partial"})
_SECOND_PERSON = re.compile(r"\b(you|your|yours|yourself)\b", re.IGNORECASE)


# Room lines that are not a generation's boundary line: the optional retry notice, a declined /continue,
# a refused provider key's notice (in place of a line, once per window) and a live attempt set aside. A
# post records why it exists (`posts.reason`); its wording is never parsed here.
_SIDE_NOTICES = frozenset(
    {PostReason.ABANDONED_NOTICE, PostReason.DECLINED_CONTINUE, PostReason.LIVE_SET_ASIDE, PostReason.KEY_REJECTED}
)
# The kinds each reason may be posted as (a spent budget's notice: of no generation, none was made).
_REASON_KINDS: dict[PostReason, frozenset[str]] = dict.fromkeys(
    _SIDE_NOTICES | {PostReason.REFUSAL, PostReason.BUDGET_REACHED}, frozenset({"notice"})
) | {
    PostReason.TEXT: TEXT_KINDS,
    PostReason.RECEIPT: frozenset({"receipt"}),
    PostReason.NO_TEXT: frozenset({"receipt", "notice"}),
    PostReason.RECOVERED: frozenset({"recovered", "receipt"}),
}


@functools.cache
def _status_by_rule(stop_reason: str | None) -> str:
    """residents.truth's rule from a stop reason to a status (the same few answers for every generation)."""
    return truth.status_of_outcome(truth.outcome_of_stop(stop_reason))


Row = dict[str, Any]


@dataclass
class GenerationRows:
    """A generation's row and its records' rows, as `verify` read them: what each check of it reads."""

    g: Row
    attempts: list[Row]
    segments: list[Row]
    stumps: list[Row]
    posts: list[Row]  # its own: not those publishing a stump at its resident's request
    blocks: dict[str, list[Row]]  # by attempt id
    rounds: list[str] | None  # with tool calls: the last attempt of each round (its text is theirs joined)

    @functools.cached_property
    def where(self) -> str:
        return f"generation {self.g['id']}"


def _attempt(a: Row, where: str) -> str:
    """An attempt as its lines name it (made only for a line: most attempts have none)."""
    return f"attempt {a['id']} ({where})"


def check_generation(lines: list[str], r: GenerationRows, chunks: dict[str, int]) -> None:
    """Its records' stored counts; then, once it is settled, its status, texts, stumps and posts."""
    g, text, where, status = r.g, r.g["text"], r.where, r.g["status"]
    for a in r.attempts:
        left = chunks.get(a["id"])
        if a["outcome"] != "streaming" and left:
            lines.append(
                f"{_attempt(a, where)}: settled ({a['outcome']}) but {left} streamed chunk(s) left in attempt_chunks"
            )
        if a["outcome"] != "streaming" and a["chars"] != len(a["text"]):
            lines.append(f"{_attempt(a, where)}: chars {a['chars']} != {len(a['text'])} characters of text")
    for s in r.stumps:
        if s["chars"] != len(s["text"]):
            lines.append(f"stump {s['id']} ({where}): chars {s['chars']} != {len(s['text'])} characters of text")
        if s.get("access_set") not in (None, s["access"]):  # the resident's latest choice is the one in force
            lines.append(
                f"stump {s['id']} ({where}): access {s['access']!r}, but its latest change set {s['access_set']!r}"
            )
    if status == "pending":
        return  # (`verify` reports it unsettled)
    if status not in SETTLED:
        lines.append(f"{where}: unknown status {status!r}")
        return
    if g["chars"] != len(text):
        lines.append(f"{where}: chars {g['chars']} != {len(text)} characters of text")
    # The status follows from the stop reason by bot.truth's rule (a tool stop the loop did not go on
    # from, or the tool round limit, is incomplete); a failed generation stopped for no reason of the model's.
    expected = "failed" if status == "failed" and g["stop_reason"] is None else _status_by_rule(g["stop_reason"])
    if status != expected:
        lines.append(f"{where}: status {status} with stop reason {g['stop_reason']!r} (the rule gives {expected})")
    for a in r.attempts:
        if a["outcome"] == "streaming":
            lines.append(f"attempt {a['id']} ({where}): still streaming in a settled generation")
    _check_texts_kept(lines, r)
    _check_output_stump(lines, r)
    _check_posts(lines, r)


def check_blocks(lines: list[str], r: GenerationRows) -> None:
    """An attempt's text is its text blocks joined; a block stump is its block's content; the non-text
    block a cut attempt stopped in is kept as a stump."""
    where, g = r.where, r.g
    final = r.segments[-1]["attempt_id"] if r.segments else None
    for a in r.attempts:
        block_rows = r.blocks.get(a["id"], [])
        if a["outcome"] == "streaming" or not block_rows:
            continue  # a ledger from before blocks were kept has none
        recs = [Block(b["idx"], b["type"], b["content"]) for b in block_rows]
        lines += [
            f"{_attempt(a, where)}: block {b['idx']} chars {b['chars']} != {rec.chars}"
            for b, rec in zip(block_rows, recs, strict=True)
            if b["chars"] != rec.chars
        ]
        if join_text(recs) != a["text"]:
            lines.append(f"{_attempt(a, where)}: text is not its text blocks joined")
        lines += [
            f"{_attempt(a, where)}: text block {b['idx']} span starts at {b['text_offset']}, not {rec.offset}"
            for b, rec in zip(block_rows, recs, strict=True)
            if rec.is_text and b["text_offset"] != rec.offset
        ]
        cut = recs[-1] if not recs[-1].is_text and recs[-1].content else None
        due = a["outcome"] == "abandoned" or (a["id"] == final and g["status"] not in ("completed", "pending"))
        held = [s for s in r.stumps if s["scope"] == "block" and s["attempt_id"] == a["id"]]
        for s in held:
            match = next((rec for rec in recs if rec.index == s["block"]), None)
            if match is None or match.content != s["text"]:
                lines.append(f"stump {s['id']} ({where}): not the content of block {s['block']} of attempt {a['id']}")
        if cut is not None and due and not any(s["block"] == cut.index for s in held):
            lines.append(
                f"{_attempt(a, where)}: stopped inside {cut.type} block {cut.index} ({cut.chars} characters), "
                "which is kept as no stump"
            )


def _check_texts_kept(lines: list[str], r: GenerationRows) -> None:
    """Every attempt's text is either part of the canonical text (as a segment) or a stump, exactly.

    With tool `rounds`, the one segment is the rounds' text joined, up to its attempt's round."""
    where, text, attempts, segments, rounds = r.where, r.g["text"], r.attempts, r.segments, r.rounds
    by_id = {a["id"]: a for a in attempts}
    in_segment: set[str] = set()
    offset = 0
    for s in segments:
        a = by_id.get(s["attempt_id"])
        if a is None:
            lines.append(f"{where}: segment {s['idx']} names unknown attempt {s['attempt_id']}")
            continue
        in_segment.add(a["id"])
        added = a["text"][s["overlap_removed"] :]
        if rounds and s["idx"] == 1:
            added, used = joined_upto(attempts, rounds, a["id"])
            in_segment |= used
        if s["chars"] != len(added) or text[offset : offset + s["chars"]] != added:
            lines.append(f"{where}: segment {s['idx']} (attempt {a['id']}) is not the canonical text at char {offset}")
        offset += s["chars"]
    if segments and offset != len(text):
        lines.append(f"{where}: segments add up to {offset} characters, text has {len(text)}")
    if not segments and text:
        lines.append(f"{where}: {len(text)} characters of text but no segment")
    for a in attempts:
        abandoned = a["outcome"] == "abandoned"
        if abandoned and a["discard_reason"] != truth.RETRY_ABANDONED:
            lines.append(f"{_attempt(a, where)}: abandoned with discard reason {a['discard_reason']!r}")
        # (a stop may come before the retry)
        if abandoned and a["replaced_by"] is None and r.g["stop_reason"] != truth.INTERRUPTED:
            lines.append(f"{_attempt(a, where)}: abandoned but replaced by no attempt")
        if abandoned and a["id"] in in_segment:
            lines.append(f"{_attempt(a, where)}: abandoned text spliced into the canonical text")
        if not a["text"] or a["outcome"] == "streaming":
            continue
        attempt_stumps = [s for s in r.stumps if s["attempt_id"] == a["id"] and s["scope"] == "attempt"]
        if abandoned:
            match = [s for s in attempt_stumps if s["cause"] == truth.RETRY_ABANDONED]
            if len(match) != 1:
                lines.append(
                    f"{_attempt(a, where)}: abandoned with {len(a['text'])} characters but "
                    f"{len(match)} retry-abandoned stumps"
                )
            for s in match:
                if s["text"] != a["text"]:
                    lines.append(f"stump {s['id']} ({where}): text differs from abandoned attempt {a['id']}")
                # published only at its resident's request, or shown live
                if s["published"] and not s.get("recovered") and not s.get("shown_live"):
                    lines.append(f"stump {s['id']} ({where}): retry-abandoned text marked published")
                if s.get("shown_live") and not s["published"]:
                    lines.append(f"stump {s['id']} ({where}): retry-abandoned text shown live but not marked published")
        elif a["id"] not in in_segment and not any(s["text"] == a["text"] for s in attempt_stumps):
            lines.append(
                f"{_attempt(a, where)}: {len(a['text'])} characters neither in the canonical text nor kept as a stump"
            )


def _check_output_stump(lines: list[str], r: GenerationRows) -> None:
    """A non-completed text stands as exactly one output stump, with the right cause and published flag."""
    where, g, text = r.where, r.g, r.g["text"]
    standing = [s for s in r.stumps if s["scope"] == "output" and s["replaced_by"] is None]
    cause = truth.stump_cause(g["status"], g["stop_reason"])
    if (cause is None or not text) and standing:
        why = "no text" if not text else "no stump cause"
        lines.append(f"{where}: {g['status']} with {why} but {len(standing)} standing output stump(s)")
    if cause is None or not text:
        return
    if len(standing) != 1:
        lines.append(
            f"{where}: {g['status']} text of {len(text)} characters has {len(standing)} standing output stumps"
        )
        return
    s = standing[0]
    if s["text"] != text:
        lines.append(f"stump {s['id']} ({where}): output stump text differs from the canonical text")
    if s["cause"] != cause:
        lines.append(f"stump {s['id']} ({where}): cause {s['cause']!r}, expected '{cause}'")
    text_posts = [p for p in r.posts if p["kind"] in TEXT_KINDS]
    some = any(p["message_id"] is not None for p in text_posts)
    every = bool(text_posts) and all(p["message_id"] is not None for p in text_posts)
    if s["published"] and not some:
        lines.append(f"stump {s['id']} ({where}): marked published but no text post of it was delivered")
    if every and not s["published"]:
        lines.append(f"stump {s['id']} ({where}): its text posts were delivered but it is not marked published")


def _check_posts(lines: list[str], r: GenerationRows) -> None:
    where, g, text, status = r.where, r.g, r.g["text"], r.g["status"]
    attempts, segments, posts = r.attempts, r.segments, r.posts
    # Each /continue that reached the provider is one more settlement with its own posts and receipt;
    # bounded continuation happens inside the first settlement. Tool rounds are never continued.
    on_request = g["standing"] == "on-request" and not r.rounds
    calls = sum(a["segment"] > 1 and a["idx"] == 1 for a in attempts) if on_request else 0
    for p in posts:
        check_line(lines, p, where)
    kinds = {p["kind"] for p in posts}
    text_posts = [p for p in posts if p["kind"] in TEXT_KINDS]
    receipts = [p for p in posts if p["kind"] == "receipt"]
    boundary_notices = [p for p in posts if p["kind"] == "notice" and p["reason"] not in _SIDE_NOTICES]
    if status != "completed" and "speech" in kinds:
        lines.append(f"{where}: speech post for a {status} generation")
    if status == "completed" and calls == 0 and "partial" in kinds:
        lines.append(f"{where}: partial post for a generation completed in one settlement")
    if status == "refused":
        if text_posts:
            lines.append(f"{where}: refused text posted ({len(text_posts)} {text_posts[0]['kind']} post(s))")
        if receipts:
            lines.append(f"{where}: refused generation has {len(receipts)} receipt(s)")
        if len(boundary_notices) != 1:
            lines.append(f"{where}: refused generation has {len(boundary_notices)} notices of the refusal, expected 1")
        return
    problem = cover(text, [p["content"] for p in text_posts])
    if problem:
        lines.append(f"{where}: text posts do not cover the text exactly once: {problem}")
    # The first settlement's boundary line: a receipt after posted text; where no text could be posted
    # (none, or only whitespace) the line still stands, alone. Each /continue adds one receipt.
    first_text = text[: segments[0]["chars"]] if calls and segments else text
    first_status = "truncated" if calls else status
    due = first_status in CUT or (first_status == "completed" and len(segments) > 1)
    visible = bool(first_text.strip())
    want = (1 if due else 0) + calls
    found = len(receipts) + len(boundary_notices)
    # A refused provider key: the room hears of it at most once per channel per window (delivery.keys),
    # so such a failure with nothing to post may stand with no line at all.
    last_error = attempts[-1]["error"] if attempts else None
    withheld = status == "failed" and not (visible or calls or found) and truth.key_rejected(last_error)
    # So may each /continue whose segment was refused for the key (the notice, if any, is a side line).
    failed_continues = [a for a in attempts if a["segment"] > 1 and a["outcome"] == "failed"]
    keyless = sum(truth.key_rejected(a["error"]) for a in failed_continues) if calls else 0
    if not want - keyless <= found <= want and not withheld:
        what = f"{status} generation" + (f" with {calls} continuation(s) on request" if calls else "")
        lines.append(
            f"{where}: {len(receipts)} receipt(s) and {len(boundary_notices)} boundary notice(s) for a {what}"
            f" with {'posted' if visible else 'no visible'} text, expected {want} boundary line(s)"
        )
    elif visible and boundary_notices:
        lines.append(f"{where}: {len(boundary_notices)} boundary notice(s) after posted text, where a receipt is due")


def check_line(lines: list[str], p: dict[str, Any], about: str | None = None) -> None:
    """Posts fit a Discord message; receipts and notices are compact and never in the second person.
    Lines name the post (and `about`: its generation or stump), named only when one is found."""
    content, kind, found = p["content"], p["kind"], []
    if len(content) > LIMIT:
        found.append(f"{len(content)} characters, over the {LIMIT:,} limit")
    if kind in ("receipt", "notice"):
        line = content[len(RECEIPT_PREFIX) :] if content.startswith(RECEIPT_PREFIX) else content
        if len(line) > truth.MAX_LINE:
            found.append(f"{kind} of {len(line)} characters, over {truth.MAX_LINE}")
        if _SECOND_PERSON.search(line):
            found.append(f"{kind} addresses someone in the second person")
    elif kind not in TEXT_KINDS and kind != "recovered":
        found.append(f"unknown post kind {kind!r}")
    reason = p.get("reason")
    if reason is not None and kind not in _REASON_KINDS.get(reason, ()):
        found.append(f"a {kind} post with reason {reason!r}")
    if found:
        who = f"post {p['id']}" + (f" ({about})" if about else "")
        lines += [f"{who}: {what}" for what in found]


def check_recovered(lines: list[str], stumps: dict[str, Row], posts: list[Row]) -> set[str]:
    """Posts that publish a stump: its text exactly once as `recovered` posts, then one receipt, nothing
    else. The stumps whose recovered posts were delivered are returned."""
    by_stump: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in posts:
        by_stump[p["stump_id"]].append(p)
    published = set()
    for sid, ps in by_stump.items():
        ps.sort(key=lambda p: (p["generation_id"] or "", p["seq"]))
        who = f"stump {sid}"
        for p in ps:
            check_line(lines, p, who)
        s = stumps.get(sid)
        if s is None:
            lines.append(f"{who}: published by {len(ps)} post(s) but no such stump")
            continue
        if s["scope"] != "attempt":
            lines.append(f"{who}: a {s['scope']} stump published as recovered text; only set-aside text is")
        kinds = [p["kind"] for p in ps]
        if kinds.count("receipt") != 1 or kinds[-1] != "receipt" or set(kinds[:-1]) != {"recovered"}:
            lines.append(f"{who}: published as {kinds}, not recovered posts followed by one receipt")
        if len({p["generation_id"] for p in ps}) != 1:
            lines.append(f"{who}: published by posts of more than one generation")
        problem = cover(s["text"], [p["content"] for p in ps if p["kind"] == "recovered"])
        if problem:
            lines.append(f"{who}: recovered posts are not its text exactly once: {problem}")
        delivered = [p for p in ps if p["kind"] == "recovered" and p["message_id"] is not None]
        if delivered:
            published.add(sid)
        if delivered and not s["published"]:
            lines.append(f"{who}: its recovered posts were delivered but it is not marked published")
    return published
