"""Residents in a room, end to end: real discord.py bots started by `run_bots` (as `residents run` does),
the local room server over real sockets, the local Anthropic-compatible server behind the real SDK, and
a real SQLite ledger. Swallowed errors in discord.py's background tasks fail the test (discordkit)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from conftest import residence, specimen
from discordkit import deployed, opts, sub

from residents.cli import main as cli_main
from residents.context.compile import QUIET_NOTE
from residents.continuation import CONTINUE_NOTE
from residents.discord.run import Deployment, StartupError, run_bots
from residents.ledger.verify import verify
from residents.localservers import sse
from residents.localservers.provider import Call, ProviderServer

try:
    from roomkit import eventually, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import eventually, running_room

END_TEXT = sse.text_of(specimen("end-turn.sse"))
CEILING_TEXT = sse.text_of(specimen("ceiling-1024.sse"))
FRAGMENT = sse.text_of(specimen("overloaded-after-257.sse"))
FIRST = sse.text_of(specimen("cont-first.sse"))
REST = sse.text_of(specimen("cont-rest-with-overlap.sse"))
RECEIPT_1024 = "-# Output ceiling reached at 1,024 tokens; the remainder was not generated."
REFUSAL = "This command needs the Manage Messages permission."
LIMIT = 2000

BOUNDS = {"max_segments": 2, "max_output_tokens": 12288, "min_progress_chars": 16, "similarity_abort": 0.92}


def res(name: str = "cairn", **over):
    """A residence that lives in #general, with no cooldown and no retry backoff (fast, deterministic)."""
    policy = dict(over.pop("policy", {}))
    policy.setdefault("retries", {"max_attempts": 3, "backoff_seconds": 0})
    policy["floor"] = {"cooldown_seconds": 0, **policy.get("floor", {})}
    over.setdefault("discord", {"token_env": f"{name.upper()}_DISCORD_TOKEN", "channels": ["general"]})
    over.setdefault("system", f"You are {name.capitalize()}, a resident of this room.")
    return residence(name=name, policy=policy, **over)


def squash(text: str) -> str:
    """Text without whitespace: splitting for Discord may only change whitespace at the joins."""
    return re.sub(r"\s+", "", text)


def short_replies(body: dict) -> Call:
    """Every request answered at once with a short completed reply, naming who asked."""
    who = re.search(r"You are (\w+)", body.get("system", ""))
    return Call(sse=sse.stream(f"{who.group(1) if who else 'Someone'} says a short thing.", "end_turn", 7))


def quiet_pings(m: dict) -> bool:
    return m["allowed_mentions"] == {"parse": []} and m["pings"] == {
        "users": [],
        "user_ids": [],
        "roles": [],
        "everyone": False,
    }


def contents(out: dict) -> list[str]:
    return [r["content"] for r in out["responses"]]


def assert_ephemeral_pages(out: dict) -> None:
    assert out["responses"] and all(r["ephemeral"] for r in out["responses"]), out
    assert all(len(r["content"] or "") <= LIMIT for r in out["responses"])


async def ask(d, author: str, text: str, n_before: int, expect: int = 1, **kw) -> list[dict]:
    """A person mentions cairn; wait until `expect` more bot messages are in the room, and return the new ones."""
    d.room.post("general", author, text, mentions=["cairn"], **kw)
    await d.wait_bot_messages(n_before + expect)
    await d.quiet(0.1)
    return d.bot_messages()[n_before:]


async def posts_match_room(d, g) -> None:
    """The ledger maps every post of `g` to the room message it became, in order."""
    room_ids = [m["id"] for m in d.bot_messages()]
    mapped = [p.message_id for p in sorted(g.posts, key=lambda p: p.seq)]
    assert all(mapped) and all(mid in room_ids for mid in mapped)
    assert mapped == sorted(mapped, key=room_ids.index)
    by_id = {m["id"]: m for m in d.bot_messages()}
    assert [by_id[p.message_id]["content"] for p in sorted(g.posts, key=lambda p: p.seq)] == [
        p.content for p in sorted(g.posts, key=lambda p: p.seq)
    ]


# ---------------------------------------------------------------------------------------------- 1-3


async def test_a_mention_gets_speech_with_typing_and_ids_mapped(tmp_path):
    async with deployed(tmp_path, [res()], calls=[Call(sse=specimen("end-turn.sse"))]) as d:
        events = d.room.subscribe_events()
        asked = d.room.post("general", "alice", "hello @cairn, a summary please", mentions=["cairn"])
        [m] = await d.wait_bot_messages(1)
        await d.quiet(0.1)
        assert m["author"] == "cairn" and m["content"] == END_TEXT and quiet_pings(m)
        assert [v["id"] for v in d.messages()] == [asked["id"], m["id"]]
        [g] = await d.generations()
        assert (g.status, g.trigger, g.channel) == ("completed", asked["id"], d.room.channel_id())
        assert [(p.kind, p.message_id) for p in g.posts] == [("speech", m["id"])]
        assert m["nonce"] == g.posts[0].id  # the post id travels as Discord's nonce
        seen = []
        while not events.empty():
            e = events.get_nowait()
            if e["type"] in ("typing", "message_create"):
                seen.append((e["type"], e.get("user") or e["message"]["author"]))
        assert seen.index(("typing", "cairn")) < seen.index(("message_create", "cairn"))
        [request] = d.provider.requests
        assert request["messages"] == [{"role": "user", "content": "alice: hello @cairn, a summary please"}]


async def test_max_tokens_gives_partials_then_one_receipt_all_mapped(tmp_path):
    async with deployed(tmp_path, [res(max_tokens=1024)], calls=[Call(sse=specimen("ceiling-1024.sse"))]) as d:
        d.room.post("general", "alice", "describe the harbour, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        new = d.bot_messages()
        assert len(new) >= 3  # 4,300 characters: at least three messages, then the receipt
        assert all(len(m["content"]) <= LIMIT for m in new)
        assert [m["content"] for m in new].count(RECEIPT_1024) == 1 and new[-1]["content"] == RECEIPT_1024
        assert squash("".join(m["content"] for m in new[:-1])) == squash(CEILING_TEXT)
        assert all(quiet_pings(m) for m in new)
        [g] = await d.generations()
        assert (g.status, g.stop_reason, g.output_tokens) == ("truncated", "max_tokens", 1024)
        posts = sorted(g.posts, key=lambda p: p.seq)
        assert [p.kind for p in posts] == ["partial"] * (len(new) - 1) + ["receipt"]
        assert [p.message_id for p in posts] == [m["id"] for m in new]
        await posts_match_room(d, g)
        [stump] = g.stumps
        assert (stump.cause, stump.scope, stump.published, stump.text) == ("max_tokens", "output", True, CEILING_TEXT)


async def test_mentions_in_output_ping_nobody(tmp_path):
    def loud(body: dict) -> Call:
        alice = d.room.state.person("alice")
        mod_role, everyone_role = d.room.state.moderator_role_id, d.room.state.guild_id
        text = (
            f"@everyone and @here, look! <@{alice.id}> <@!{alice.id}> and <@&{mod_role}> "
            f"<@&{everyone_role}> should all hear this."
        )
        return Call(sse=sse.stream(text, "end_turn", 30))

    async with deployed(tmp_path, [res()], responder=lambda body: loud(body)) as d:
        [m] = await ask(d, "alice", "shout, @cairn", 0)
        alice = d.room.state.person("alice")
        assert "@everyone" in m["content"] and f"<@{alice.id}>" in m["content"]
        assert f"<@&{d.room.state.moderator_role_id}>" in m["content"]
        assert m["allowed_mentions"] == {"parse": []}
        assert m["pings"] == {"users": [], "user_ids": [], "roles": [], "everyone": False}


# ---------------------------------------------------------------------------------------------- 4


async def test_moderator_commands_show_metadata_pages_and_provenance(tmp_path):
    calls = [
        Call(sse=specimen("ceiling-1024.sse")),
        Call(sse=specimen("overloaded-after-257.sse")),
        Call(sse=specimen("end-turn.sse")),
    ]
    async with deployed(tmp_path, [res(max_tokens=1024)], calls=calls) as d:
        d.room.post("general", "alice", "long one, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        n = len(d.bot_messages())
        await ask(d, "alice", "and again, @cairn", n)
        cut, retried = await d.generations()
        [cut_stump] = cut.stumps
        [frag_stump] = retried.stumps
        assert (cut_stump.cause, frag_stump.cause) == ("max_tokens", "retry-abandoned")
        room_before = d.messages()
        asked_before = len(d.provider.requests)

        # /stumps list: metadata only, ephemeral
        out = await d.command("moddy", "stumps", sub("list"))
        assert_ephemeral_pages(out)
        text = "\n".join(contents(out))
        assert cut_stump.id in text and frag_stump.id in text and "max_tokens" in text and "retry-abandoned" in text
        [cut_line] = [line for line in text.splitlines() if cut_stump.id in line]
        [frag_line] = [line for line in text.splitlines() if frag_stump.id in line]
        assert "4,300 chars" in cut_line and " published" in cut_line  # its text reached the room as partials
        assert "257 chars" in frag_line and "unpublished" in frag_line
        assert CEILING_TEXT[:40] not in text and FRAGMENT[:40] not in text
        out = await d.command("moddy", "stumps", sub("list", cause="retry-abandoned"))
        assert frag_stump.id in contents(out)[0] and cut_stump.id not in contents(out)[0]

        # /stumps show: the text, paged within 2,000 characters, all ephemeral
        out = await d.command("moddy", "stumps", sub("show", id=cut_stump.id))
        assert_ephemeral_pages(out)
        pages = contents(out)
        assert len(pages) >= 4  # the head, then 4,300 characters in pages of at most 2,000
        assert cut_stump.id in pages[0] and "max_tokens" in pages[0] and CEILING_TEXT[:40] not in pages[0]
        assert squash("".join(pages[1:])) == squash(CEILING_TEXT)
        out = await d.command("moddy", "stumps", sub("show", id=frag_stump.id))
        assert squash("".join(contents(out)[1:])) == squash(FRAGMENT)
        out = await d.command("moddy", "stumps", sub("show", id="s-000000000000"))
        assert contents(out) == ["No stump s-000000000000."]

        # /generation show, by id: attempts, segments, stop and discard reasons, never the text
        out = await d.command("moddy", "generation", sub("show", ref=retried.id))
        assert_ephemeral_pages(out)
        prov = "\n".join(contents(out))
        assert retried.id in prov and "attempts:" in prov and "segments:" in prov and "stumps:" in prov
        assert "abandoned" in prov and "retry-abandoned" in prov and "overloaded" in prov and "end_turn" in prov
        assert FRAGMENT[:40] not in prov and END_TEXT[:40] not in prov
        # ... and by a link to one of its messages (the receipt of the cut one)
        receipt_id = [p for p in cut.posts if p.kind == "receipt"][0].message_id
        link = f"https://discord.com/channels/{d.room.guild_id}/{d.room.channel_id()}/{receipt_id}"
        out = await d.command("moddy", "generation", sub("show", ref=link))
        prov = "\n".join(contents(out))
        assert cut.id in prov and "status truncated" in prov and "stop max_tokens" in prov and "receipt" in prov
        assert CEILING_TEXT[:40] not in prov
        out = await d.command("moddy", "generation", sub("show", ref="https://discord.com/channels/1/2/3"))
        assert contents(out) == ["No generation found for https://discord.com/channels/1/2/3."]

        # /policy show
        out = await d.command("moddy", "policy", sub("show"))
        pol = "\n".join(contents(out))
        assert pol.startswith("```\n# cairn (claude-3-opus-20240229)") and "standing: none" in pol
        assert "moderators_read_text: true" in pol and "max_resident_run: 3" in pol

        # /continue where the standing is not on-request: refused, with the reason, and nothing else
        out = await d.command("moddy", "continue", opts(generation=cut.id))
        assert contents(out) == ["Not continued: the continuation standing of cairn is none, not on-request."]
        assert out["responses"][0]["ephemeral"]

        # a plain member: a clear refusal and no content, for every command
        for name, options in [
            ("stumps", sub("list")),
            ("stumps", sub("show", id=cut_stump.id)),
            ("generation", sub("show", ref=cut.id)),
            ("policy", sub("show")),
            ("continue", opts(generation=cut.id)),
        ]:
            out = await d.command("bob", name, options, moderator=False)
            assert contents(out) == [REFUSAL] and out["responses"][0]["ephemeral"], (name, out)

        await d.quiet(0.1)
        assert d.messages() == room_before  # nothing of this reached the room
        assert len(d.provider.requests) == asked_before


async def test_stump_text_is_withheld_where_policy_says_so(tmp_path):
    policy = {"stumps": {"moderators_read_text": False}}
    async with deployed(
        tmp_path, [res(max_tokens=1024, policy=policy)], calls=[Call(sse=specimen("ceiling-1024.sse"))]
    ) as d:
        d.room.post("general", "alice", "long one, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        [g] = await d.generations()
        [stump] = g.stumps
        out = await d.command("moddy", "stumps", sub("show", id=stump.id))
        assert_ephemeral_pages(out)
        shown = "\n".join(contents(out))
        assert stump.id in shown and "Text withheld" in shown
        assert len(out["responses"]) == 1 and CEILING_TEXT[:40] not in shown and CEILING_TEXT[-40:] not in shown


async def test_continue_on_request_posts_one_more_segment_and_no_text_twice(tmp_path):
    policy = {"continuation": {"standing": "on-request", **BOUNDS}}
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=specimen("cont-rest-with-overlap.sse"))]
    async with deployed(tmp_path, [res(max_tokens=600, policy=policy)], calls=calls) as d:
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        first = d.bot_messages()
        [g] = await d.generations()
        assert g.continuation_ended == "disabled" and len(d.provider.requests) == 1

        out = await d.command("bob", "continue", opts(generation=g.id), moderator=False)
        assert contents(out) == [REFUSAL]
        out = await d.command("moddy", "continue", opts(generation=g.id))
        assert out["responses"][0]["type"] == 5 and out["responses"][0]["ephemeral"]  # deferred, thinking
        assert contents(out)[-1] == f"Continued {g.id}: now completed, 2 segment(s), continuation completed."
        await d.quiet(0.1)
        added = d.bot_messages()[len(first) :]
        assert len(d.provider.requests) == 2
        assert [m["content"] for m in added][-1].startswith("-# Output assembled from 2 segments")
        assert squash("".join(m["content"] for m in added[:-1])) == squash(REST[48:])
        assert FIRST[-30:] not in "".join(m["content"] for m in added)  # no text twice
        spoken = [m["content"] for m in d.bot_messages() if not m["content"].startswith("-# ")]
        assert squash("".join(spoken)) == squash(FIRST + REST[48:])
        assert all(quiet_pings(m) for m in d.bot_messages())
        [g] = await d.generations()
        assert (g.status, len(g.segments), g.text) == ("completed", 2, FIRST + REST[48:])
        posts = sorted(g.posts, key=lambda p: p.seq)
        assert [p.kind for p in posts] == ["partial"] * (len(first) - 1) + ["receipt"] + ["speech"] * (
            len(added) - 1
        ) + ["receipt"]
        assert [p.message_id for p in posts] == [m["id"] for m in d.bot_messages()]


SECOND = (
    "Beyond the breakwater the channel bends twice, and pilots count the buoys aloud: "
    "red to port, green to starboard, the bell buoy last of all before the open sea."
)
THIRD = " And at dusk the harbour master lights the lamp on the mole, and the day's work ends."


async def assert_one_reply_in_order(d, g) -> None:
    """Posts numbered 1..n from the ledger, each its own room message, in order; the ledger clean (--strict)."""
    posts = sorted(g.posts, key=lambda p: p.seq)
    assert [p.seq for p in posts] == list(range(1, len(posts) + 1))
    await posts_match_room(d, g)
    assert await verify(d.ledger, unsettled_as_violations=True) == []


async def test_two_continues_of_one_generation_at_once_continue_it_once(tmp_path):
    """Two moderators (or a repeat) at once: the second waits for the first, then finds the generation continued
    since it was asked, and is declined to its moderator alone: one segment more, not two."""
    policy = {"continuation": {"standing": "on-request", **BOUNDS}}
    calls = [
        Call(sse=specimen("cont-first.sse")),
        Call(sse=sse.stream(SECOND, "max_tokens", 600)),
        Call(sse=sse.stream(THIRD, "end_turn", 20)),
    ]
    async with deployed(tmp_path, [res(max_tokens=600, policy=policy)], calls=calls) as d:
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        [g] = await d.generations()
        one, two = await asyncio.gather(
            d.command("moddy", "continue", opts(generation=g.id)), d.command("mona", "continue", opts(generation=g.id))
        )
        answers = sorted([contents(one)[-1], contents(two)[-1]])
        assert answers == [
            f"Continued {g.id}: now truncated, 2 segment(s), continuation disabled.",
            f"Not continued: generation {g.id} was continued meanwhile; it has 2 segments now.",
        ], answers
        await d.quiet(0.1)
        [g] = await d.generations()
        assert (g.status, len(g.segments), len(d.provider.requests)) == ("truncated", 2, 2)
        assert g.text.endswith(SECOND)
        # Asked again once the first is in the room, it continues: the segment count it found is current.
        assert contents(await d.command("moddy", "continue", opts(generation=g.id)))[-1] == (
            f"Continued {g.id}: now completed, 3 segment(s), continuation completed."
        )
        [g] = await d.generations()
        assert (g.status, len(g.segments), len(d.provider.requests)) == ("completed", 3, 3)
        assert g.text.endswith(THIRD) and squash(SECOND) in squash(g.text)
        assert [m["id"] for m in d.bot_messages()] == [p.message_id for p in sorted(g.posts, key=lambda p: p.seq)]
        await assert_one_reply_in_order(d, g)


async def test_a_continue_during_a_turn_waits_for_it(tmp_path):
    """/continue while the resident is writing in that channel: it runs after the turn, posts after its reply."""
    policy = {"continuation": {"standing": "on-request", **BOUNDS}}
    calls = [
        Call(sse=specimen("cont-first.sse")),
        Call(sse=specimen("end-turn.sse")),
        Call(sse=sse.stream(SECOND, "end_turn", 40)),
    ]
    async with deployed(tmp_path, [res(max_tokens=600, policy=policy)], calls=calls) as d:
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        n = len(d.bot_messages())
        [g] = await d.generations()
        d.provider.hold()
        d.room.post("general", "alice", "and a summary, @cairn", mentions=["cairn"])
        await eventually(lambda: d.provider.arrived == 2)
        events = d.room.subscribe_events()
        asked = asyncio.create_task(d.command("moddy", "continue", opts(generation=g.id)))
        while (await asyncio.wait_for(events.get(), timeout=10) or {}).get("type") != "interaction_response":
            pass  # the command was deferred: it is running, and waits for the turn
        await asyncio.sleep(0.5)
        assert d.provider.arrived == 2  # nothing is asked of the provider beside the turn being written
        d.provider.release()
        out = await asked
        assert contents(out)[-1] == f"Continued {g.id}: now completed, 2 segment(s), continuation completed."
        await d.quiet(0.1)
        g, turn = await d.generations()
        added = d.bot_messages()[n:]
        assert [m["content"] for m in added][0] == END_TEXT  # the turn's reply first, then the continuation
        assert [m["id"] for m in added] == [turn.posts[0].message_id] + [
            p.message_id for p in sorted(g.posts, key=lambda p: p.seq)[n:]
        ]
        await assert_one_reply_in_order(d, g)
        await assert_one_reply_in_order(d, turn)


# ---------------------------------------------------------------------------------------------- 5


def resident_turns(messages: list[dict]) -> int:
    turns, last = 0, None
    for m in messages:
        if m["author"] != last:
            turns, last = turns + 1, m["author"]
    return turns


async def test_two_residents_do_not_loop(tmp_path):
    floor = {"reply_to": "all", "cooldown_seconds": 0, "max_resident_run": 3}
    residents = [res("cairn", policy={"floor": floor}), res("sill", policy={"floor": floor})]
    async with deployed(tmp_path, residents, responder=short_replies) as d:
        d.room.post("general", "alice", "hello both of you")
        await d.wait_bot_messages(1)
        await d.quiet(0.3)
        after = d.bot_messages()
        assert 1 <= resident_turns(after) <= 3, [(m["author"], m["content"]) for m in after]
        assert len(after) == len(d.provider.requests)  # every generation spoke: none was made only to be dropped
        assert {m["author"] for m in after} == {"cairn", "sill"}
        # a person speaks again: the residents may speak again, again within the bound, then stop
        n = len(d.messages())
        d.room.post("general", "alice", "and now?")
        await d.wait_bot_messages(len(after) + 1)
        await d.quiet(0.3)
        again = [m for m in d.messages()[n + 1 :]]
        assert all(m["bot"] for m in again) and 1 <= resident_turns(again) <= 3


def slow(text: str, seconds: float) -> Call:
    raw = sse.stream(text, "end_turn", 7)
    return Call(sse=raw, chunk_bytes=max(1, len(raw) // 10), chunk_delay=seconds / 10)


async def longest_resident_run(d) -> int:
    """The most resident replies the room shows in a row between two messages from people (ledger: message → generation)."""
    msgs = d.messages()
    posts = await d.ledger.posts_by_message([m["id"] for m in msgs if m["bot"]])
    best, run = 0, set()
    for m in msgs:
        if not m["bot"]:
            run = set()
            continue
        run.add(posts[m["id"]].generation_id)
        best = max(best, len(run))
    return best


async def test_floor_counts_replies_so_a_queued_turn_cannot_stretch_the_run(tmp_path):
    """max_resident_run 3, two residents answering everything: cairn's queued turn puts two of its replies
    side by side, and the room still shows three resident replies after a person, not four."""
    answered: dict[str, int] = {}

    def responder(body: dict) -> Call:
        who = re.search(r"You are (\w+)", body["system"]).group(1)
        answered[who] = answered.get(who, 0) + 1
        text = f"{who} says a short thing ({answered[who]})."
        return slow(text, 1.0) if (who, answered[who]) == ("Cairn", 1) else Call(sse=sse.stream(text, "end_turn", 7))

    floor = {"reply_to": "all", "max_resident_run": 3}
    residents = [
        res("cairn", policy={"floor": {**floor, "cooldown_seconds": 0}}),
        res("sill", policy={"floor": {**floor, "cooldown_seconds": 3.0}}),
    ]
    async with deployed(tmp_path, residents, responder=responder) as d:
        ch = int(d.room.channel_id())
        cairn, sill = d.bot("cairn").get_cog("ResidentCog"), d.bot("sill").get_cog("ResidentCog")
        d.room.post("general", "alice", "hello both of you")
        # sill answers at once; cairn, still writing, queues a turn for it, taken as soon as its reply is out
        s1 = await d.room.wait_for_message(lambda m: m["author"] == "sill", timeout=10)
        await eventually(lambda: cairn.queued[ch], timeout=5)
        await d.room.wait_for_message(lambda m: m["content"] == "Cairn says a short thing (2).", timeout=10)
        # sill's cooldown ends: its turn (queued for cairn's replies) is checked against the floor again
        await eventually(lambda: not sill.locks[ch].locked() and not sill.queued[ch], timeout=10)
        await d.quiet(0.3)
        authors = [m["author"] for m in d.bot_messages()]
        assert authors == ["sill", "cairn", "cairn"], authors
        c1, c2 = await d.generations("cairn")
        assert c2.trigger == s1["id"]  # the queued turn
        assert await longest_resident_run(d) == 3
        assert len(d.provider.requests) == 3  # every generation spoke: none was made only to be dropped


# ---------------------------------------------------------------------------------------------- 6-7


async def test_later_request_sees_the_cut_once_with_a_boundary_and_never_the_receipt(tmp_path):
    calls = [Call(sse=specimen("ceiling-1024.sse")), Call(sse=specimen("end-turn.sse"))]
    async with deployed(tmp_path, [res(max_tokens=1024)], calls=calls) as d:
        d.room.post("general", "alice", "describe the harbour, @cairn", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        n = len(d.bot_messages())
        await ask(d, "alice", "and then, @cairn?", n)
        msgs = d.provider.requests[1]["messages"]
        assert msgs[-1]["role"] == "user" and msgs[-1]["content"].endswith("alice: and then, @cairn?")
        own = [m for m in msgs if m["role"] == "assistant"]
        assert [m["content"] for m in own] == [CEILING_TEXT]  # once, exactly, as its own words
        holding = [m for m in msgs if CEILING_TEXT[:60] in m["content"] or CEILING_TEXT[-60:] in m["content"]]
        assert holding == own
        after = msgs[msgs.index(own[0]) + 1]
        assert after["role"] == "user" and after["content"].startswith("[Boundary: the message above was cut off")
        assert "1,024" in after["content"]
        assert not any("Output ceiling reached" in m["content"] for m in msgs)  # the receipt is not a turn


@pytest.mark.parametrize("notice", [False, True])
async def test_a_retried_attempt_posts_only_the_replacement(tmp_path, notice):
    policy = {"notices": {"retry_abandoned": notice}}
    calls = [Call(sse=specimen("overloaded-after-257.sse")), Call(sse=specimen("end-turn.sse"))]
    async with deployed(tmp_path, [res(policy=policy)], calls=calls) as d:
        new = await ask(d, "alice", "a summary, @cairn", 0, expect=2 if notice else 1)
        assert new[0]["content"] == END_TEXT
        if notice:
            assert [m["content"] for m in new[1:]] == [
                "-# Provider attempt interrupted and retried; 257 characters set aside as a stump."
            ]
        else:
            assert len(new) == 1
        assert not any(FRAGMENT[:40] in m["content"] or FRAGMENT[-40:] in m["content"] for m in d.messages())
        [g] = await d.generations()
        assert [a.outcome for a in g.attempts] == ["abandoned", "completed"]
        [stump] = g.stumps
        assert (stump.cause, stump.text, stump.published, stump.replaced_by) == (
            "retry-abandoned",
            FRAGMENT,
            False,
            g.attempts[1].id,
        )
        assert [p.kind for p in sorted(g.posts, key=lambda p: p.seq)] == ["speech"] + (["notice"] if notice else [])
        await posts_match_room(d, g)


# ---------------------------------------------------------------------------------------------- 8


RESIDENCE_YAML = """name: cairn
model: claude-3-opus-20240229
max_tokens: 1024
discord:
  token_env: RESIDENTS_E2E_CAIRN_TOKEN
  channels: [general]
"""


@pytest.fixture
def base(tmp_path, monkeypatch):
    (tmp_path / "residences").mkdir()
    (tmp_path / "residences" / "cairn.yaml").write_text(RESIDENCE_YAML)
    monkeypatch.chdir(tmp_path)
    for var in ("RESIDENTS_E2E_CAIRN_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    code = cli_main(["run", "--db", "ledger.db", *args])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def test_a_missing_token_stops_start_up_with_one_line(base, capsys, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    code, lines = run_cli(capsys)
    assert code == 2 and len(lines) == 1, lines
    assert "residences/cairn.yaml" in lines[0] and "discord.token_env" in lines[0]
    assert "RESIDENTS_E2E_CAIRN_TOKEN" in lines[0]
    assert not (base / "ledger.db").exists()


def test_no_provider_key_or_base_url_stops_start_up_with_one_line(base, capsys, monkeypatch):
    monkeypatch.setenv("RESIDENTS_E2E_CAIRN_TOKEN", "t")
    code, lines = run_cli(capsys)
    assert code == 2 and len(lines) == 1 and "ANTHROPIC_API_KEY" in lines[0] and "ANTHROPIC_BASE_URL" in lines[0]
    monkeypatch.delenv("RESIDENTS_E2E_CAIRN_TOKEN")
    code, lines = run_cli(capsys, "--discord-api", "http://127.0.0.1:9")  # no token needed locally, still no key
    assert code == 2 and len(lines) == 1 and "ANTHROPIC_API_KEY" in lines[0]


def test_no_discord_residence_stops_start_up_with_one_line(base, capsys, monkeypatch):
    (base / "residences" / "cairn.yaml").write_text(RESIDENCE_YAML.split("discord:")[0])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    code, lines = run_cli(capsys)
    assert code == 2 and len(lines) == 1 and "discord" in lines[0]


async def test_an_unknown_channel_stops_run_bots(tmp_path):
    provider = ProviderServer()
    await provider.start()
    try:
        async with running_room(["general"]) as room:
            r = res(discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general", "nowhere"]})
            with pytest.raises(StartupError) as info:
                await asyncio.wait_for(
                    run_bots(
                        Deployment([r], {"cairn": "local-cairn"}),
                        str(tmp_path / "l.db"),
                        {"ANTHROPIC_BASE_URL": provider.url, "ANTHROPIC_API_KEY": "k"},
                        guild_ready_timeout=0.05,
                    ),
                    timeout=10,
                )
            line = str(info.value)
            assert "\n" not in line and "'nowhere'" in line and "residences/cairn.yaml" in line
            assert "discord.channels" in line and "'general'" not in line
            assert not any(b["connected"] for b in room.snapshot()["bots"])
    finally:
        await provider.stop()


# ---------------------------------------------------------------------------------------------- 9


async def test_mentions_during_a_slow_stream_queue_one_more_turn(tmp_path):
    async with deployed(tmp_path, [res()], responder=short_replies) as d:
        cog = d.bot("cairn").get_cog("ResidentCog")
        ch = int(d.room.channel_id())
        d.provider.hold()
        first = d.room.post("general", "alice", "one, @cairn", mentions=["cairn"])
        await eventually(lambda: d.provider.arrived == 1)
        later = []
        for who in ("bob", "carol", "dave"):
            later.append(d.room.post("general", who, f"{who} too, @cairn", mentions=["cairn"]))
            await d.wait_seen("cairn", later[-1]["id"])
            assert cog.queued[ch]
        assert d.provider.arrived == 1  # nothing runs beside the held generation
        d.provider.release()
        await d.wait_bot_messages(2)
        await d.quiet(0.3)
        assert d.provider.arrived == 2 and len(d.bot_messages()) == 2  # one queued turn for three messages
        g1, g2 = await d.generations()
        assert (g1.trigger, g2.trigger) == (first["id"], later[0]["id"])
        # The queued turn exists to answer what arrived while cairn was writing: its request must put those
        # messages after the earlier reply (which never saw them), not declare that nothing new was said.
        msgs = d.provider.requests[1]["messages"]
        last_own = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        after = "\n\n".join(m["content"] for m in msgs[last_own + 1 :])
        assert all(f"{who}: {who} too, @cairn" in after for who in ("bob", "carol", "dave")), msgs
        assert QUIET_NOTE not in after


async def test_a_message_during_a_cut_stream_supersedes_bounded_continuation(tmp_path):
    policy = {"continuation": {"standing": "bounded", **BOUNDS}}
    async with deployed(
        tmp_path,
        [res(max_tokens=600, policy=policy)],
        calls=[Call(sse=specimen("cont-first.sse"))],
        responder=short_replies,
    ) as d:
        d.provider.hold()
        d.room.post("general", "alice", "write it all, @cairn", mentions=["cairn"])
        await eventually(lambda: d.provider.arrived == 1)
        moved = d.room.post("general", "bob", "actually, something else @cairn", mentions=["cairn"])
        await d.wait_seen("cairn", moved["id"])
        d.provider.release()
        await d.wait_receipt()
        await d.room.wait_for_message(lambda m: m["content"] == "Cairn says a short thing.", timeout=10)
        await d.quiet(0.3)
        g1, g2 = await d.generations()
        assert (g1.status, g1.continuation_ended, len(g1.segments)) == ("truncated", "superseded", 1)
        receipts = [m["content"] for m in d.bot_messages() if m["content"].startswith("-# ")]
        assert receipts == [
            "-# Output ceiling reached at 600 tokens; the remainder was not generated. "
            "Continuation stopped because the room moved on."
        ]
        assert len(d.provider.requests) == 2  # no continuation call was made
        assert CONTINUE_NOTE not in str(d.provider.requests[1]) and g2.trigger == moved["id"]
        assert d.provider.requests[1]["messages"][-1]["role"] == "user"


# ---------------------------------------------------------------------------------------------- issue 12 A


async def test_the_resident_lists_reads_guards_and_publishes_its_stumps_and_moderators_obey(tmp_path):
    """Real discord.py bots against the local room: the scripted provider makes cairn call its own `stumps`
    tool across turns (list, read, set_access private, publish); a moderator's /stumps show then obeys
    cairn's choice, and every read of a stump's text is recorded and shown."""
    state: dict[str, str] = {}

    def script(body: dict) -> Call:
        last = body["messages"][-1]
        results = (
            [b for b in last["content"] if b["type"] == "tool_result"] if isinstance(last["content"], list) else []
        )
        if not results:  # a new turn
            if "publish" in last["content"]:
                return Call(
                    sse=sse.tool_use_stream(
                        "", "toolu_pub", "stumps", json.dumps({"action": "publish", "id": state["a"]}), 20
                    )
                )
            return Call(sse=sse.tool_use_stream("Looking.", "toolu_list", "stumps", '{"action": "list"}', 20))
        result = json.loads(results[0]["content"])
        state.setdefault("results", []).append(result)
        step = result.get("action")
        if step == "list":
            state["a"] = next(s["id"] for s in result["stumps"] if not s["reads"])  # the one no moderator read
            return Call(
                sse=sse.tool_use_stream(
                    "", "toolu_read", "stumps", json.dumps({"action": "read", "id": state["a"]}), 20
                )
            )
        if step == "read":
            return Call(
                sse=sse.tool_use_stream(
                    "",
                    "toolu_acc",
                    "stumps",
                    json.dumps({"action": "set_access", "id": state["a"], "access": "private"}),
                    20,
                )
            )
        return Call(sse=sse.stream(f"Done: {step}.", "end_turn", 5))

    calls = [Call(sse=specimen("overloaded-after-257.sse"))] * 2 + [Call(sse=specimen("end-turn.sse"))]
    async with deployed(tmp_path, [res()], calls=calls, responder=script) as d:
        await ask(d, "alice", "tell me about the harbour, @cairn", 0)
        [g1] = await d.generations()
        older, newer = [s for s in g1.stumps if s.cause == "retry-abandoned"]
        # a moderator reads the newer fragment: shown, and recorded as a read
        out = await d.command("moddy", "stumps", sub("show", id=newer.id))
        shown = "\n".join(contents(out))
        assert squash(FRAGMENT) in squash(shown) and "access: moderators" in shown and "moddy" in shown
        room_before = len(d.messages())

        # turn 2: list → read → set_access private → the reply
        new = await ask(d, "alice", "what did you set aside, @cairn?", len(d.bot_messages()))
        assert [m["content"] for m in new] == ["Looking.\n\nDone: set_access."]
        listed, read, guarded = state["results"]
        assert {s["id"] for s in listed["stumps"]} == {older.id, newer.id} and state["a"] == older.id
        [by_mod] = next(s for s in listed["stumps"] if s["id"] == newer.id)["reads"]
        assert by_mod["kind"] == "moderator" and by_mod["reader"].startswith("moddy (")
        assert (read["text"], guarded["access"], guarded["moderators_may_read"]) == (FRAGMENT, "private", False)
        assert len(d.messages()) == room_before + 2  # the question and one reply: nothing of the tool in the room
        g2 = (await d.generations())[-1]
        out = await d.command("moddy", "generation", sub("show", ref=g2.id))
        prov = "\n".join(contents(out))
        assert "tool rounds:" in prov and "round 1.1 stumps list" in prov and "round 2.1 stumps read" in prov
        assert "round 3.1 stumps set_access" in prov and FRAGMENT[:40] not in prov  # never a result's text

        # the moderator asks for the guarded one: withheld, by the resident's choice; its reader shown
        out = await d.command("moddy", "stumps", sub("show", id=older.id))
        assert_ephemeral_pages(out)
        shown = "\n".join(contents(out))
        assert len(out["responses"]) == 1 and "access: private" in shown and "set this stump private" in shown
        assert "cairn, resident" in shown and FRAGMENT[:40] not in shown and FRAGMENT[-40:] not in shown

        # turn 3: publish → the fragment as recovered text, one receipt, then the reply
        n = len(d.bot_messages())
        new = await ask(d, "alice", "please publish it, @cairn", n, expect=3)
        assert [m["content"] for m in new] == [
            FRAGMENT,
            "-# Recovered fragment of 257 characters from an abandoned attempt, published at the resident's request.",
            "Done: publish.",
        ]
        assert all(quiet_pings(m) for m in new)
        g3 = (await d.generations())[-1]
        assert [p.kind for p in sorted(g3.posts, key=lambda p: p.seq)] == ["recovered", "receipt", "speech"]
        await posts_match_room(d, g3)
        assert (await d.ledger.get_stump(older.id)).published
        # still private: the room has the text now, the stump's access is unchanged
        out = await d.command("moddy", "stumps", sub("show", id=older.id))
        shown = "\n".join(contents(out))
        assert " published" in shown and "set this stump private" in shown and len(out["responses"]) == 1
        assert await verify(d.ledger) == []


REASONING = "The wall runs 412 metres from the lighthouse, and the spur at the ferry slip adds 38 more."
SAID = "The harbour wall is 450 metres long in all; let me fetch the survey to be sure."
TOOL_INPUT = '{"survey": "harbour wall", "sections": ["main", "spu'


def reasoning_text_and_a_cut_tool_call() -> bytes:
    """One answer with a reasoning block (and its signature), a text block, then a tool call whose input
    the output ceiling cuts: three blocks of three types, only the middle one ever posted."""

    def ev(name: str, **data) -> bytes:
        return sse.event(name, {"type": name, **data})

    body = ev(
        "message_start",
        message={
            "id": "msg_blocks",
            "type": "message",
            "role": "assistant",
            "model": "claude-3-opus-20240229",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    )
    body += ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": "", "signature": ""})
    for p in sse.pieces(REASONING):
        body += ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": p})
    body += ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "c2lnbmVk"})
    body += ev("content_block_stop", index=0)
    body += ev("content_block_start", index=1, content_block={"type": "text", "text": ""})
    for p in sse.pieces(SAID):
        body += ev("content_block_delta", index=1, delta={"type": "text_delta", "text": p})
    body += ev("content_block_stop", index=1)
    body += ev(
        "content_block_start",
        index=2,
        content_block={"type": "tool_use", "id": "toolu_01", "name": "survey", "input": {}},
    )
    for p in [""] + sse.pieces(TOOL_INPUT):
        body += ev("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": p})
    body += ev("content_block_stop", index=2)
    body += ev(
        "message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None}, usage={"output_tokens": 1024}
    )
    return body + ev("message_stop")


async def test_generation_show_lists_the_blocks_by_type_and_size_never_their_content(tmp_path):
    """/generation show over real discord.py: each block of the attempt by index, type and characters (the
    text block's span too), in an ephemeral answer that never carries the reasoning or the tool input."""
    async with deployed(tmp_path, [res(max_tokens=1024)], calls=[Call(sse=reasoning_text_and_a_cut_tool_call())]) as d:
        d.room.post("general", "alice", "how long is the harbour wall, @cairn?", mentions=["cairn"])
        await d.wait_receipt()
        await d.quiet(0.1)
        assert [m["content"] for m in d.bot_messages()] == [
            SAID,
            "-# Output ceiling reached at 1,024 tokens; the remainder was not generated.",
        ]
        [g] = await d.generations()
        room_before = len(d.messages())

        out = await d.command("moddy", "generation", sub("show", ref=g.id))
        assert_ephemeral_pages(out)
        prov = "\n".join(contents(out))
        assert (
            f"blocks: #0 thinking {len(REASONING)} chars · #1 text {len(SAID)} chars [0–{len(SAID)}] · "
            f"#2 tool_use {len(TOOL_INPUT)} chars"
        ) in prov
        assert "tool_use block #2" in prov  # the cut input is a stump, named by its block
        for secret in (REASONING, REASONING[:30], REASONING[-30:], "spur", TOOL_INPUT, 'harbour wall"', "c2lnbmVk"):
            assert secret not in prov, secret
        assert SAID[:30] not in prov  # nor the posted text: provenance, not content
        await d.quiet(0.1)
        assert len(d.messages()) == room_before  # nothing of it reached the room
        assert await verify(d.ledger, unsettled_as_violations=True) == []
