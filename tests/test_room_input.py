"""Odd room input: what people really post reaches the resident's request intact and never breaks a turn."""

from __future__ import annotations

from types import SimpleNamespace

from discordkit import deployed
from test_discord_e2e import res

from residents.discord.room import as_room_message
from residents.localservers import sse
from residents.localservers.provider import Call

ODD = [
    "zero\u200bwidth\u200djoin\u2060ers and a BOM\ufeff",
    "right-to-left: \u202eesrever\u202c and עברית مرحبا",
    "an unbalanced fence ```python\nprint('never closed')",
    "@everyone @here <@&123456> <#999> mentions of nobody in particular",
    "x" * 1960,
]


async def test_odd_messages_reach_the_request_exactly_and_every_turn_settles(tmp_path):
    replies = [Call(sse=sse.stream(f"Reply {i}.", "end_turn", 3)) for i in range(len(ODD))]
    async with deployed(tmp_path, [res()], calls=replies) as d:
        for i, text in enumerate(ODD):
            d.room.post("general", "alice", f"@cairn {text}", mentions=["cairn"])
            await d.wait_bot_messages(i + 1, timeout=10)
        await d.quiet(0.1)
        requests = d.provider.requests
        assert len(requests) == len(ODD)
        for text, req in zip(ODD, requests, strict=False):
            last = req["messages"][-1]
            # every line carries its author's name (only framework notes begin with `[`); without the
            # names, the text is exactly what was posted
            lines = last["content"].splitlines(keepends=True)
            assert last["role"] == "user" and all(ln.startswith("alice:") for ln in lines)
            assert "".join(ln.removeprefix("alice:").removeprefix(" ") for ln in lines).endswith(text)
        gens = await d.generations()
        assert [g.status for g in gens] == ["completed"] * len(ODD)
        assert [m["content"] for m in d.bot_messages()] == [f"Reply {i}." for i in range(len(ODD))]


def test_attachment_only_and_empty_messages_still_read_as_something():
    author = SimpleNamespace(display_name="alice", id=1, bot=False)
    only_file = SimpleNamespace(
        id=5, author=author, clean_content="", embeds=[], attachments=[SimpleNamespace(filename="map.png")]
    )
    assert as_room_message(only_file, self_id=2).content == "[attachment: map.png]"
    embed_only = SimpleNamespace(id=6, author=author, clean_content="", embeds=[object()], attachments=[])
    assert as_room_message(embed_only, self_id=2).content == "[embed]"
    empty = SimpleNamespace(id=7, author=author, clean_content="", embeds=[], attachments=[])
    assert as_room_message(empty, self_id=2).content == ""
