"""Files in the local room: people upload through the `/_room/` API (JSON, the web page's multipart form,
`payload_json` with files) and bots through Discord's own message-create form; each attachment is served
with its content type, a charset included; and an uploaded image reaches the provider as an image block,
end to end (real discord.py bots, the real anthropic SDK, the local servers over sockets)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import AsyncIterator

import aiohttp
import discord
import pytest
from discordkit import deployed
from imagekit import png
from test_discord_e2e import res

from residents.localservers import sse
from residents.localservers.provider import Call
from residents.localservers.room import RoomServer

try:
    from roomkit import ErrorGuard, error_guard, running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import ErrorGuard, error_guard, running_bot, running_room


@pytest.fixture
async def guard() -> AsyncIterator[ErrorGuard]:
    async with error_guard() as g:
        yield g


@pytest.fixture
async def room(guard: ErrorGuard) -> AsyncIterator[RoomServer]:
    async with running_room(["general"], guild_name="testroom") as server:
        yield server


async def fetch(url: str) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


async def post_form(room: RoomServer, form: aiohttp.FormData) -> dict:
    url = f"{room.url}/_room/channels/general/messages"
    async with aiohttp.ClientSession() as s, s.post(url, data=form) as r:
        assert r.status == 201, await r.text()
        return await r.json()


async def test_json_upload_with_base64_files(room: RoomServer) -> None:
    image = png()
    body = {
        "author": "alice",
        "content": "two files",
        "attachments": [
            {"filename": "shot.png", "data": base64.b64encode(image).decode()},
            {"filename": "notes.txt", "data": base64.b64encode(b"hello").decode(), "content_type": "text/plain"},
        ],
    }
    async with aiohttp.ClientSession() as s, s.post(f"{room.url}/_room/channels/general/messages", json=body) as r:
        assert r.status == 201, await r.text()
        view = await r.json()
    assert [(a["filename"], a["size"], a["content_type"]) for a in view["attachments"]] == [
        ("shot.png", len(image), "image/png"),
        ("notes.txt", 5, "text/plain"),
    ]
    assert await fetch(view["attachments"][0]["url"]) == (200, "image/png", image)
    async with aiohttp.ClientSession() as s:
        bad = {"author": "alice", "attachments": [{"filename": "x", "data": "not base64!"}]}
        async with s.post(f"{room.url}/_room/channels/general/messages", json=bad) as r:
            assert r.status == 400 and "attachments[0].data is not valid base64" in (await r.json())["message"]


async def test_the_web_pages_multipart_form_with_plain_fields(room: RoomServer) -> None:
    form = aiohttp.FormData()
    form.add_field("author", "alice")
    form.add_field("content", "from the page")
    form.add_field("files[0]", b"caf\xc3\xa9\n", filename="menu.txt", content_type="application/octet-stream")
    form.add_field("files[1]", png(), filename="shot.png", content_type="image/png")
    view = await post_form(room, form)
    assert view["author"] == "alice" and view["content"] == "from the page"
    assert [(a["filename"], a["content_type"]) for a in view["attachments"]] == [
        ("menu.txt", "text/plain; charset=utf-8"),  # as Discord reports a UTF-8 text file
        ("shot.png", "image/png"),
    ]
    # served with its charset (aiohttp refuses one given as `content_type=`)
    assert await fetch(view["attachments"][0]["url"]) == (200, "text/plain; charset=utf-8", b"caf\xc3\xa9\n")


async def test_payload_json_with_files_named_by_its_attachments(room: RoomServer) -> None:
    form = aiohttp.FormData()
    payload = {"author": "bob", "content": "renamed", "attachments": [{"id": 0, "filename": "report.txt"}]}
    form.add_field("payload_json", json.dumps(payload), content_type="application/json")
    form.add_field("files[0]", b"numbers", filename="blob", content_type="application/octet-stream")
    view = await post_form(room, form)
    assert view["author"] == "bob"
    assert [(a["filename"], a["size"]) for a in view["attachments"]] == [("report.txt", 7)]


async def test_a_text_attachment_with_a_charset_is_served_and_read_by_discord_py(room: RoomServer) -> None:
    form = aiohttp.FormData()
    form.add_field("payload_json", json.dumps({"content": "a note"}), content_type="application/json")
    form.add_field("files[0]", b"hi\n", filename="note.txt", content_type="text/plain; charset=utf-8")
    url = f"{room.url}/api/v10/channels/{room.channel_id()}/messages"
    async with aiohttp.ClientSession() as s, s.post(url, data=form, headers={"Authorization": "Bot local-sill"}) as r:
        assert r.status == 200, await r.text()
        [made] = (await r.json())["attachments"]
    assert await fetch(made["url"]) == (200, "text/plain; charset=utf-8", b"hi\n")
    async with running_bot(room.url, "local-cairn") as bot:
        channel = bot.get_channel(int(room.channel_id()))
        assert isinstance(channel, discord.TextChannel)
        [m] = [m async for m in channel.history(limit=1)]
        [a] = m.attachments
        assert (a.filename, a.size, a.content_type) == ("note.txt", 3, "text/plain; charset=utf-8")
        assert await a.read() == b"hi\n"


async def test_discords_message_create_form_from_a_bot(room: RoomServer) -> None:
    async with running_bot(room.url, "local-cairn") as bot:
        channel = bot.get_channel(int(room.channel_id()))
        assert isinstance(channel, discord.TextChannel)
        sent = await channel.send(
            "files", files=[discord.File(io.BytesIO(png()), "a.png"), discord.File(io.BytesIO(b"x"), "b.txt")]
        )
        assert [(a.filename, a.content_type) for a in sent.attachments] == [
            ("a.png", "image/png"),
            ("b.txt", "text/plain; charset=utf-8"),
        ]
        # the same form by hand, as Discord documents it: the payload's attachments name files[n]
        form = aiohttp.FormData()
        form.add_field(
            "payload_json",
            json.dumps({"content": "by hand", "attachments": [{"id": 0, "filename": "named.txt"}]}),
            content_type="application/json",
        )
        form.add_field("files[0]", b"body", filename="ignored.bin", content_type="application/octet-stream")
        url = f"{room.url}/api/v10/channels/{room.channel_id()}/messages"
        async with (
            aiohttp.ClientSession() as s,
            s.post(url, data=form, headers={"Authorization": "Bot local-cairn"}) as r,
        ):
            assert r.status == 200, await r.text()
            made = await r.json()
        assert [(a["filename"], a["size"]) for a in made["attachments"]] == [("named.txt", 4)]


async def test_an_uploaded_image_reaches_the_provider_as_an_image_block(tmp_path) -> None:
    image = png(3, 2)
    async with deployed(tmp_path, [res()], calls=[Call(sse=sse.stream("A small grey picture.", "end_turn", 6))]) as d:
        form = aiohttp.FormData()
        form.add_field("author", "alice")
        form.add_field("content", "@cairn what is this?")
        form.add_field("files[0]", image, filename="shot.png", content_type="application/octet-stream")
        form.add_field("files[1]", "ünï\n".encode(), filename="notes.md", content_type="text/markdown")
        form.add_field("files[2]", b"%PDF-1.7\n\x00\x01", filename="report.pdf", content_type="application/pdf")
        asked = await post_form(d.room, form)
        [reply] = await d.wait_bot_messages(1)
        await d.quiet(0.1)
        assert reply["content"] == "A small grey picture."
        [body] = d.provider.requests
        [message] = body["messages"]
        digest = hashlib.sha256(image).hexdigest()
        assert message["content"] == [
            {
                "type": "text",
                "text": f"alice: @cairn what is this?\n[attachment: shot.png, {len(image)} bytes, image:]",
            },
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()},
            },
            {
                "type": "text",
                "text": "[attachment: notes.md, 6 bytes, text:]\n| ünï\n\n"
                "[attachment: report.pdf, 11 bytes, not shown: type not supported]",
            },
        ]
        [g] = await d.generations()
        assert [(a.message_id, a.name, a.media_type, a.size, a.sha256, a.shown, a.reason) for a in g.attachments] == [
            (asked["id"], "shot.png", "image/png", len(image), digest, "image", None),
            (asked["id"], "notes.md", "text/markdown", 6, hashlib.sha256("ünï\n".encode()).hexdigest(), "text", None),
            (
                asked["id"],
                "report.pdf",
                "application/pdf",
                11,
                hashlib.sha256(b"%PDF-1.7\n\x00\x01").hexdigest(),
                "described",
                "unsupported",
            ),
        ]
        assert g.request["messages"][0]["content"][1]["source"] == {
            "type": "sha256",
            "media_type": "image/png",
            "sha256": digest,
        }


async def test_a_file_that_cannot_be_read_or_is_too_large_is_one_line_and_the_turn_goes_on(tmp_path) -> None:
    big = b"\x00" * (6 * 1024 * 1024)
    async with deployed(tmp_path, [res()], calls=[Call(sse=sse.stream("Noted.", "end_turn", 2))]) as d:
        asked = d.room.post(
            "general",
            "alice",
            "@cairn two files",
            mentions=["cairn"],
            attachments=[("gone.png", png(), "image/png"), ("big.bin", big, None)],
        )
        gone = next(a for a in asked["attachments"] if a["filename"] == "gone.png")
        del d.room.state.attachments[int(gone["url"].split("/")[-2])]  # its URL now answers 404
        await d.wait_bot_messages(1)
        await d.quiet(0.1)
        [body] = d.provider.requests
        assert body["messages"][0]["content"] == (
            "alice: @cairn two files\n"
            f"[attachment: gone.png, {len(png())} bytes, not shown: file could not be fetched]\n"
            "[attachment: big.bin, 6 MB, not shown: larger than 5 MB]"
        )
        [g] = await d.generations()
        assert [(a.name, a.sha256, a.reason) for a in g.attachments] == [
            ("gone.png", None, "unavailable"),
            ("big.bin", None, "too-large"),
        ]
