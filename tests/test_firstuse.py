"""Small things a person expects the first time: `ledger show` takes a message id or link, replay's
transcript shows what the resident will see next time and counts attempts as the provider counted calls,
an on-request output nobody continued says so, and the test suite leaves the source tree as it found it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from conftest import ROOT, specimen
from discordkit import deployed
from test_discord_e2e import res

from residents import cli
from residents.ledger.views import message_id_of
from residents.localservers.provider import Call


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)  # the bundled scenarios, read where they are; the ledgers go to tmp_path
    return tmp_path


def test_message_references_are_ids_or_links() -> None:
    assert message_id_of("https://discord.com/channels/11/22/33") == "33"
    assert message_id_of("https://ptb.discord.com/channels/@me/22/33 ") == "33"
    assert message_id_of(" 1234567890 ") == "1234567890"
    assert message_id_of("g-0123456789ab") is None and message_id_of("s-0123") is None


async def test_ledger_show_takes_a_message_id_or_link_as_generation_show_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with deployed(tmp_path, [res(max_tokens=1024)], calls=[Call(sse=specimen("ceiling-1024.sse"))]) as d:
        d.room.post("general", "alice", "describe it, @cairn", mentions=["cairn"])
        receipt = await d.wait_receipt()
        await d.quiet(0.1)
        [g] = await d.generations()
        partial = d.bot_messages()[0]
    db = str(d.db)
    capsys.readouterr()

    def show(*args: str) -> int:  # the verb runs its own event loop: not inside this test's
        return cli.main(["ledger", "show", *args, "--db", db])

    link = f"https://discord.com/channels/{d.room.guild_id}/{receipt['channel_id']}/{receipt['id']}"
    for ref in (receipt["id"], link, partial["id"]):
        assert await asyncio.to_thread(show, ref, "--json") == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["id"] == g.id
    assert await asyncio.to_thread(show, link) == 0
    assert g.id in capsys.readouterr().out
    assert await asyncio.to_thread(show, "123") == 2
    assert capsys.readouterr().err.strip() == f"residents: 123: no generation posted message 123 in {db}"


def test_replay_transcript_shows_the_note_the_resident_will_see(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", "scenarios/ceiling.yaml", "--db", str(work / "c.db")]) == 0
    out = capsys.readouterr().out
    assert (
        "  ↳ cairn sees after it next time: [Boundary: the message above was cut off mid-output because the "
        "output ceiling of 1,024 tokens was reached; the remainder was not generated. It is an unfinished "
        "message, not an authored ending.]"
    ) in out.splitlines()
    assert cli.main(["replay", "scenarios/ceiling.yaml", "--db", str(work / "j.db"), "--json"]) == 0
    turn = json.loads(capsys.readouterr().out)["turns"][0]
    assert turn["resident_sees"] == [out.split("sees after it next time: ")[1].splitlines()[0]]
    marks = [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("  ↳")]
    assert len(marks) == 3 and "sees" in marks[1] and "sees" not in marks[2]  # an ordinary reply: no note


def test_on_request_transcript_counts_attempts_as_provider_calls_and_says_not_requested(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = work / "o.db"
    assert cli.main(["replay", "scenarios/on-request.yaml", "--db", str(db)]) == 0
    first, second = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  ↳ generation")]
    assert "1 attempt(s), 1 segment(s), continuation not requested; provider calls 1" in first
    assert "1 attempt(s) this turn (2 in all), 2 segment(s), continuation completed; provider calls 1" in second
    assert cli.main(["replay", "scenarios/on-request.yaml", "--db", str(work / "j.db"), "--json"]) == 0
    turns = json.loads(capsys.readouterr().out)["turns"]
    assert [(t["attempts_this_turn"], t["provider_calls"]) for t in turns] == [(1, 1), (1, 1)]


def test_an_on_request_output_nobody_continued_reads_as_not_requested_and_keeps_the_contracts_value() -> None:
    """The recorded value stays the replay contract's `disabled`; people read "not requested" under on-request."""
    from residents.ledger import views
    from residents.records import Generation

    g = Generation(
        id="g-onrequest00",
        residence="sill",
        channel="c",
        model="claude-3-opus-20240229",
        status="truncated",
        stop_reason="max_tokens",
        text="x",
        standing="on-request",
        continuation_ended="disabled",
    )
    assert "continuation: standing on-request, ended not requested" in "\n".join(views.provenance(g))
    assert g.as_json()["continuation"] == {"standing": "on-request", "ended": "disabled"}
    g.standing = "none"
    assert "continuation: standing none, ended disabled" in "\n".join(views.provenance(g))


def test_run_in_a_folder_without_residences_says_so_and_points_to_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"residents: no {tmp_path}/residences folder: `residents init` writes a starter set (or pass --config DIR)\n"
    )
    (tmp_path / "residences").mkdir()
    assert cli.main(["run"]) == 2
    assert f"no residences in {tmp_path}/residences: `residents init`" in capsys.readouterr().err


@pytest.mark.parametrize("verb", [["room"], ["demo", "--headless"]])
def test_a_port_in_use_is_one_line_naming_port(
    verb: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main([*verb, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"residents: port {port} on 127.0.0.1 is already in use: pass --port with another (0: any free port)\n"
    )


@pytest.mark.parametrize(
    "token, name",
    [
        ("local-cairn", "cairn"),
        ("local-Sill", "sill"),
        ("cairn", "cairn"),
        ("x", "bot-2d711642"),
        ("local-x", "bot-dd3c0347"),
    ],
)
def test_the_local_rooms_bot_names_follow_the_readmes_token_rule(token: str, name: str) -> None:
    """README, "The local room": a token `local-NAME` (2-32 letters, digits, `_`, `.`, `-`) logs in as
    NAME, so the bot can be mentioned as @NAME; any other token gets `bot-` and 8 hex digits."""
    from residents.localservers.room.state import bot_name_for_token

    assert bot_name_for_token(token) == name


def test_demo_on_the_real_api_refuses_a_retired_model_naming_its_replacement(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-used")
    assert cli.main(["demo", "--provider", "anthropic", "--model", "claude-3-opus-20240229", "--headless"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("residents: --model claude-3-opus-20240229: Claude 3 Opus was retired on 2026-01-05")
    assert "use 'claude-opus-5-5' instead" in err and err.count("\n") == 1
