"""Provenance any witness can check, end to end: real discord.py bots started by `run_bots` on the local
room over real sockets, the local provider behind the real SDK, a real SQLite ledger read back with sqlite3.

A member with no Manage Messages runs the message command **Provenance** (a type-3 command on a message,
as its Apps menu sends it) or `/provenance message:<link or id>` and gets metadata and hashes, never text;
the hashes are checked here against what the member sees in the room and what the chain records.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from pathlib import Path

from conftest import residence, specimen
from discordkit import deployed, opts

from residents import truth
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.localservers.room import load_layout

CEILING_TEXT = sse.text_of(specimen("ceiling-1024.sse"))
FRAGMENT = sse.text_of(specimen("overloaded-after-257.sse"))
RECEIPT_1024 = "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
LIMIT = 2000


def cairn(*channels: str):
    return residence(
        name="cairn",
        max_tokens=1024,
        policy={"retries": {"max_attempts": 3, "backoff_seconds": 0}, "floor": {"cooldown_seconds": 0}},
        discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": list(channels or ["general"])},
    )


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def entry(db: Path, kind: str, record: str) -> tuple[int, str, dict]:
    """The latest chain entry of a record, read straight from the file: (seq, hash, entry)."""
    with sqlite3.connect(db) as con:
        seq, digest, body = con.execute(
            "SELECT seq, hash, body FROM chain WHERE kind=? AND record=? ORDER BY seq DESC LIMIT 1", (kind, record)
        ).fetchone()
    return seq, digest, json.loads(body)


def answer(out: dict) -> str:
    """Everything the member was answered: ephemeral, each message within Discord's limit."""
    assert not out["timed_out"] and out["responses"], out
    assert all(r["ephemeral"] and len(r["content"] or "") <= LIMIT for r in out["responses"]), out
    return "\n".join(r["content"] for r in out["responses"])


def assert_no_text(said: str, *texts: str) -> None:
    """Not one 24-character stretch of any of the texts appears in the answer."""
    flat = re.sub(r"\s+", " ", said)
    for text in texts:
        words = re.sub(r"\s+", " ", text)
        for i in range(0, max(1, len(words) - 24), 12):
            assert words[i : i + 24] not in flat, f"text leaked into the answer: {words[i : i + 24]!r}"


async def test_a_member_checks_a_partial_and_a_receipt_and_gets_hashes_not_text(tmp_path):
    calls = [Call(sse=specimen("overloaded-after-257.sse")), Call(sse=specimen("ceiling-1024.sse"))]
    async with deployed(tmp_path, [cairn()], calls=calls) as d:
        d.room.post("general", "alice", "describe the harbour, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        [g] = await d.generations()
        assert [a.outcome for a in g.attempts] == ["abandoned", "truncated"]
        assert sorted(s.cause for s in g.stumps) == ["max_tokens", "retry-abandoned"]
        seen = d.bot_messages()
        *partials, receipt = seen
        assert len(partials) == 3 and receipt["content"] == RECEIPT_1024  # the receipt line stays as it is
        posts = {p.message_id: p for p in g.posts}

        # The message command on the second partial, by alice, who has no Manage Messages.
        out = await d.room.invoke_command(
            "general",
            "alice",
            "Provenance",
            bot="cairn",
            target=partials[1]["id"],
            moderator=False,
            timeout=10.0,
            settle=0.1,
        )
        assert not out["moderator"] and "manage_messages" not in out["permissions"]
        said = answer(out)
        post = posts[partials[1]["id"]]
        seq, digest, stated = entry(d.db, "post", post.id)
        assert f"message {partials[1]['id']}: partial post 2 of generation {g.id}" in said
        assert sha(partials[1]["content"]) in said  # what the member sees hashes to what the answer says
        assert stated["content_sha256"] == sha(partials[1]["content"])  # ... and to what the chain records
        assert f"ledger entry {seq} · hash {digest}" in said
        g_seq, g_hash, g_stated = entry(d.db, "generation", g.id)
        assert g_stated["text_sha256"] == hashlib.sha256(g.text.encode("utf-8", "surrogatepass")).hexdigest()
        assert (
            f"canonical text sha256 {g_stated['text_sha256']}" in said
            and f"ledger entry {g_seq} · hash {g_hash}" in said
        )
        assert "status truncated · stop max_tokens" in said and f"{g.chars:,} chars · 1,024 tokens" in said
        for a in g.attempts:  # attempts, their causes, characters and tokens
            a_seq, _, _ = entry(d.db, "attempt", a.id)
            assert re.search(
                rf"{a.id} seg 1 #{a.index} {a.outcome} · {a.stop_reason or a.discard_reason}.*"
                rf"· {a.chars:,} chars · .* tokens · entry {a_seq}\b",
                said,
            ), said
        assert "overloaded_error" in said
        assert_no_text(said, g.text, FRAGMENT, *[s.text for s in g.stumps])

        # The receipt: it names the partial posts it closes, each with the hash of what the room shows.
        out = await d.room.invoke_command(
            "general",
            "alice",
            "Provenance",
            bot="cairn",
            target=receipt["id"],
            moderator=False,
            timeout=10.0,
            settle=0.1,
        )
        said = answer(out)
        assert f"message {receipt['id']}: receipt post 4 of generation {g.id}" in said
        assert truth.provenance_closes(3) in said
        for i, m in enumerate(partials, 1):
            p_seq, p_hash, p_stated = entry(d.db, "post", posts[m["id"]].id)
            assert p_stated["content_sha256"] == sha(m["content"])
            assert re.search(
                rf"partial post {i} · message {m['id']} · {len(m['content']):,} chars\n"
                rf"\s+sha256 {sha(m['content'])}\n\s+ledger entry {p_seq} · hash {p_hash}",
                said,
            ), said
            d_seq, _, d_stated = entry(d.db, "delivered", posts[m["id"]].id)
            assert d_stated["message_id"] == m["id"] and f"delivered as message {m['id']}: entry {d_seq}" in said
        assert sha(receipt["content"]) in said
        assert_no_text(said, g.text, FRAGMENT)

        # /provenance with a link to the receipt, or its bare id: the same answer, to anyone who can see it.
        link = f"https://discord.com/channels/{d.room.guild_id}/{d.room.channel_id()}/{receipt['id']}"
        for ref in (link, receipt["id"]):
            again = await d.room.invoke_command(
                "general",
                "alice",
                "provenance",
                bot="cairn",
                options=opts(message=ref),
                moderator=False,
                timeout=10.0,
                settle=0.1,
            )
            assert answer(again) == said

        # A person's message, a made-up id and something that is not a reference get a plain answer.
        mine = next(m for m in d.messages() if m["author"] == "alice")
        for target in (mine["id"], "1" * 19):
            out = await d.room.invoke_command(
                "general",
                "alice",
                "provenance",
                bot="cairn",
                options=opts(message=target),
                moderator=False,
                timeout=10.0,
                settle=0.1,
            )
            assert answer(out) == truth.PROVENANCE_NOT_FOUND
        out = await d.room.invoke_command(
            "general", "alice", "Provenance", bot="cairn", target=mine["id"], moderator=False, timeout=10.0, settle=0.1
        )
        assert answer(out) == truth.PROVENANCE_NOT_FOUND
        out = await d.room.invoke_command(
            "general",
            "alice",
            "provenance",
            bot="cairn",
            options=opts(message="yesterday's"),
            moderator=False,
            timeout=10.0,
            settle=0.1,
        )
        assert answer(out) == truth.provenance_bad_ref("yesterday's")
        assert d.messages() == [m for m in d.messages() if not m["ephemeral"]]  # nothing reached the room


async def test_provenance_reaches_only_posts_in_channels_the_member_can_see(tmp_path):
    """harbour: yard, dock (mods are denied View Channel on dock); elsewhere: yard. eve administers elsewhere."""
    cut = Call(sse=specimen("ceiling-1024.sse"))
    async with deployed(
        tmp_path, [cairn("harbour/yard", "harbour/dock")], calls=[cut], layout=load_layout("two-guilds")
    ) as d:
        d.room.post("harbour/dock", "alice", "describe the harbour, @cairn", mentions=["cairn"])
        await d.wait_receipt(channel="harbour/dock")
        await d.quiet(0.1)
        [g] = await d.generations()
        receipt = next(p for p in g.posts if p.kind == "receipt")
        link = (
            f"https://discord.com/channels/{d.room.state.channel_by_ref('harbour/dock').guild.id}/{g.channel}/"
            f"{receipt.message_id}"
        )

        async def ask(channel: str, member: str, ref: str) -> str:
            return answer(
                await d.room.invoke_command(
                    channel, member, "provenance", bot="cairn", options=opts(message=ref), timeout=10.0, settle=0.1
                )
            )

        # alice (no role) can see dock: from yard, its receipt's provenance
        assert f"message {receipt.message_id}: receipt post" in await ask("harbour/yard", "alice", link)
        # mo cannot see dock, eve is in another guild: exactly the answer of a message no resident posted
        for channel, member in (("harbour/yard", "mo"), ("elsewhere/yard", "eve")):
            assert (
                await ask(channel, member, link) == await ask(channel, member, "1" * 19) == truth.PROVENANCE_NOT_FOUND
            )
