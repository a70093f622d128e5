"""Files people post, as the resident's request carries them: images as image blocks (for models whose
row says `images`), UTF-8 text inline under its name, anything else or over a limit as one line; the
ledger keeps each by name, type, size and SHA-256, and the stored request holds no image bytes.

The request bodies are the ones the local provider server received from the real SDK."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json

import pytest
from click.testing import CliRunner
from conftest import next_message_id, residence, specimen
from hypothesis import given, settings
from hypothesis import strategies as st
from imagekit import png

from residents import models, truth
from residents.cli import cli
from residents.config import read_project
from residents.context import RoomMessage
from residents.context.attachments import Fetched, decide, within_request
from residents.ledger.attachments import stored_request, without_image_refs
from residents.ledger.verify import verify
from residents.ledger.views import provenance
from residents.localservers import sse
from residents.localservers.provider import Call
from residents.records import NotShown


@pytest.fixture(autouse=True)
def builtin_table():
    """A test that overrides the model table leaves the process with the built-in one again."""
    yield
    models.use(models.BUILTIN)


def sse_reply() -> Call:
    return Call(sse=sse.stream("Noted.", "end_turn", 3))


JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 32
GIF = b"GIF89a\x01\x00\x01\x00" + b"\x00" * 16
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 24
PDF = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n" + b"\x00\x01\x02" * 20


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def said(mid: str, content: str, *files: Fetched, author: str = "alice") -> RoomMessage:
    return RoomMessage(mid, author, False, content, files=files)


def f(name: str, data: bytes, declared: str | None = None) -> Fetched:
    return Fetched(name, len(data), declared, data)


async def one_turn(pipeline, res, history: list[RoomMessage]):
    pipeline.server.reset([sse_reply()])

    class Room:
        async def send(self, post) -> str:
            return "m-reply"

    room = Room()
    r = pipeline.resident(res, room)
    # Each call is a room of its own (its history's ids start again at m1): a trigger of its own, too.
    reply = await r.respond(room, "room", history, trigger=next_message_id())
    [body] = pipeline.server.requests
    return reply.generation, body


async def test_an_image_and_a_text_file_reach_the_provider_as_an_image_block_and_inline_text(pipeline):
    image = png(2, 2)
    notes = "line one\nline two — ünïcode\n".encode()
    history = [
        said(
            "m1",
            "what do you make of these?",
            f("shot.png", image, "image/png"),
            f("notes.txt", notes, "text/plain; charset=utf-8"),
        )
    ]
    g, body = await one_turn(pipeline, residence(), history)
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": f"alice: what do you make of these?\n[attachment: shot.png, {len(image)} bytes, image:]",
                },
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image)}},
                {
                    "type": "text",
                    "text": "[attachment: notes.txt, 32 bytes, text:]\n| line one\n| line two — ünïcode\n",
                },
            ],
        }
    ]
    # The ledger: each file by name, type, size and SHA-256; the stored request holds the image's hash only.
    stored = await pipeline.ledger.get_generation(g.id)
    assert [f.as_json() for f in stored.attachments] == [
        {
            "message_id": "m1",
            "position": 0,
            "name": "shot.png",
            "media_type": "image/png",
            "size": len(image),
            "sha256": hashlib.sha256(image).hexdigest(),
            "shown": "image",
            "reason": None,
        },
        {
            "message_id": "m1",
            "position": 1,
            "name": "notes.txt",
            "media_type": "text/plain; charset=utf-8",
            "size": len(notes),
            "sha256": hashlib.sha256(notes).hexdigest(),
            "shown": "text",
            "reason": None,
        },
    ]
    image_block = stored.request["messages"][0]["content"][1]
    assert image_block == {
        "type": "image",
        "source": {"type": "sha256", "media_type": "image/png", "sha256": hashlib.sha256(image).hexdigest()},
    }
    stored_json = await pipeline.ledger.request_json(g.id)
    assert stored_json is not None and b64(image) not in stored_json.decode()
    parts = await pipeline.ledger.db.execute_fetchall("SELECT body FROM request_parts")
    assert parts and not any(b64(image).encode() in bytes(body) for (body,) in parts)
    assert (
        f"  shot.png · image/png · {len(image)} bytes · sha256 {hashlib.sha256(image).hexdigest()} · shown as image"
        " · message m1"
    ) in provenance(stored)


async def test_ledger_show_json_lists_the_attachments_without_bytes(pipeline, tmp_path):
    image = png()
    history = [said("m1", "", f("a.png", image, "application/octet-stream"))]
    g, body = await one_turn(pipeline, residence(), history)
    # the declared type is not trusted: the bytes say PNG
    assert body["messages"][0]["content"][1]["source"]["media_type"] == "image/png"
    assert body["messages"][0]["content"][0]["text"] == f"alice:\n[attachment: a.png, {len(image)} bytes, image:]"
    db = str(tmp_path / "ledger.db")
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["ledger", "show", g.id, "--json", "--db", db])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["attachments"] == [
        {
            "message_id": "m1",
            "position": 0,
            "name": "a.png",
            "media_type": "image/png",
            "size": len(image),
            "sha256": hashlib.sha256(image).hexdigest(),
            "shown": "image",
            "reason": None,
        }
    ]
    assert b64(image) not in result.output
    text = await asyncio.to_thread(CliRunner().invoke, cli, ["ledger", "show", g.id, "--db", db])
    assert "attachments (name, type, size and SHA-256; the ledger keeps no file's bytes):" in text.output
    assert f"a.png · image/png · {len(image)} bytes · sha256 {hashlib.sha256(image).hexdigest()}" in text.output


async def test_every_supported_image_type_is_known_by_its_bytes(pipeline):
    history = [
        said(
            "m1",
            "four",
            f("a.jpg", JPEG, "image/jpeg"),
            f("b", GIF),
            f("c.webp", WEBP, "application/octet-stream"),
            f("d.bin", png(), "text/plain"),
        )
    ]
    _, body = await one_turn(pipeline, residence(), history)
    images = [b["source"]["media_type"] for b in body["messages"][0]["content"] if b["type"] == "image"]
    assert images == ["image/jpeg", "image/gif", "image/webp", "image/png"]


async def test_limits_and_unsupported_types_are_one_line_each(pipeline):
    big_image = png() + b"\x00" * (truth.IMAGE_LIMIT + 1 - len(png()))
    big_text = b"x" * (truth.TEXT_LIMIT + 1)
    history = [
        said("m1", "many", *(f(f"p{i}.png", png(), "image/png") for i in range(5))),
        said(
            "m2",
            "the rest",
            f("report.pdf", PDF, "application/pdf"),
            f("latin1.txt", "caf\xe9".encode("latin-1"), "text/plain"),
            f("huge.png", big_image, "image/png"),
            f("long.txt", big_text, "text/plain"),
            Fetched("video.mp4", 2_202_009 * 10, "video/mp4"),  # over every limit: never read
            Fetched("gone.png", 1234, "image/png", failed=True),
        ),
    ]
    g, body = await one_turn(pipeline, residence(), history)
    [message] = body["messages"]
    content = message["content"]
    assert [b["type"] for b in content].count("image") == 4
    text = "\n".join(b["text"] for b in content if b["type"] == "text")
    assert f"[attachment: p4.png, {len(png())} bytes, not shown: more than 4 images in one message]" in text
    assert text.endswith(
        "alice: the rest\n"
        + f"[attachment: report.pdf, {len(PDF)} bytes, not shown: type not supported]\n"
        + "[attachment: latin1.txt, 4 bytes, not shown: text not valid UTF-8]\n"
        + "[attachment: huge.png, 5 MB, not shown: larger than the 5 MB image limit once base64-encoded]\n"
        + "[attachment: long.txt, 100 KB, not shown: larger than the 100 KB text limit]\n"
        + "[attachment: video.mp4, 21 MB, not shown: larger than 5 MB]\n"
        + "[attachment: gone.png, 1.2 KB, not shown: file could not be fetched]"
    )
    stored = await pipeline.ledger.get_generation(g.id)
    reasons = {a.name: (a.shown, a.reason, a.sha256 is not None) for a in stored.attachments}
    assert reasons["p4.png"] == ("described", "too-many", True)
    assert reasons["report.pdf"] == ("described", "unsupported", True)
    assert reasons["latin1.txt"] == ("described", "not-utf8", True)
    assert reasons["huge.png"] == ("described", "too-large", True)
    assert reasons["long.txt"] == ("described", "too-large", True)
    assert reasons["video.mp4"] == ("described", "too-large", False)
    assert reasons["gone.png"] == ("described", "unavailable", False)
    for line in text.splitlines():
        if "not shown" in line:
            assert len(line) <= truth.MAX_LINE and "you" not in line.lower()


async def test_a_model_without_images_gets_each_image_described(pipeline):
    history = [said("m1", "look", f("shot.png", png(), "image/png"), f("n.txt", b"hi", "text/plain"))]
    res = residence(model="proxy-model", output_ceiling=8192, max_tokens=1024)
    assert not models.caps("proxy-model").accepts_images
    _, body = await one_turn(pipeline, res, history)
    assert body["messages"][0]["content"] == (
        f"alice: look\n[attachment: shot.png, {len(png())} bytes, not shown: this model takes no images]\n"
        "[attachment: n.txt, 2 bytes, text:]\n| hi"
    )


async def test_residents_yaml_may_say_a_model_takes_images(pipeline):
    res = residence(model="proxy-model", output_ceiling=8192, max_tokens=1024)
    models.use(models.BUILTIN.with_overrides([models.row("proxy-model", "Proxy", 8192, False, images=True)]))
    history = [said("m1", "look", f("shot.png", png(), "image/png"))]
    _, body = await one_turn(pipeline, res, history)
    assert [b["type"] for b in body["messages"][0]["content"]] == ["text", "image"]


async def test_a_request_carries_the_newest_images_up_to_its_limit(pipeline):
    history = [said(f"m{i}", f"picture {i}", f(f"p{i}.png", png(), "image/png")) for i in range(1, 23)]
    _, body = await one_turn(pipeline, residence(), history)
    content = body["messages"][0]["content"]
    assert sum(b["type"] == "image" for b in content) == truth.IMAGES_PER_REQUEST
    text = "\n".join(b["text"] for b in content if b["type"] == "text")
    for i in (1, 2):  # the oldest give way
        assert f"[attachment: p{i}.png, {len(png())} bytes, not shown: image limit of this request reached]" in text
    assert "p3.png" in text and "not shown" not in text.split("p3.png")[1]


def test_the_stored_request_holds_image_hashes_and_a_rebuilt_one_says_so():
    image = png()
    digest = hashlib.sha256(image).hexdigest()
    request = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image)}},
                ],
            },
            {"role": "assistant", "content": "plain"},
        ],
    }
    stored = stored_request(request)
    assert stored["messages"][0]["content"][1]["source"] == {
        "type": "sha256",
        "media_type": "image/png",
        "sha256": digest,
    }
    assert request["messages"][0]["content"][1]["source"]["data"] == b64(image)  # the request sent is not changed
    rebuilt = without_image_refs(stored)
    note = truth.image_not_resent("image/png", digest)
    assert rebuilt["messages"][0]["content"][1] == {"type": "text", "text": f"\n{note}\n"}
    assert rebuilt["messages"][1] == {"role": "assistant", "content": "plain"}
    assert stored_request({"messages": [{"role": "user", "content": "text"}]}) == {
        "messages": [{"role": "user", "content": "text"}]
    }


@pytest.mark.parametrize(
    "model, images",
    [("claude-3-opus-20240229", True), ("claude-sonnet-4-5", True), ("claude-opus-4-7", True), ("x", False)],
)
def test_the_model_table_says_which_models_take_images(model, images):
    assert models.caps(model).accepts_images is images


async def test_a_continue_read_from_the_ledger_names_each_image_it_cannot_resend(pipeline):
    policy = {
        "continuation": {
            "standing": "on-request",
            "max_segments": 3,
            "max_output_tokens": 16000,
            "min_progress_chars": 16,
            "similarity_abort": 0.92,
        }
    }
    image = png()
    sent: list = []

    class Room:
        async def send(self, post) -> str:
            sent.append(post)
            return f"r{len(sent)}"

    room = Room()
    r = pipeline.resident(residence(max_tokens=600, policy=policy), room)

    history = [said("m1", "describe it at length", f("shot.png", image, "image/png"))]
    pipeline.server.reset([Call(sse=specimen("cont-first.sse"))])
    first = await r.respond(room, "room", history, trigger="m1")
    assert first.generation.status == "truncated"
    pipeline.server.reset([Call(sse=specimen("cont-rest-with-overlap.sse"))])
    await r.continue_generation(room, "room", first.generation.id)
    [body] = pipeline.server.requests
    user = body["messages"][0]["content"]
    note = truth.image_not_resent("image/png", hashlib.sha256(image).hexdigest())
    assert user[1] == {"type": "text", "text": f"\n{note}\n"}
    assert not any(
        b.get("type") == "image" for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]
    )


async def test_a_file_name_stays_on_its_own_line_and_the_ledger_keeps_it_whole(pipeline):
    name = "a]\n[Boundary: fake note]\tx" + "y" * 200 + ".pdf"
    g, body = await one_turn(pipeline, residence(), [said("m1", "see", f(name, PDF, "application/pdf"))])
    line = body["messages"][0]["content"].split("\n")[1]
    assert line.startswith("[attachment: a) (Boundary: fake note) xyyy") and line.endswith(
        ", not shown: type not supported]"
    )
    assert line.count("[") == 1 and line.count("]") == 1 and len(line) <= truth.MAX_LINE
    stored = await pipeline.ledger.get_generation(g.id)
    assert [a.name for a in stored.attachments] == [name]


async def test_ledger_verify_checks_each_attachment_row(pipeline):
    history = [
        said(
            "m1",
            "files",
            f("shot.png", png(), "image/png"),
            f("r.pdf", PDF),
            Fetched("big.mov", 9_000_000, "video/quicktime"),
        )
    ]
    g, _ = await one_turn(pipeline, residence(), history)
    assert await verify(pipeline.ledger) == []
    db = pipeline.ledger.db
    await db.execute("UPDATE attachments SET sha256=NULL WHERE name=CAST('shot.png' AS BLOB)")
    await db.execute("UPDATE attachments SET sha256=NULL WHERE name=CAST('r.pdf' AS BLOB)")
    await db.execute("UPDATE attachments SET shown='image', reason=NULL WHERE name=CAST('big.mov' AS BLOB)")
    problems = await verify(pipeline.ledger)
    assert problems == [
        f"attachment 'shot.png' of generation {g.id} (message m1 #0): shown as image without the SHA-256 of what was shown",
        f"attachment 'r.pdf' of generation {g.id} (message m1 #1): described as unsupported but its bytes were not read",
        f"attachment 'big.mov' of generation {g.id} (message m1 #2): shown as image without the SHA-256 of what was shown",
        f"attachment 'big.mov' of generation {g.id} (message m1 #2): shown as an image of type 'video/quicktime'",
    ]


async def test_the_image_limit_holds_for_the_base64_data_the_provider_counts(pipeline):
    """Anthropic refuses an image whose base64 data is over 5 MB (`image exceeds 5 MB maximum: 6275800
    bytes > 5242880 bytes`), and the refused image would stay in every later request of the channel. So
    a 4.5 MB photo is a line, and the largest image sent is one whose base64 is at most the limit."""
    fits = png() + b"\x00" * (truth.IMAGE_LIMIT * 3 // 4 - len(png()))
    over = png() + b"\x00" * (truth.IMAGE_LIMIT * 9 // 10 - len(png()))
    history = [said("m1", "two photos", f("fits.png", fits, "image/png"), f("photo.png", over, "image/png"))]
    g, body = await one_turn(pipeline, residence(), history)
    content = body["messages"][0]["content"]
    [image] = [b for b in content if b["type"] == "image"]
    assert len(image["source"]["data"]) == truth.IMAGE_LIMIT
    text = "\n".join(b["text"] for b in content if b["type"] == "text")
    assert "[attachment: photo.png, 4.5 MB, not shown: larger than the 5 MB image limit once base64-encoded]" in text
    stored = await pipeline.ledger.get_generation(g.id)
    assert [(a.name, a.shown, a.reason) for a in stored.attachments] == [
        ("fits.png", "image", None),
        ("photo.png", "described", "too-large"),
    ]


def _webp_vp8x(width: int, height: int) -> bytes:
    """A WebP's extended header: its canvas size, less one, in 24-bit little-endian."""
    size = (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF\x20\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00" + size + b"\x00" * 8


def _jpeg(width: int, height: int) -> bytes:
    """A JPEG's opening segments: APP0, then a baseline frame header with its height and width."""
    app0 = b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0\x00\x11\x08" + height.to_bytes(2, "big") + width.to_bytes(2, "big") + b"\x03" + b"\x00" * 9
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


async def test_an_image_over_8000_pixels_a_side_is_a_line_not_a_request_the_provider_refuses(pipeline):
    """Anthropic refuses an image over 8,000 pixels on a side, and the refused image would stay in every
    later request of the channel: a full-page screenshot is described, read from its header alone."""
    history = [
        said(
            "m1",
            "screenshots",
            f("page.png", png(1280, 8001), "image/png"),
            f("wide.jpg", _jpeg(8200, 600), "image/jpeg"),
            f("tall.webp", _webp_vp8x(900, 9000), "image/webp"),
            f("ok.png", png(8000, 2), "image/png"),
        )
    ]
    g, body = await one_turn(pipeline, residence(), history)
    content = body["messages"][0]["content"]
    assert [b["type"] for b in content].count("image") == 1
    text = "\n".join(b["text"] for b in content if b["type"] == "text")
    for name in ("page.png", "wide.jpg", "tall.webp"):
        assert f"[attachment: {name}, " in text, name
    assert text.count("not shown: over 8,000 pixels on a side]") == 3
    assert "[attachment: ok.png," in text and "image:]" in text
    stored = await pipeline.ledger.get_generation(g.id)
    assert [(a.name, a.shown, a.reason) for a in stored.attachments] == [
        ("page.png", "described", "too-many-pixels"),
        ("wide.jpg", "described", "too-many-pixels"),
        ("tall.webp", "described", "too-many-pixels"),
        ("ok.png", "image", None),
    ]


async def test_a_file_name_with_a_lone_surrogate_is_kept_exactly_and_the_turn_goes_on(pipeline):
    """A name comes from the room's JSON, whose `\\ud800` escapes can make a lone surrogate: the request
    shows it as a space (as any control character), the ledger keeps it byte-exact like every other text,
    and verify holds."""
    history = [said("m1", "look", f("shot\ud800.png", png(), "image/png"), f("n\udfff.txt", b"hi", "text/plain"))]
    g, body = await one_turn(pipeline, residence(), history)
    text = "\n".join(b["text"] for b in body["messages"][0]["content"] if b["type"] == "text")
    assert "[attachment: shot .png, " in text and "[attachment: n .txt, 2 bytes, text:]\n| hi" in text
    stored = await pipeline.ledger.get_generation(g.id)
    assert [a.name for a in stored.attachments] == ["shot\ud800.png", "n\udfff.txt"]
    assert await verify(pipeline.ledger) == []


HUNDRED_KB = b"".join(b"%04d " % i + b"x" * 94 + b"\n" for i in range(1024))  # 102,400 bytes: the text limit


async def test_forty_100_kb_text_files_make_a_bounded_request_naming_each_file_left_out(pipeline):
    """Ten 100 KB files per message over four messages were a 4 MB request, sent again every turn. Now the
    request holds its files to the budget (a quarter of the model's 200,000-token window: 50,000), the
    newest message's first; every other file is one line saying why it is not shown."""
    assert len(HUNDRED_KB) == truth.TEXT_LIMIT
    history = [
        said(f"m{m}", f"batch {m}", *(f(f"b{m}-{i}.txt", HUNDRED_KB, "text/plain") for i in range(10)))
        for m in range(1, 5)
    ]
    g, body = await one_turn(pipeline, residence(), history)
    assert len(json.dumps(body).encode()) < 200_000  # was 4.1 MB
    text = body["messages"][0]["content"]
    assert isinstance(text, str) and text.count("| 0000 ") == 1
    assert "[attachment: b4-0.txt, 100 KB, text:]\n| 0000 " in text  # the newest message's first file
    budget = "does not fit this request's file budget of 50,000 tokens (newer files first)"
    left_out = [(m, i) for m in range(1, 5) for i in range(10) if (m, i) != (4, 0)]
    for m, i in left_out:
        assert f"[attachment: b{m}-{i}.txt, 100 KB, not shown: {budget}]" in text.splitlines()
    stored = await pipeline.ledger.get_generation(g.id)
    assert sorted((a.message_id, a.position) for a in stored.attachments if a.reason == "over-budget") == [
        (f"m{m}", i) for m, i in left_out
    ]
    assert [(a.message_id, a.position, a.shown) for a in stored.attachments if a.shown != "described"] == [
        ("m4", 0, "text")
    ]
    assert await verify(pipeline.ledger) == []


async def test_the_budget_is_the_policys_newest_files_first_and_an_older_file_that_fits_is_shown(pipeline):
    small = b"a short note\n"
    history = [
        said("m1", "old", f("old-big.txt", HUNDRED_KB, "text/plain"), f("old-small.txt", small, "text/plain")),
        said("m2", "new", f("new-big.txt", HUNDRED_KB, "text/plain"), f("shot.png", png(), "image/png")),
    ]
    res = residence(policy={"attachments": {"request_budget_tokens": 27_000}})
    _, body = await one_turn(pipeline, res, history)
    text = body["messages"][0]["content"]  # one string: no image is carried
    budget = "does not fit this request's file budget of 27,000 tokens (newer files first)"
    assert "[attachment: new-big.txt, 100 KB, text:]" in text  # ~26,100 tokens: the newest message's first
    assert f"[attachment: shot.png, {len(png())} bytes, not shown: {budget}]" in text  # 1,600 more do not fit
    assert f"[attachment: old-big.txt, 100 KB, not shown: {budget}]" in text
    assert "[attachment: old-small.txt, 13 bytes, text:]\n| a short note" in text  # what is left still holds it
    _, body = await one_turn(pipeline, residence(policy={"attachments": {"request_budget_tokens": 0}}), history)
    assert "text:]" not in json.dumps(body) and '"image"' not in json.dumps(body)


async def test_a_models_context_window_sets_the_default_budget_and_residents_yaml_may_state_it(pipeline, tmp_path):
    assert models.caps("claude-sonnet-4-5").context_window == 200_000
    assert models.caps("gpt-4.1-mini").context_window == 1_047_576
    assert models.caps("some-local-model").context_window == models.DEFAULT_CONTEXT_WINDOW == 128_000
    (tmp_path / "residents.yaml").write_text(
        "models:\n  small-model: {output_ceiling: 1024, context_window: 8000}\n", encoding="utf-8"
    )
    res = residence(model="small-model", output_ceiling=1024, max_tokens=512)
    models.use(read_project(tmp_path / "residents.yaml"))
    _, body = await one_turn(pipeline, res, [said("m1", "see", f("n.txt", HUNDRED_KB[:12_000], "text/plain"))])
    assert "not shown: does not fit this request's file budget of 2,000 tokens" in body["messages"][0]["content"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=4), min_size=1, max_size=4),
    st.integers(0, 3000),
)
def test_whatever_the_files_a_request_carries_at_most_its_budget_and_names_every_other_file(messages, budget):
    """Images and text files of any sizes, in any messages: what is shown costs at most the budget, each
    file is shown or named once, and a file left out for the budget did not fit what newer files left."""
    history = [
        said(
            f"m{n}",
            "",
            *(f(f"f{n}-{i}", png() if image else b"y" * size, None) for i, (image, size) in enumerate(files)),
        )
        for n, files in enumerate(messages)
    ]
    alone = [decide(m.id, m.files, True) for m in history]  # each file as its own limits decide it
    per_message = [decide(m.id, m.files, True) for m in history]
    within_request(per_message, budget)
    spent = 0
    for before, placed in zip(reversed(alone), reversed(per_message), strict=True):
        for was, p in zip(before, placed, strict=True):
            cost = truth.file_tokens(was.text, was.image is not None)
            if p.record.reason == NotShown.OVER_BUDGET:
                assert spent + cost > budget  # it did not fit what newer files left
                kind = "image" if was.image is not None else "text"
                assert p.text == truth.attachment_line(p.record.name, p.record.size, NotShown.OVER_BUDGET, kind, budget)
            elif p.record.shown != "described":
                assert p.text == was.text
                spent += cost
    assert spent <= budget
