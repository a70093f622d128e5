"""Readable forms of ledger records, shared by the CLI and the moderators' slash commands."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from .. import truth
from ..records import Block, Generation, Post, SharedFile, Stump, ToolCall
from . import chain
from .chain import Entry
from .connection import Connection

# A Discord message link: https://discord.com/channels/GUILD/CHANNEL/MESSAGE (or @me for a DM).
MESSAGE_LINK = re.compile(r"/channels/(?:\d+|@me)/\d+/(\d+)")


def message_id_of(ref: str) -> str | None:
    """The message id a reference names (a link to the message, or its id), or None for any other ref."""
    ref = ref.strip()
    m = MESSAGE_LINK.search(ref)
    return m.group(1) if m else (ref if ref.isdigit() else None)


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def tokens(n: int | None) -> str:
    return f"{n:,}" if n is not None else "n/a"


def generation_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no generations"
    head = (
        f"{'id':<22} {'when (UTC)':<19} {'residence':<12} {'status':<10} {'stop':<14} {'chars':>8} {'tokens':>8} "
        f"{'att':>3} {'stumps':>6}  continuation"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['id']:<22} {when(r['created_at']):<19} {r['residence'][:12]:<12} {r['status']:<10} "
            f"{(r['stop_reason'] or '-')[:14]:<14} {r['chars']:>8,} {tokens(r['output_tokens']):>8} "
            f"{r['attempts']:>3} {r['stumps']:>6}  {truth.continuation_ended_words(r['continuation_ended'], r['standing'])}"
        )
    return "\n".join(lines)


def stump_line(s: Stump) -> str:
    return (
        f"{s.id}  {s.cause:<16} {s.chars:>7,} chars  {tokens(s.output_tokens):>7} tokens  "
        + (f"{s.block_type} block #{s.block}  " if s.scope == "block" else "")
        + f"{'published' if s.published else 'unpublished':<11}  {when(s.created_at)}  {s.residence}"
        + (f"  replaced by {s.replaced_by}" if s.replaced_by else "")
    )


def stump_table(stumps: list[Stump]) -> str:
    return "\n".join(stump_line(s) for s in stumps) if stumps else "no stumps"


def block_list(blocks: list[Block]) -> str:
    """An attempt's content blocks by index, type and size (and a text block's span), never their content."""
    return " · ".join(
        f"#{b.index} {b.type} {b.chars:,} chars"
        + (f" [{b.offset:,}–{b.offset + b.chars:,}]" if b.offset is not None and b.is_text else "")
        for b in blocks
    )


def tool_round_line(c: ToolCall) -> str:
    """One tool call by round, name, action and verdict: never its result (a `read` result is stump text)."""
    action = c.input.get("action") if isinstance(c.input, dict) else None
    return (
        f"  round {c.round}.{c.pos + 1} {c.name}"
        + (f" {action}" if isinstance(action, str) else "")
        + f" by {c.attempt_id}: {'error' if c.is_error else 'ok'}"
    )


def attachment_line(f: SharedFile) -> str:
    how = f"described ({f.reason})" if f.reason is not None else f"shown as {f.shown}"
    digest = f"sha256 {f.sha256}" if f.sha256 else "bytes not read"
    return f"{f.name} · {f.media_type or 'type unknown'} · {f.size:,} bytes · {digest} · {how} · message {f.message_id}"


def provenance(g: Generation, calls: list[ToolCall] | None = None) -> list[str]:
    """A generation's provenance without any of its text: what moderators and operators inspect first."""
    lines = [
        f"generation {g.id} · {g.residence} · {g.model}",
        f"status {g.status} · stop {g.stop_reason or 'none'} · {g.chars:,} chars · {tokens(g.output_tokens)} tokens",
        f"continuation: standing {g.standing}, ended {truth.continuation_ended_words(g.continuation_ended, g.standing)}",
        f"created {when(g.created_at)} UTC, settled {when(g.finished_at)} UTC",
        "attempts:",
    ]
    for a in g.attempts:
        why = a.stop_reason or a.discard_reason or a.error or "-"
        lines.append(
            f"  {a.id} seg {a.segment} #{a.index} {a.outcome:<10} {why:<16} {a.chars:>7,} chars "
            f"{tokens(a.output_tokens):>7} tokens"
            + (f" error {a.error}" if a.error and a.error != why else "")
            + (f" → {a.replaced_by}" if a.replaced_by else "")
            + (f" ({a.stop_details.get('category')})" if a.stop_details and a.stop_details.get("category") else "")
            + (
                f" · request: {a.request_replacements} lone surrogate(s) sent as U+FFFD"
                if a.request_replacements
                else ""
            )
        )
        blocks = a.content_blocks()
        if len(blocks) > 1 or any(not b.is_text for b in blocks):
            lines.append("    blocks: " + block_list(blocks))
    if g.segments:
        lines.append("segments:")
        for s in g.segments:
            lines.append(
                f"  {s.index}: {s.attempt_id} stop {s.stop_reason or 'none'} +{s.chars:,} chars "
                f"{tokens(s.output_tokens)} tokens, overlap removed {s.overlap_removed}"
            )
    if calls:
        lines.append("tool rounds:")
        lines += [tool_round_line(c) for c in calls]
    if g.stumps:
        lines.append("stumps:")
        lines += ["  " + stump_line(s) for s in g.stumps]
    if g.attachments:
        lines.append("attachments (name, type, size and SHA-256; the ledger keeps no file's bytes):")
        lines += ["  " + attachment_line(f) for f in g.attachments]
    if g.posts:
        lines.append("posts:")
        for p in g.posts:
            lines.append(f"  {p.seq}. {p.kind:<8} {len(p.content):>5} chars  {delivery(p)}")
    return lines


def delivery(p: Post) -> str:
    """Where a post went: its message, set aside as the room refused it (with the refusal), or still waiting."""
    if p.message_id is not None:
        return f"message {p.message_id}"
    if p.refused is not None:
        return f"not delivered: refused by the room at {when(p.refused_at)} UTC ({p.refused}); set aside"
    return "message not delivered"


def refused_line(p: Post) -> str:
    """A transcript's line for a post the room refused: which part of which reply is missing there, and why."""
    of = f" of generation {p.generation_id}" if p.generation_id else ""
    return f"{p.kind} post {p.seq}{of}: {delivery(p)}"


def show(
    rec: Generation | Stump,
    calls: list[ToolCall] | None = None,
    access: str | None = None,
    reads: list[dict[str, Any]] | None = None,
) -> str:
    if isinstance(rec, Stump):
        head = [stump_line(rec), f"generation {rec.generation_id}, attempt {rec.attempt_id}"]
        if access is not None:
            head.append(f"access: {access}")
        if reads is not None:
            head.append(
                "text read by: "
                + (
                    "nobody yet"
                    if not reads
                    else ", ".join(f"{r['reader']} ({r['kind']}) at {when(r['at'])}" for r in reads)
                )
            )
        return "\n".join([*head, "", rec.text])
    return "\n".join(provenance(rec, calls) + ["", "text:", rec.text])


def _entry_line(entry: Entry | None, now: dict[str, Any]) -> list[str]:
    """Which chain entry records a record, and a warning when the record no longer says what it does."""
    if entry is None:
        return ["  ledger entry: none"]
    lines = [f"  ledger entry {entry.seq} · hash {entry.hash}"]
    stated = json.loads(entry.body)
    if any(stated.get(k) != v for k, v in now.items()):
        lines.append("  " + truth.PROVENANCE_MISMATCH)
    return lines


def post_provenance(
    message_id: str,
    post: Post,
    g: Generation | None,
    closes: list[Post],
    entries: dict[tuple[str, str], Entry],
    head: tuple[int, str] | None,
) -> list[str]:
    """What any witness of a post may know of it: metadata and hashes, never any text (no stump, no reasoning).

    `entries` maps (kind, record id) to the latest chain entry of that record; `closes` are the text posts
    a receipt closes (`closed_by`); `head` is the chain's last entry (sequence number, hash), if any.
    """

    def post_lines(p: Post, label: str, indent: str = "  ") -> list[str]:
        now = chain.post_payload(p)
        out = [f"sha256 {chain.sent_sha256(p.content)}"]
        if "sent_sha256" in now:
            out.append(
                f"sha256 of the exact text in the ledger {now['content_sha256']} "
                f"({p.replacements} lone surrogate(s) posted as U+FFFD)"
            )
        out += [line.strip() for line in _entry_line(entries.get(("post", p.id)), now)]
        sent = entries.get(("delivered", p.id))
        if sent is not None:
            out.append(f"delivered as message {p.message_id}: entry {sent.seq}")
        return [label] + [indent + line for line in out]

    where = f" of generation {post.generation_id}" if post.generation_id else ""
    lines = post_lines(post, f"message {message_id}: {post.kind} post {post.seq}{where} · {len(post.content):,} chars")
    if post.kind == "receipt":
        lines.append(truth.provenance_closes(len(closes)))
        for p in closes:
            lines += post_lines(
                p,
                f"  {p.kind} post {p.seq} · message {p.message_id or 'not delivered'} · {len(p.content):,} chars",
                indent="    ",
            )
    if g is not None:
        lines += [
            f"generation {g.id} · {g.residence} · {g.model}",
            f"  status {g.status} · stop {g.stop_reason or 'none'} · {g.chars:,} chars · "
            f"{tokens(g.output_tokens)} tokens",
            f"  canonical text sha256 {chain.sha256_text(g.text)}",
        ]
        lines += _entry_line(entries.get(("generation", g.id)), chain.generation_payload(g))
        lines.append(f"attempts ({len(g.attempts)}):")
        for a in g.attempts:
            cause = a.stop_reason or a.discard_reason or "-"
            entry = entries.get(("attempt", a.id))
            lines.append(
                f"  {a.id} seg {a.segment} #{a.index} {a.outcome} · {cause}"
                + (f" ({a.error})" if a.error and a.error != cause else "")
                + f" · {a.chars:,} chars · {tokens(a.output_tokens)} tokens"
                + (f" · entry {entry.seq}" if entry is not None else "")
            )
    lines += [truth.provenance_head(head), truth.PROVENANCE_HASHES]
    return lines


async def latest(db: Connection, kind: str, record: str) -> Entry | None:
    """The newest entry of `kind` for a record: the one a Provenance answer names."""
    rows_ = list(
        await db.execute_fetchall(
            chain.ENTRIES + " WHERE record=$1 AND kind=$2 ORDER BY seq DESC LIMIT 1", (record, kind)
        )
    )
    return Entry(*rows_[0]) if rows_ else None


def closed_by(receipt: Post, all_posts: list[Post]) -> list[Post]:
    """The text posts a receipt closes: its generation's partials and speech since the previous receipt."""
    out: list[Post] = []
    for p in sorted(all_posts, key=lambda p: p.seq):
        if p.generation_id != receipt.generation_id or p.seq >= receipt.seq:
            continue
        if p.kind == "receipt":
            out = []
        elif p.kind in ("partial", "speech"):
            out.append(p)
    return out
