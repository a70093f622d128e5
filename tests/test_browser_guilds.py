"""The room's web page for a room built from a layout: a guild selector, `guild/channel` addresses, and a
moderator panel that acts as a named member whose roles decide (real chromium, as in test_browser.py)."""

from __future__ import annotations

import discord
from discord import app_commands
from discord.ext import commands

from residents.localservers.room import load_layout

try:
    from roomkit import running_bot, running_room
except ImportError:  # tests/ collected as a package
    from tests.roomkit import running_bot, running_room

from test_browser import browser  # noqa: F401  (the fixture: a headless chromium profile)

try:
    from playwright.async_api import BrowserContext, expect
except ImportError:  # the browser fixture fails with the install line
    BrowserContext = object  # type: ignore[assignment,misc]


def telling_setup(bot: commands.Bot) -> None:
    """/stumps list that answers with what the bot was told: the guild and the member's Manage Messages."""
    stumps = app_commands.Group(name="stumps", description="Texts that exist but were not published as speech")

    @stumps.command(name="list", description="Stumps of a resident")
    async def stumps_list(interaction: discord.Interaction) -> None:
        assert interaction.guild is not None
        await interaction.response.send_message(
            f"{interaction.user.name} in {interaction.guild.name}: manage_messages "
            f"{interaction.permissions.manage_messages}",
            ephemeral=True,
        )

    bot.tree.add_command(stumps)


async def test_page_picks_a_guild_and_acts_as_a_member(browser: BrowserContext) -> None:  # noqa: F811
    async with (
        running_room(layout=load_layout("two-guilds")) as room,
        running_bot(room.url, "local-cairn", setup=telling_setup) as bot,
    ):
        for guild in bot.guilds:
            bot.tree.copy_global_to(guild=guild)
            await bot.tree.sync(guild=guild)
        page = await browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await page.goto(f"{room.url}/#elsewhere/yard")
        await page.wait_for_selector("body[data-ready='1']")
        await expect(page.locator("#guild")).to_have_text("elsewhere")
        await expect(page.locator("#guild-select")).to_be_visible()
        await expect(page.locator("#guild-select")).to_have_value("elsewhere")
        await expect(page.locator("#channels a")).to_have_text(["yard"])
        await expect(page.locator("#members li", has_text="eve")).to_have_count(1)
        await expect(page.locator("#members li", has_text="mo")).to_have_count(0)

        await page.select_option("#guild-select", "harbour")
        await expect(page.locator("#channels a")).to_have_text(["yard", "dock"])
        await expect(page.locator("#channels a.active")).to_have_text("yard")
        await expect(page.locator("#guild")).to_have_text("harbour")
        assert page.url.endswith("#harbour/yard")

        await page.fill("#author", "alice")
        await page.fill("#content", "hello harbour")
        await page.press("#content", "Enter")
        await expect(page.locator("#messages li.msg")).to_have_count(1)
        assert [(m["guild"], m["channel"], m["content"]) for m in room.messages("harbour/yard")] == [
            ("harbour", "yard", "hello harbour")
        ]
        assert room.messages("elsewhere/yard") == []

        await page.click("#mod-toggle")
        await expect(page.locator("#mod-name")).to_have_value("mo")  # a member whose role moderates here
        await page.click("#stumps-list")
        answer = page.locator("#mod-out .ephemeral").first.locator(".answer")
        await expect(answer).to_contain_text("mo in harbour: manage_messages True")
        await page.fill("#mod-name", "alice")
        await page.click("#stumps-list")
        await expect(page.locator("#mod-out .ephemeral").first.locator(".answer")).to_contain_text(
            "alice in harbour: manage_messages False"
        )
        assert not errors, errors
