"""Where a catch-up begins and ends, and what it claims: the rules under tests/test_catch_up.py, each alone."""

from __future__ import annotations

import datetime as dt

import discord

from residents.discord.catchup import CLAIMS_PRUNED_ABOVE, Claims, Sightings, age_words, ledger_bound, window_start
from residents.records import Generation, Post


def test_the_gap_is_what_was_seen_when_the_gateway_dropped_and_live_messages_after_it_are_not_missed() -> None:
    s = Sightings()
    assert s.last_seen(1) is None  # no drop yet: the ledger decides
    s.saw(1, 100)
    s.saw(1, 105)
    s.saw(2, 50)
    s.dropped()
    assert (s.last_seen(1), s.last_seen(2), s.last_seen(3)) == (105, 50, None)
    assert s.live_from == {}
    s.saw(1, 140)  # the new session's first live message in channel 1
    s.saw(1, 150)
    assert s.live_from == {1: 140} and s.last_seen(1) == 105  # the gap stays as it was at the drop
    s.examined(2, 90)  # a catch-up's read moves the next catch-up's start, not where live messages began
    assert s.live_from == {1: 140}
    s.dropped()
    assert (s.last_seen(1), s.last_seen(2)) == (150, 90)


def test_after_a_restart_the_bound_is_what_a_turn_read_never_what_it_posted() -> None:
    assert ledger_bound(None) is None
    g = Generation(id="g", residence="cairn", channel="1", model="m", trigger="200", seen_upto="230")
    # Posts a stopped process left undelivered go out before the bot connects: their ids are later than
    # mentions made while it was down, so they must not move the bound.
    g.posts = [Post(id="p", generation_id="g", seq=1, kind="text", content="x", channel="1", message_id="900")]
    assert ledger_bound(g) == 230
    assert ledger_bound(Generation(id="h", residence="cairn", channel="1", model="m", trigger="200")) == 200
    assert ledger_bound(Generation(id="k", residence="cairn", channel="1", model="m")) is None


def test_a_message_is_claimed_once_and_old_claims_are_forgotten_only_past_the_bound() -> None:
    c = Claims()
    assert c.claim(7) and not c.claim(7) and 7 in c
    now = discord.utils.utcnow()
    old = discord.utils.time_snowflake(now - dt.timedelta(days=2))
    recent = discord.utils.time_snowflake(now - dt.timedelta(minutes=5))
    c.ids = {old + i for i in range(CLAIMS_PRUNED_ABOVE - 1)} | {recent}
    assert c.claim(recent + 1)
    assert c.ids == {recent, recent + 1}


def test_the_window_starts_at_the_newest_snowflake_older_than_it_and_ages_read_plainly() -> None:
    now = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)
    start = window_start(now, 600)
    assert discord.utils.snowflake_time(start) <= now - dt.timedelta(seconds=600)
    assert discord.utils.snowflake_time(start + 1) > now - dt.timedelta(seconds=600)
    assert [age_words(s) for s in (9.7, 725, 12_000)] == ["9s", "12m 5s", "3h 20m"]
