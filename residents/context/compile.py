"""Room history + ledger → the next request a resident's model sees.

The ledger, not a message's look, says what a message was: a resident's own cut output appears once,
in its exact canonical form, as its own words, followed by a model-visible boundary note; its
receipts are never presented as its words; text set aside for a retry is described, not quoted.
Another resident's receipts and notices (found in the ledger by message id) appear as boundary
notes, never as that resident's words; a person's line that looks like one stays the person's words.
Every line someone else wrote is marked as theirs (`residents.context.marks`), so only the framework's
notes begin a line with `[`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import models, truth
from ..config import Residence
from ..provider import REGISTRY, caching
from ..records import Generation, Post, SharedFile, Stump
from .attachments import Fetched, Placed, content, decide, within_request
from .marks import one_line, quoted, said
from .window import Window, frozen_count

QUIET_NOTE = "[No new messages since the reply above.]"
START_NOTE = "[Earlier messages in this room are not shown.]"


@dataclass(frozen=True)
class RoomMessage:
    id: str
    author: str
    is_self: bool
    content: str
    is_bot: bool = False  # posted by a bot account: the ledger may know it as another resident's post
    files: tuple[Fetched, ...] = ()  # its attachments, as the room gave them (`residents.context.attachments`)


Content = str | list[dict[str, Any]]  # a turn's text, or content blocks where it carries images


def ledger_message_ids(history: list[RoomMessage]) -> list[str]:
    """The messages to look up in the ledger: the resident's own and every other bot's."""
    return [m.id for m in history if m.is_self or m.is_bot]


def own_generation_ids(history: list[RoomMessage], posts: dict[str, Post]) -> list[str]:
    """The generations behind the resident's own messages: the ones whose text and cuts it reads."""
    own = {m.id for m in history if m.is_self}
    return [p.generation_id for mid, p in posts.items() if mid in own and p.generation_id]


def in_reading_order(
    history: list[RoomMessage], posts: dict[str, Post], gens: dict[str, Generation]
) -> list[RoomMessage]:
    """The room as the resident lived it: each of its replies right after the last message it had read.

    Messages that arrived while a reply was being written come after that reply, so a turn taken to
    answer them sees them as new rather than as already answered.
    """
    where = {m.id: i for i, m in enumerate(history)}

    def key(item: tuple[int, RoomMessage]) -> tuple[float, int]:
        i, m = item
        post = posts.get(m.id) if m.is_self else None
        g = gens.get(post.generation_id) if post and post.generation_id else None
        anchor = where.get(g.seen_upto) if g is not None and g.seen_upto else None
        if anchor is not None and anchor < i:
            return (anchor + 0.5, i)
        return (float(i), i)

    return [m for _, m in sorted(enumerate(history), key=key)]


def _turns(
    history: list[RoomMessage],
    posts: dict[str, Post],
    gens: dict[str, Generation],
    own_stumps_visible: bool,
    recovered: dict[str, Stump] | None = None,
    files: dict[str, list[Placed]] | None = None,
) -> list[list[tuple[str, Content]]]:
    """The turns each message of `history` makes, in reading order (a message may make none)."""
    groups: list[list[tuple[str, Content]]] = []
    seen: set[str] = set()
    published: set[str] = set()  # stumps whose recovered text is already in the turns
    for m in in_reading_order(history, posts, gens):
        turns: list[tuple[str, Content]] = []
        groups.append(turns)
        if not m.is_self:
            post = posts.get(m.id) if m.is_bot else None
            if post is not None and post.kind in ("receipt", "notice"):  # a room line about its output
                line = post.content.removeprefix(truth.RECEIPT_PREFIX)
                turns.append(("user", truth.context_room_line_note(one_line(m.author), line)))
                continue
            placed = (files or {}).get(m.id)
            turns.append(("user", content(said(m.author, m.content), placed) if placed else said(m.author, m.content)))
            continue
        post = posts.get(m.id)
        if post is not None and post.kind in ("receipt", "notice"):
            continue  # a room line about an output, never the resident's words
        if post is not None and post.kind == "recovered":  # its own set-aside text, published later: once, noted
            if post.stump_id not in published:
                published.add(post.stump_id or "")
                s = (recovered or {}).get(post.stump_id or "")
                text, cause = (s.text, s.cause) if s is not None else (m.content, "unknown")
                turns += [("assistant", text), ("user", truth.context_recovered_note(len(text), cause))]
            continue
        g = gens.get(post.generation_id) if post and post.generation_id else None
        if post is None or g is None:  # a message of its own the ledger never recorded: take it as it reads
            turns.append(("assistant", m.content))
            continue
        if g.id in seen:
            continue
        seen.add(g.id)
        turns += _own_generation(g, own_stumps_visible)
    return groups


def _own_generation(g: Generation, own_stumps_visible: bool) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    e = g.ending()
    set_aside = [s for s in g.stumps if s.scope == "attempt" and s.chars]
    if g.status != "refused" and g.text:
        out.append(("assistant", g.text))
    if set_aside:
        if own_stumps_visible:
            for s in set_aside:
                out.append(("user", f"{truth.context_set_aside_header(s.cause, s.chars)}\n{quoted(s.text)}"))
        else:
            out.append(("user", truth.context_abandoned_note(len(set_aside), sum(s.chars for s in set_aside))))
    if g.status == "refused":
        out.append(("user", truth.context_refusal_note(g.stop_reason)))
    elif not truth.is_completed_turn(g.status):
        note = truth.context_boundary_note(e)
        if note:
            out.append(("user", note))
    return out


def notes_after(g: Generation, own_stumps_visible: bool) -> list[str]:
    """The model-visible notes that follow a resident's own output in its later requests (none for an
    ordinary completed reply): what `replay` shows beside each generation."""
    return [text for role, text in _own_generation(g, own_stumps_visible) if role == "user"]


def _blocks(c: Content) -> list[dict[str, Any]]:
    return [{"type": "text", "text": c}] if isinstance(c, str) else list(c)


def _merge(turns: list[tuple[str, Content]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for role, text in turns:
        if not messages or messages[-1]["role"] != role:
            messages.append({"role": role, "content": text})
            continue
        last = messages[-1]
        if isinstance(last["content"], str) and isinstance(text, str):
            last["content"] += "\n\n" + text
            continue
        merged = _blocks(last["content"])  # one side carries images: both become blocks, text joined across
        for b in _blocks(text):
            if b["type"] == "text" and merged and merged[-1]["type"] == "text":
                merged[-1] = {"type": "text", "text": merged[-1]["text"] + "\n\n" + b["text"]}
            else:
                merged.append(b)
        last["content"] = merged
    return messages


def base_request(res: Residence) -> dict[str, Any]:
    req: dict[str, Any] = {"model": res.model, "max_tokens": res.max_tokens}
    if res.system:
        req["system"] = res.system
    if res.temperature is not None:
        req["temperature"] = res.temperature
    if res.stop_sequences:
        req["stop_sequences"] = list(res.stop_sequences)
    return req


def file_budget(res: Residence) -> int:
    """The tokens a request's inline files may take: the policy's budget, else a quarter of the model's window."""
    stated = res.policy.attachments.request_budget_tokens
    return stated if stated is not None else truth.file_budget(models.caps(res.model).context_window)


def compile_request(
    res: Residence,
    history: list[RoomMessage],
    posts: dict[str, Post],
    gens: dict[str, Generation],
    recovered: dict[str, Stump] | None = None,
) -> dict[str, Any]:
    """A request for a new reply: the room as the resident should understand it, ending on a user turn.

    `recovered`: the stumps the resident published (post kind `recovered`), by id, for their exact text."""
    return compile_with_files(res, history, posts, gens, recovered)[0]


def compile_with_files(
    res: Residence,
    history: list[RoomMessage],
    posts: dict[str, Post],
    gens: dict[str, Generation],
    recovered: dict[str, Stump] | None = None,
    window: Window | None = None,
) -> tuple[dict[str, Any], list[SharedFile]]:
    """`compile_request`, and each file the request carries or describes, as the ledger keeps it.

    Files of others' messages only (a resident posts none; an image may stand only in a user turn).
    `window`: where this channel's requests start (`residents.context.window`), kept by the caller
    between turns; without one, the last `history_limit` messages are shown."""
    limit = res.policy.floor.history_limit
    shown = window.shown(history, limit) if window is not None else history[-limit:]
    images_ok = models.caps(res.model).accepts_images
    with_files = [m for m in shown if m.files and not m.is_self]
    per_message = [decide(m.id, m.files, images_ok) for m in with_files]
    within_request(per_message, file_budget(res))
    files = {m.id: placed for m, placed in zip(with_files, per_message, strict=True)}
    groups = _turns(shown, posts, gens, res.policy.stumps.resident_reads_own, recovered, files)
    turns = [t for group in groups for t in group]
    frozen = sum(len(group) for group in groups[: frozen_count(len(groups), limit)])
    if not turns or turns[0][0] != "user":
        turns.insert(0, ("user", START_NOTE))
        frozen += 1 if frozen else 0
    while 0 < frozen < len(turns) and turns[frozen - 1][0] == turns[frozen][0]:
        frozen -= 1  # the frozen part ends where the role changes, so no message spans both parts
    if turns[-1][0] != "user":
        turns.append(("user", QUIET_NOTE))
    older, tail = _merge(turns[:frozen]), _merge(turns[frozen:])
    request = {**base_request(res), "messages": older + tail}
    if REGISTRY[res.provider].breakpoints:
        request = with_breakpoints(request, len(older))
    return request, [p.record for placed in per_message for p in placed]


def with_breakpoints(request: dict[str, Any], frozen: int) -> dict[str, Any]:
    """`request` marked for a provider that caches only where it is told (`residents.provider.caching`):
    the system prompt, the end of its first `frozen` messages (the frozen part), each where the
    prefix up to it can be cached at all, and the last block (a top-level mark), so the next turn
    reads this whole request. Tools are marked where they are added (`residents.generation.tools`)."""
    out = dict(request)
    system = out.get("system")
    if system and caching.estimated_tokens(system) >= caching.MIN_CACHEABLE_TOKENS:
        out["system"] = caching.with_breakpoint(system)
    messages = list(out["messages"])
    if frozen and caching.estimated_tokens([system, messages[:frozen]]) >= caching.MIN_CACHEABLE_TOKENS:
        last = messages[frozen - 1]
        messages[frozen - 1] = {**last, "content": caching.with_breakpoint(last["content"])}
    out["messages"] = messages
    out["cache_control"] = dict(caching.BREAKPOINT)
    return out
