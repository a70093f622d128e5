"""Readable forms of ledger records, shared by the CLI and the moderators' slash commands."""
from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any

from ..generation.records import Block, Generation, Stump

log = logging.getLogger(__name__)


# A Discord message link: https://discord.com/channels/GUILD/CHANNEL/MESSAGE (or @me for a DM).
MESSAGE_LINK = re.compile(r"/channels/(?:\d+|@me)/\d+/(\d+)")


def message_id_of(ref: str) -> str | None:
    """The message id a reference names (a link to the message, or its id), or None for any other ref."""
    ref = ref.strip()
    m = MESSAGE_LINK.search(ref)
    return m.group(1) if m else (ref if ref.isdigit() else None)


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def tokens(n: int | None) -> str:
    return f"{n:,}" if n is not None else "n/a"


def generation_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no generations"
    head = f"{'id':<15} {'when (UTC)':<19} {'residence':<12} {'status':<10} {'stop':<14} {'chars':>8} {'tokens':>8} " \
           f"{'att':>3} {'stumps':>6}  continuation"
    lines = [head]
    for r in rows:
        lines.append(f"{r['id']:<15} {when(r['created_at']):<19} {r['residence'][:12]:<12} {r['status']:<10} "
                     f"{(r['stop_reason'] or '-')[:14]:<14} {r['chars']:>8,} {tokens(r['output_tokens']):>8} "
                     f"{r['attempts']:>3} {r['stumps']:>6}  {r['continuation_ended']}")
    return "\n".join(lines)


def stump_line(s: Stump) -> str:
    return (f"{s.id}  {s.cause:<16} {s.chars:>7,} chars  {tokens(s.output_tokens):>7} tokens  "
            + (f"{s.block_type} block #{s.block}  " if s.scope == "block" else "")
            + f"{'published' if s.published else 'unpublished':<11}  {when(s.created_at)}  {s.residence}"
            + (f"  replaced by {s.replaced_by}" if s.replaced_by else ""))


def stump_table(stumps: list[Stump]) -> str:
    return "\n".join(stump_line(s) for s in stumps) if stumps else "no stumps"


def block_list(blocks: list[Block]) -> str:
    """An attempt's content blocks by index, type and size (and a text block's span), never their content."""
    return " · ".join(f"#{b.index} {b.type} {b.chars:,} chars"
                      + (f" [{b.offset:,}–{b.offset + b.chars:,}]" if b.offset is not None and b.is_text else "")
                      for b in blocks)


def provenance(g: Generation) -> list[str]:
    """A generation's provenance without any of its text: what moderators and operators inspect first."""
    lines = [f"generation {g.id} · {g.residence} · {g.model}",
             f"status {g.status} · stop {g.stop_reason or 'none'} · {g.chars:,} chars · {tokens(g.output_tokens)} tokens",
             f"continuation: standing {g.standing}, ended {g.continuation_ended}",
             f"created {when(g.created_at)} UTC, settled {when(g.finished_at)} UTC",
             "attempts:"]
    for a in g.attempts:
        why = a.stop_reason or a.discard_reason or a.error or "-"
        lines.append(f"  {a.id} seg {a.segment} #{a.index} {a.outcome:<10} {why:<16} {a.chars:>7,} chars "
                     f"{tokens(a.output_tokens):>7} tokens" + (f" error {a.error}" if a.error and a.error != why else "")
                     + (f" → {a.replaced_by}" if a.replaced_by else "")
                     + (f" ({a.stop_details.get('category')})" if a.stop_details and a.stop_details.get("category") else "")
                     + (f" · request: {a.request_replacements} lone surrogate(s) sent as U+FFFD"
                        if a.request_replacements else ""))
        blocks = a.content_blocks()
        if len(blocks) > 1 or any(not b.is_text for b in blocks):
            lines.append("    blocks: " + block_list(blocks))
    if g.segments:
        lines.append("segments:")
        for s in g.segments:
            lines.append(f"  {s.index}: {s.attempt_id} stop {s.stop_reason or 'none'} +{s.chars:,} chars "
                         f"{tokens(s.output_tokens)} tokens, overlap removed {s.overlap_removed}")
    if g.stumps:
        lines.append("stumps:")
        lines += ["  " + stump_line(s) for s in g.stumps]
    if g.posts:
        lines.append("posts:")
        for p in g.posts:
            lines.append(f"  {p.seq}. {p.kind:<8} {len(p.content):>5} chars  message {p.message_id or 'not delivered'}")
    return lines


def show(rec: Generation | Stump) -> str:
    if isinstance(rec, Stump):
        return "\n".join([stump_line(rec), f"generation {rec.generation_id}, attempt {rec.attempt_id}", "", rec.text])
    return "\n".join(provenance(rec) + ["", "text:", rec.text])
