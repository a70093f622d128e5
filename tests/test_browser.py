"""The room's web page in a real browser: Debian's chromium, headless, driven by Playwright.

Only a browser shows whether a receipt *looks* like a boundary line rather than speech, and
whether the page's JavaScript keeps up with the live event stream; so these tests fail (never
skip) when chromium or playwright is missing. Install: `apt-get install -y chromium` and
`pip install playwright` (no `playwright install`: it downloads, and these machines can't).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import discord
import pytest
from conftest import residence, specimen
from discord import app_commands
from discord.ext import commands
from discordkit import deployed
from imagekit import png

from residents import truth
from residents.localservers import sse
from residents.localservers.provider import Call

try:
    from roomkit import running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import running_bot, running_room

try:
    from playwright.async_api import BrowserContext, Page, async_playwright, expect

    PLAYWRIGHT_ERROR: str | None = None
except ImportError as exc:  # fail in the test, with the fix, rather than skip
    PLAYWRIGHT_ERROR = repr(exc)

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("RESIDENTS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STEP_MS = 10_000  # every browser wait is bounded

RECEIPT = "-# Output ceiling reached at 4,096 tokens; the remainder was not generated."
PART_1 = (
    "The harbour opens to the west: a long arm of grey stone with a lamp at its end, and behind it "
    "the terraces of the old town climbing toward the granary. At low tide the mud flats show their ribs, "
    "and the gulls work them in lines, as if someone had drawn a grid for them."
)
PART_2 = (
    "Boats come in at dusk. The nets are hung along the quay to dry, and the smell of tar and salt sits "
    "over everything until the wind turns. The lighthouse keep"
)  # cut mid-word, as at the ceiling
GENERATION = "g-0a1b2c3d4e5f"
STUMPS = {"s-5e1f00aa11bb": "The harbour opens to the we", "s-77c0ffee0042": "Boats come in at du"}


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[BrowserContext]:
    """A fresh headless chromium profile; fails with the install lines when anything is missing."""
    if PLAYWRIGHT_ERROR is not None:
        pytest.fail(f"playwright is not importable ({PLAYWRIGHT_ERROR}); install it: .venv/bin/pip install playwright")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"no chromium at {CHROMIUM}; install it: apt-get install -y chromium "
            "(or point RESIDENTS_CHROMIUM at a chromium binary)"
        )
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
            timeout=STEP_MS,
        )
        context.set_default_timeout(STEP_MS)
        expect.set_options(timeout=STEP_MS)
        try:
            yield context
        finally:
            await context.close()


def resident_setup(kinds: dict[str, dict[str, Any]]):
    """A tiny resident: a mention gets a reply cut at the ceiling (2 partials + receipt); moderators get /stumps."""

    def setup(bot: commands.Bot) -> None:
        async def on_message(message: discord.Message) -> None:
            if message.author.bot or bot.user not in message.mentions:
                return
            for seq, (kind, text) in enumerate((("partial", PART_1), ("partial", PART_2), ("receipt", RECEIPT))):
                sent = await message.channel.send(text, allowed_mentions=discord.AllowedMentions.none())
                kinds[str(sent.id)] = {"kind": kind, "generation_id": GENERATION, "seq": seq}

        bot.add_listener(on_message)
        stumps = app_commands.Group(name="stumps", description="Texts that exist but were not published as speech")

        @stumps.command(name="list", description="Stumps of a resident")
        async def stumps_list(interaction: discord.Interaction) -> None:
            if not interaction.permissions.manage_messages:
                await interaction.response.send_message(
                    "This command needs the Manage Messages permission.", ephemeral=True
                )
                return
            lines = [
                f"{sid}  retry-abandoned  {len(text):>3} chars  unpublished  cairn" for sid, text in STUMPS.items()
            ]
            await interaction.response.send_message("```\n" + "\n".join(lines) + "\n```", ephemeral=True)

        @stumps.command(name="show", description="One stump")
        async def stumps_show(interaction: discord.Interaction, id: str) -> None:
            text = STUMPS.get(id)
            if not interaction.permissions.manage_messages or text is None:
                await interaction.response.send_message(f"No stump {id}.", ephemeral=True)
                return
            await interaction.response.send_message(
                f"```\n{id}  retry-abandoned\ngeneration {GENERATION}\n```", ephemeral=True
            )
            await interaction.followup.send(text, ephemeral=True)

        bot.tree.add_command(stumps)

    return setup


async def font_px(page: Page, selector: str) -> float:
    return float(await page.eval_on_selector(selector, "el => parseFloat(getComputedStyle(el).fontSize)"))


def save_screenshot(png: bytes, folder: Path, name: str, *, docs: bool = False) -> Path:
    """FOLDER/screenshots/NAME (a test's temporary folder: tests write nothing into the source tree).

    With `docs`, and only when asked with RESIDENTS_UPDATE_SCREENSHOT=1, it also becomes docs/demo.png,
    the README's picture.
    """
    out = folder / "screenshots" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    if docs and os.environ.get("RESIDENTS_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(out, ROOT / "docs" / "demo.png")
    return out


async def test_annotations_endpoint_and_static_files() -> None:
    """The hook the demo's ledger plugs into: restricted to the ids asked, {} without, 503 when it breaks."""
    calls: list[list[str]] = []

    async def annotator(ids: list[str]) -> dict[str, dict[str, Any]]:
        calls.append(ids)
        if "boom" in ids:
            raise RuntimeError("ledger closed")
        return {"1": {"kind": "partial", "generation_id": "g-1"}, "9": {"kind": "speech"}}

    async with running_room() as room, aiohttp.ClientSession() as http:
        async with http.get(f"{room.url}/_room/annotations?ids=1,2") as resp:
            assert resp.status == 200 and await resp.json() == {}
        room.set_annotator(annotator)
        async with http.get(f"{room.url}/_room/annotations?ids=1,2,1") as resp:
            assert await resp.json() == {"1": {"kind": "partial", "generation_id": "g-1"}}
        assert calls == [["1", "2"]]
        async with http.get(f"{room.url}/_room/annotations?ids=boom") as resp:
            assert resp.status == 503 and "ledger closed" in (await resp.json())["message"]
        async with http.get(f"{room.url}/_room/annotations?ids=" + ",".join(map(str, range(501)))) as resp:
            assert resp.status == 400
        async with http.get(f"{room.url}/_room/state") as resp:
            assert (await resp.json())["annotator"] is True
        async with http.get(f"{room.url}/") as resp:
            assert resp.status == 200 and "<title>residents" in await resp.text()
        for name in ("room.js", "markdown.js", "room.css"):
            async with http.get(f"{room.url}/static/{name}") as resp:
                assert resp.status == 200, name
        async with http.get(f"{room.url}/static/../server.py") as resp:
            assert resp.status in (403, 404)


async def test_page_shows_room_live_and_moderator_reads_stump(browser: BrowserContext, tmp_path: Path) -> None:
    kinds: dict[str, dict[str, Any]] = {}
    looked_up: list[list[str]] = []

    async def annotator(ids: list[str]) -> dict[str, dict[str, Any]]:
        looked_up.append(ids)
        return {i: kinds[i] for i in ids if i in kinds}

    async with (
        running_room(["general", "random"]) as room,
        running_bot(room.url, "local-cairn", setup=resident_setup(kinds), sync_commands=True),
    ):
        room.set_annotator(annotator)
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        await expect(page.locator("#channels a")).to_have_text(["general", "random"])
        await expect(page.locator("#members li", has_text="cairn").locator(".bot-tag")).to_have_text("BOT")

        # post as a person through the page's box; the reply arrives over the event stream
        await page.fill("#author", "alice")
        await page.fill("#content", "@cairn describe the harbour, please")
        await page.press("#content", "Enter")
        replies = page.locator("#messages li.msg[data-author='cairn']")
        await expect(replies).to_have_count(3)
        [posted] = room.messages()[:1]
        assert posted["author"] == "alice" and posted["pings"]["users"] == ["cairn"]
        alice = page.locator("#messages li.msg[data-author='alice']")
        await expect(alice.locator(".mention")).to_have_text("@cairn")
        await expect(alice).to_have_attribute("data-kind", "speech")

        # the receipt is a compact boundary line, smaller than speech; kinds come from the annotator
        receipt = replies.nth(2)
        await expect(receipt).to_have_class(
            re.compile(r"\bboundary\b.*\bkind-receipt\b|\bkind-receipt\b.*\bboundary\b")
        )
        await expect(receipt.locator(".subtext")).to_have_text(RECEIPT.removeprefix("-# "))
        assert "-#" not in await receipt.inner_text()
        speech_px = await font_px(page, "#messages li.msg[data-author='alice'] .body .line")
        receipt_px = await font_px(page, "#messages li.kind-receipt .subtext")
        assert receipt_px < speech_px, (receipt_px, speech_px)
        receipt_box, part_box = await receipt.bounding_box(), await replies.nth(1).bounding_box()
        assert receipt_box and part_box and receipt_box["height"] < 30 < part_box["height"]
        assert await page.locator("#messages li.msg.cont[data-author='cairn']").count() == 2  # grouped like Discord
        assert any(i in ids for ids in looked_up for i in kinds)

        # a partial's and a receipt's kind show without hovering; speech names its kind on hover only
        first = replies.nth(0)
        await expect(first).to_have_attribute("title", re.compile(rf"^partial · generation {GENERATION}"))
        mark = first.locator(".kind-mark")
        await expect(mark).to_have_css("opacity", "1")
        await expect(mark).to_have_text("partial")
        await expect(receipt.locator(".kind-mark")).to_have_css("opacity", "1")
        said = alice.locator(".kind-mark")
        await expect(said).to_have_css("opacity", "0")
        await alice.hover()
        await expect(said).to_have_css("opacity", "1")
        await expect(said).to_have_text("speech")

        # a moderator lists stumps and opens one; the answers stay in the panel, not in the room
        await page.click("#mod-toggle")
        await expect(page.locator("#mod")).to_be_visible()
        await expect(page.locator("#mod-bot")).to_have_value("cairn")
        await page.click("#stumps-list")
        listing = page.locator("#mod-out .ephemeral").first
        await expect(listing.locator(".cmd")).to_have_text("/stumps list · cairn")
        await expect(listing.locator("a.ref-stump")).to_have_count(2)
        await listing.locator("a.ref-stump", has_text="s-77c0ffee0042").click()
        shown = page.locator("#mod-out .ephemeral").first
        await expect(shown.locator(".cmd")).to_have_text("/stumps show s-77c0ffee0042 · cairn")
        await expect(shown.locator(".answer")).to_contain_text(STUMPS["s-77c0ffee0042"])
        await expect(shown.locator(".answer pre")).to_contain_text(f"generation {GENERATION}")
        assert len(room.messages()) == 4
        await expect(page.locator("#messages li.msg")).to_have_count(4)

        await receipt.hover()
        path = save_screenshot(await page.screenshot(), tmp_path, "room.png")
        log.info("screenshot saved to %s", path)
        assert not errors, errors


async def test_page_without_annotator_and_channel_switch(browser: BrowserContext) -> None:
    """No annotator: people's messages are speech, a bot's message is left unrecorded, not guessed."""
    async with running_room(["general", "random"]) as room, running_bot(room.url, "local-sill") as bot:
        room.post("random", "bob", "over here")
        page = await browser.new_page()
        await page.goto(f"{room.url}/#random")
        await page.wait_for_selector("body[data-ready='1']")
        await expect(page.locator("#channels a.active")).to_have_text("random")
        await expect(page.locator("#messages li.msg")).to_have_text([re.compile("over here")])
        await page.click("#channels a >> text=general")
        await expect(page.locator("#channel-name")).to_have_text("general")
        await expect(page.locator("#messages li.msg")).to_have_count(0)
        channel = bot.get_channel(int(room.channel_id("general")))
        assert isinstance(channel, discord.TextChannel)
        await channel.send("```py\nprint('hi')\n```\n-# a subtext line")
        msg = page.locator("#messages li.msg[data-author='sill']")
        await expect(msg.locator("pre code")).to_have_text("print('hi')")
        await expect(msg.locator(".subtext")).to_have_text("a subtext line")
        await expect(msg).to_have_attribute("data-kind", "unrecorded")
        await expect(msg).to_have_attribute("title", re.compile("no ledger"))
        resp = await page.request.get(f"{room.url}/_room/annotations?ids={room.messages()[0]['id']},2")
        assert resp.ok and await resp.json() == {}


def console_script() -> list[str]:
    """`residents` as installed beside the Python running the tests (any venv, or none), else `python -m residents`."""
    beside = Path(sys.executable).parent / "residents"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("residents")
    return [found] if found else [sys.executable, "-m", "residents"]


@dataclass
class DemoRun:
    url: str
    folder: Path  # where it was started: its ledger is folder/data/demo.db
    said: list[str]  # what it printed before the URL


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[DemoRun]:
    """`residents demo --port 0` as a person starts it, in a folder of its own; stops it with SIGINT."""
    with open(tmp_path / "demo.log", "wb") as errlog:
        proc = await asyncio.create_subprocess_exec(
            *console_script(),
            "demo",
            "--port",
            "0",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=errlog,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert proc.stdout is not None
            url, said = None, []
            while url is None:
                line = (await asyncio.wait_for(proc.stdout.readline(), timeout=30)).decode()
                if not line:
                    raise AssertionError(
                        "residents demo exited before printing its URL:\n"
                        + (tmp_path / "demo.log").read_text(errors="replace")[-3000:]
                    )
                said.append(line.rstrip("\n"))
                found = re.search(r"http://127\.0\.0\.1:\d+", line)
                url = found.group(0) if found else None
            yield DemoRun(url, tmp_path, said)
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGINT)
                try:
                    await asyncio.wait_for(proc.wait(), timeout=15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
    logged = (tmp_path / "demo.log").read_text(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in logged and " ERROR " not in logged, logged[-3000:]


def stump_of_sill(db: Path) -> tuple[str, str]:
    """The newest stump Sill's retry left: (id, text)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        stump_id, text = con.execute(
            "SELECT id, text FROM stumps WHERE residence='sill' AND cause='retry-abandoned' "
            "ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
    return stump_id, bytes(text).decode() if isinstance(text, (bytes, memoryview)) else text


PLAY_MS = 60_000  # the demo's script, start to end, on a loaded machine


async def test_the_demo_plays_itself_where_people_look(browser: BrowserContext, demo: DemoRun) -> None:
    """Nobody types: the people's lines, Cairn's cut reply and its receipt, Sill's retried attempt, and the
    moderator opening the stump in the panel all appear; then "Play again" clears the channel and plays it
    again, and the one ledger (data/demo.db) holds both runs."""
    assert demo.said[0] == (
        "residents demo: ledger data/demo.db; afterwards: residents ledger list --db data/demo.db"
    ), demo.said
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(demo.url)
    await page.wait_for_selector("body[data-ready='1']")

    alice = page.locator("#messages li.msg[data-author='alice']").first
    await expect(alice).to_contain_text("Tell us about the harbour", timeout=PLAY_MS)
    await expect(alice).to_have_attribute("data-kind", "speech")
    receipt = page.locator("#messages li.msg.kind-receipt[data-author='cairn']")
    await expect(receipt).to_have_count(1, timeout=PLAY_MS)
    await expect(receipt.locator(".subtext")).to_have_text(
        "Output ceiling reached at 4,096 tokens; the remainder was not generated."
    )
    await expect(receipt).to_have_attribute("title", re.compile(r"^receipt · generation g-"))
    partials = page.locator("#messages li.msg.kind-partial[data-author='cairn']")
    assert await partials.count() >= 2
    await expect(partials.first.locator(".kind-mark")).to_have_css("opacity", "1")  # no hovering needed
    notice = page.locator("#messages li.msg.kind-notice[data-author='sill']")
    await expect(notice.locator(".subtext")).to_contain_text("retried", timeout=PLAY_MS)
    await expect(page.locator("#messages li.msg.kind-speech[data-author='sill']")).to_have_count(1)

    # mo, the demo's moderator, opens the stump Sill's failed attempt left; the panel shows what mo saw
    stump_id, text = stump_of_sill(demo.folder / "data" / "demo.db")
    shown = page.locator("#mod-out .ephemeral.shown", has_text=f"/stumps show id:{stump_id}")
    await expect(shown).to_have_count(1, timeout=PLAY_MS)
    await expect(page.locator("#mod")).to_be_visible()
    await expect(shown.locator(".cmd")).to_have_text(f"/stumps show id:{stump_id} · sill")
    await expect(shown.locator(".answer")).to_contain_text(" ".join(text.split()[:12]))
    assert stump_id not in " ".join(await page.locator("#messages li.msg").all_inner_texts())  # ephemeral only
    again = page.locator("#play-again")
    await expect(again).to_be_enabled(timeout=PLAY_MS)
    await expect(page.locator("#show-status")).to_have_text("demo played · the room is yours")
    await expect(page.locator("#mod-out .ephemeral.shown")).to_have_count(3)  # each once: event and status

    # a page opened after the script finished shows what mo saw all the same, and every kind settled
    later = await browser.new_page()
    later.on("pageerror", lambda exc: errors.append(str(exc)))
    await later.goto(demo.url)
    await later.wait_for_selector("body[data-ready='1']")
    await expect(later.locator("#mod")).to_be_visible()
    await expect(later.locator("#mod-out .ephemeral.shown")).to_have_count(3)
    await expect(
        later.locator("#mod-out .ephemeral.shown", has_text=f"/stumps show id:{stump_id}").locator(".answer")
    ).to_contain_text(" ".join(text.split()[:12]))
    await later.close()
    await expect(page.locator("#messages li.msg[data-kind='live']")).to_have_count(0)  # none left labelled live

    await receipt.evaluate("el => el.scrollIntoView({block: 'center'})")
    path = save_screenshot(await page.screenshot(), demo.folder, "demo.png", docs=True)
    log.info("screenshot saved to %s", path)

    # the room's own API: the script's state, and no second start while it plays
    state = await (await page.request.get(f"{demo.url}/_room/show")).json()
    assert (state["state"], state["runs"], state["replay"]) == ("done", 1, "clears the channel")
    first_ids = set(await page.locator("#messages li.msg").evaluate_all("els => els.map(e => e.dataset.id)"))
    await again.click()
    await expect(again).to_be_disabled()
    busy = await page.request.post(f"{demo.url}/_room/show/play")
    assert busy.status == 409 and "still playing" in (await busy.json())["message"]
    await expect(page.locator("#messages li.msg.kind-receipt")).to_have_count(1, timeout=PLAY_MS)
    await expect(again).to_be_enabled(timeout=PLAY_MS)
    now = await page.locator("#messages li.msg").evaluate_all("els => els.map(e => e.dataset.id)")
    assert not first_ids & set(now) and len(now) == len(first_ids)  # cleared, then the same script again

    with contextlib.closing(sqlite3.connect(f"file:{demo.folder / 'data' / 'demo.db'}?mode=ro", uri=True)) as con:
        assert con.execute("SELECT count(*) FROM generations").fetchone()[0] == 6  # both runs, one ledger
    listed = subprocess.run(
        [*console_script(), "ledger", "list", "--db", "data/demo.db"],
        cwd=demo.folder,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert listed.returncode == 0 and listed.stdout.count(" truncated ") == 2, listed.stdout + listed.stderr
    assert not errors, errors


async def test_the_demo_on_a_phone_keeps_the_chat_and_shows_the_receipt(browser: BrowserContext, demo: DemoRun) -> None:
    page = await browser.new_page()
    await page.set_viewport_size({"width": 390, "height": 844})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(demo.url)
    await page.wait_for_selector("body[data-ready='1']")
    receipt = page.locator("#messages li.msg.kind-receipt[data-author='cairn']")
    await expect(receipt).to_have_count(1, timeout=PLAY_MS)
    await receipt.scroll_into_view_if_needed()
    await expect(receipt).to_be_in_viewport()
    await expect(receipt.locator(".kind-mark")).to_be_visible()
    await expect(receipt.locator(".kind-mark")).to_have_css("opacity", "1")
    box = await receipt.locator(".subtext").bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    assert await page.evaluate("document.scrollingElement.scrollWidth") <= 390  # nothing runs off the side
    await expect(page.locator("#side")).not_to_be_in_viewport()
    await expect(page.locator("#content")).to_be_in_viewport()
    path = save_screenshot(await page.screenshot(), demo.folder, "demo-390x844.png")
    log.info("screenshot saved to %s", path)

    # channels are a drawer; the moderator panel is a sheet under the chat, which stays
    await page.click("#side-toggle")
    await expect(page.locator("#channels a.active")).to_be_in_viewport()
    await page.keyboard.press("Escape")
    await expect(page.locator("#side")).not_to_be_in_viewport()
    await page.click("#mod-toggle")
    sheet = await page.locator("#mod").bounding_box()
    chat = await page.locator("#messages").bounding_box()
    assert sheet and chat and sheet["width"] == 390 and sheet["y"] > 844 / 3, sheet
    assert chat["height"] > 150 and chat["y"] + chat["height"] <= sheet["y"], (chat, sheet)
    await expect(page.locator("#content")).to_be_in_viewport()
    save_screenshot(await page.screenshot(), demo.folder, "demo-390x844-sheet.png")
    assert not errors, errors


async def test_each_kind_but_speech_shows_without_hovering(browser: BrowserContext) -> None:
    kinds: dict[str, dict[str, Any]] = {}

    async def annotator(ids: list[str]) -> dict[str, dict[str, Any]]:
        return {i: kinds[i] for i in ids if i in kinds}

    async with running_room(["general"]) as room, running_bot(room.url, "local-sill") as bot:
        room.set_annotator(annotator)
        async with aiohttp.ClientSession() as http, http.get(f"{room.url}/_room/show") as resp:
            assert resp.status == 404 and (await resp.json())["message"] == "nothing is playing in this room"
        assert room.snapshot()["show"] is None
        channel = bot.get_channel(int(room.channel_id("general")))
        assert isinstance(channel, discord.TextChannel)
        for kind in ("speech", "partial", "receipt", "notice", "recovered"):
            sent = await channel.send(f"-# a {kind} line" if kind in ("receipt", "notice") else f"a {kind} post")
            kinds[str(sent.id)] = {"kind": kind, "generation_id": "g-0a1b2c3d4e5f"}
        room.post("general", "alice", "and a person")
        page = await browser.new_page()
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        await expect(page.locator("#show")).to_be_hidden()  # no script plays here: no "Play again"
        marks = page.locator("#messages li.msg .kind-mark")
        await expect(marks).to_have_text(["speech", "partial", "receipt", "notice", "recovered", "speech"])
        await page.mouse.move(0, 0)
        for i, opacity in enumerate(["0", "1", "1", "1", "1", "0"]):
            await expect(marks.nth(i)).to_have_css("opacity", opacity)
        colours = await marks.evaluate_all("els => els.map(e => getComputedStyle(e).color)")
        assert len(set(colours[1:5])) >= 3, colours  # partial, notice and recovered each in their colour


async def test_a_live_message_shows_its_settled_kind_without_an_edit_or_a_reload(browser: BrowserContext) -> None:
    """A partial that filled up while live is not edited when its generation settles: the page still
    learns its settled kind, by asking again while it is live."""
    kinds: dict[str, dict[str, Any]] = {}

    async def annotator(ids: list[str]) -> dict[str, dict[str, Any]]:
        return {i: kinds[i] for i in ids if i in kinds}

    async with running_room(["general"]) as room, running_bot(room.url, "local-cairn") as bot:
        room.set_annotator(annotator)
        channel = bot.get_channel(int(room.channel_id("general")))
        assert isinstance(channel, discord.TextChannel)
        page = await browser.new_page()
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        first = await channel.send("the first part, still being written")
        kinds[str(first.id)] = {"kind": "live", "generation_id": "g-0a1b2c3d4e5f"}
        item = page.locator(f"#messages li.msg[data-id='{first.id}']")
        await expect(item).to_have_attribute("data-kind", "live")
        kinds[str(first.id)] = {"kind": "partial", "generation_id": "g-0a1b2c3d4e5f", "seq": 0}  # settled, no edit
        await expect(item).to_have_attribute("data-kind", "partial")
        await expect(item.locator(".kind-mark")).to_have_text("partial")


async def many_messages(room: Any, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        room.post("general", "bob", f"line {i}: " + "the tide turns and the quay holds " * (1 + i % 4))


async def test_new_messages_below_show_an_indicator_and_a_way_back(browser: BrowserContext) -> None:
    async with running_room(["general"]) as room:
        await many_messages(room, 40)
        page = await browser.new_page()
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        jump = page.locator("#jump")
        await expect(page.locator("#messages li.msg")).to_have_count(40)
        await expect(jump).to_be_hidden()  # at the latest message
        await page.locator("#messages").evaluate("el => { el.scrollTop = 0; }")
        await expect(jump).to_be_visible()  # the page has seen the reader scroll away (a hidden button has text too)
        await expect(jump).to_have_text("Jump to latest ↓")
        await many_messages(room, 3, start=40)
        await expect(jump).to_have_text("3 new messages · Jump to latest ↓")
        assert await page.locator("#messages").evaluate("el => el.scrollTop") < 5  # the reader was not moved
        await jump.click()
        await expect(jump).to_be_hidden()
        await expect(page.locator("#messages li.msg").last).to_be_in_viewport()
        await expect(page.locator("#content")).to_be_focused()
        await many_messages(room, 1, start=43)  # at the latest: it scrolls into view, no indicator
        await expect(page.locator("#messages li.msg").last).to_contain_text("line 43")
        await expect(page.locator("#messages li.msg").last).to_be_in_viewport()
        await expect(jump).to_be_hidden()


async def test_opening_the_panel_keeps_the_reading_position(browser: BrowserContext) -> None:
    async with running_room(["general"]) as room:
        await many_messages(room, 60)
        page = await browser.new_page()
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        await expect(page.locator("#messages li.msg")).to_have_count(60)
        top_of = """el => { const top = el.getBoundingClientRect().top;
            const li = [...el.children].find(c => c.getBoundingClientRect().bottom > top);
            return [li.dataset.id, Math.round(li.getBoundingClientRect().top - top)]; }"""
        messages = page.locator("#messages")
        await messages.evaluate("el => { el.scrollTop = el.scrollHeight / 3; }")
        before = await messages.evaluate(top_of)
        await page.click("#mod-toggle")  # the panel narrows the chat: lines rewrap
        await expect(page.locator("#mod")).to_be_visible()
        after = await messages.evaluate(top_of)
        assert after[0] == before[0] and abs(after[1] - before[1]) <= 2, (before, after)
        await page.click("#mod-close")
        assert (await messages.evaluate(top_of))[0] == before[0]
        await messages.evaluate("el => { el.scrollTop = el.scrollHeight; }")  # at the latest: stays there
        await page.click("#mod-toggle")
        await expect(page.locator("#messages li.msg").last).to_be_in_viewport()
        assert await messages.evaluate("el => el.scrollHeight - el.scrollTop - el.clientHeight") < 2


async def test_keyboard_focus_is_visible_on_every_control(browser: BrowserContext) -> None:
    async with running_room(["general", "random"]) as room, running_bot(room.url, "local-cairn"):
        page = await browser.new_page()
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        await page.click("#mod-toggle")
        await page.locator("body").evaluate("el => document.activeElement.blur()")
        seen: dict[str, bool] = {}
        for _ in range(30):
            await page.keyboard.press("Tab")
            name, visible = await page.evaluate("""() => {
                const el = document.activeElement;
                const name = el.id || (el.tagName + ':' + (el.textContent || '').trim());
                const own = getComputedStyle(el);
                const ring = own.outlineStyle !== 'none' && parseFloat(own.outlineWidth) >= 2;
                const box = el.closest('#post');  // the composer's fields show focus on the whole box
                const boxed = box && getComputedStyle(box).boxShadow !== 'none';
                return [name, Boolean(ring || boxed)]; }""")
            if name.startswith("BODY:"):  # past the last control, focus leaves the page for a step
                continue
            seen[name] = visible
        wanted = {
            "mod-toggle",
            "author",
            "content",
            "mod-close",
            "mod-bot",
            "mod-name",
            "stumps-list",
            "stump-id",
            "A:general",
            "A:random",
            "messages",
        }
        assert wanted <= set(seen), seen
        assert all(seen.values()), {k: v for k, v in seen.items() if not v}


async def test_an_escaped_subtext_line_renders_as_plain_text_and_a_receipt_as_subtext(browser: BrowserContext) -> None:
    """As in Discord: `\\-# ` shows `-# ` in plain type (the backslash hidden); only `-# ` is subtext."""
    async with running_room(["general"]) as room, running_bot(room.url, "local-sill") as bot:
        page = await browser.new_page()
        await page.goto(f"{room.url}/#general")
        await page.wait_for_selector("body[data-ready='1']")
        channel = bot.get_channel(int(room.channel_id("general")))
        assert isinstance(channel, discord.TextChannel)
        await channel.send("Quoting the room:\n\\" + RECEIPT + "\nand \\*not italic\\* either")
        await channel.send(RECEIPT)
        quoted, receipt = (
            page.locator("#messages li.msg[data-author='sill']").nth(0),
            page.locator("#messages li.msg[data-author='sill']").nth(1),
        )
        await expect(quoted.locator(".line").nth(1)).to_have_text(RECEIPT)  # "-# …" as text, no backslash
        await expect(quoted.locator(".subtext")).to_have_count(0)
        await expect(quoted.locator("em")).to_have_count(0)
        await expect(quoted.locator(".line").nth(2)).to_have_text("and *not italic* either")
        await expect(quoted).not_to_have_class(re.compile(r"\bboundary\b"))
        await expect(receipt.locator(".subtext")).to_have_text(RECEIPT.removeprefix("-# "))


async def test_a_person_attaches_files_on_the_page(browser: BrowserContext) -> None:
    """The page's 📎 sends its multipart form: the files arrive in the room, an image shown as one."""
    image = png(4, 3)
    async with running_room(["general"]) as room:
        page = await browser.new_page()
        await page.goto(room.url)
        await page.wait_for_selector("body[data-ready='1']")
        await page.fill("#author", "alice")
        await page.fill("#content", "two files")
        await page.set_input_files(
            "#files",
            [
                {"name": "shot.png", "mimeType": "image/png", "buffer": image},
                {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"hello\n"},
            ],
        )
        await page.click("#post button[type='submit']")
        msg = page.locator("#messages li.msg[data-author='alice']")
        await expect(msg.locator(".attachment a")).to_have_text(["shot.png", "notes.txt"])
        await expect(msg.locator(".attachment img.thumb")).to_have_count(1)
        assert await msg.locator("img.thumb").evaluate("img => img.complete && img.naturalWidth") == 4
        [view] = room.messages()
        assert [(a["filename"], a["size"], a["content_type"]) for a in view["attachments"]] == [
            ("shot.png", len(image), "image/png"),
            ("notes.txt", 6, "text/plain"),
        ]
        assert await page.locator("#files").evaluate("el => el.files.length") == 0


async def test_a_person_presses_continue_on_the_page_as_the_policy_allows(
    browser: BrowserContext, tmp_path: Path
) -> None:
    """The real resident (`run_bots`) cuts a reply; its receipt shows Continue (2 left) on the page. Pressed as
    bob (no role) it answers who may press, in the panel, and nothing happens; pressed as a moderator it
    continues, and the button leaves that receipt."""
    cairn = residence(
        name="cairn",
        max_tokens=600,
        policy={
            "retries": {"max_attempts": 3, "backoff_seconds": 0},
            "floor": {"cooldown_seconds": 0},
            "continuation": {
                "standing": "on-request",
                "max_segments": 2,
                "max_output_tokens": 12288,
                "min_progress_chars": 16,
                "similarity_abort": 0.92,
            },
        },
        discord={"token_env": "CAIRN_DISCORD_TOKEN", "channels": ["general"]},
    )
    ending = "Beyond the breakwater the channel bends twice, and the bell buoy rings last of all before the sea."
    calls = [Call(sse=specimen("cont-first.sse")), Call(sse=sse.stream(ending, "end_turn", 30))]
    async with deployed(tmp_path, [cairn], calls=calls) as d:
        d.room.state.person("moddy", moderator=True)
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(d.room.url)
        await page.wait_for_selector("body[data-ready='1']")
        await page.fill("#author", "alice")
        await page.fill("#content", "@cairn write it all, please")
        await page.press("#content", "Enter")
        await d.wait_receipt()
        await d.quiet(0.1)
        [g] = await d.generations()
        receipt = page.locator("#messages li.msg[data-author='cairn']").last
        button = receipt.locator("button.component")
        await expect(button).to_have_text("Continue (2 left)")
        await expect(button).to_have_attribute("data-custom-id", f"residents:continue:{g.id}:1")

        await page.fill("#author", "bob")
        await button.click()
        answer = page.locator("#mod-out .ephemeral").first
        await expect(answer.locator(".cmd")).to_have_text("Continue (2 left) · cairn")
        await expect(answer.locator(".answer")).to_have_text(truth.press_refused("moderators", "cairn"))
        await d.quiet(0.1)
        assert len(d.provider.requests) == 1
        await expect(button).to_be_enabled()

        await page.fill("#author", "moddy")
        await button.click()
        answer = page.locator("#mod-out .ephemeral").first
        await expect(answer.locator(".answer")).to_have_text(
            f"Continued {g.id}: now completed, 2 segment(s), continuation completed."
        )
        await expect(page.locator("#messages li.msg[data-author='cairn'] .subtext").last).to_contain_text(
            "Output assembled from 2 segments"
        )
        await expect(page.locator("#messages button.component")).to_have_count(0)  # nothing is left to press
        assert len(d.provider.requests) == 2
        assert not errors, errors
