"""The verbs people type: replay (readable and JSON), ledger list/show/stumps, and their errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bot import cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def work(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    shutil.copytree(ROOT / "policies", tmp_path / "policies")
    shutil.copytree(ROOT / "residences", tmp_path / "residences")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_replay_transcript_marks_every_post_with_its_kind(work, capsys):
    assert cli.main(["replay", "scenarios/ceiling.yaml"]) == 0
    out = capsys.readouterr().out
    assert "[alice] Describe the harbour." in out
    assert "[cairn · partial]" in out
    assert "[cairn · receipt] -# Output ceiling reached at 1,024 tokens; the remainder was not generated." in out
    assert "truncated (max_tokens), 4,300 chars, 1,024 tokens" in out
    assert "[cairn · speech]" in out


def test_replay_json_and_the_ledger_read_back(work, capsys):
    db = str(work / "l.db")
    assert cli.main(["replay", "scenarios/retry.yaml", "--json", "--db", db]) == 0
    result = json.loads(capsys.readouterr().out)
    g = result["turns"][0]["generation"]
    assert [a["outcome"] for a in g["attempts"]] == ["abandoned", "abandoned", "completed"]
    assert result["turns"][0]["provider_calls"] == 3

    assert cli.main(["ledger", "list", "--db", db]) == 0
    listing = capsys.readouterr().out
    assert g["id"] in listing and "completed" in listing and "end_turn" in listing

    assert cli.main(["ledger", "show", g["id"], "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "retry-abandoned" in shown and "overloaded_error" in shown and g["text"] in shown

    assert cli.main(["ledger", "stumps", "--db", db, "--cause", "retry-abandoned", "--json"]) == 0
    stumps = json.loads(capsys.readouterr().out)
    assert [(s["cause"], s["chars"], s["published"]) for s in stumps] == [("retry-abandoned", 257, False)]

    assert cli.main(["ledger", "show", stumps[0]["id"], "--db", db, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["text"]) == 257


def test_ledger_commands_on_a_missing_ledger_say_so(work, capsys):
    assert cli.main(["ledger", "list", "--db", "nope.db"]) == 2
    err = capsys.readouterr().err
    assert "nope.db" in err and "Traceback" not in err
    assert not (work / "nope.db").exists()


def test_unknown_id_is_one_line(work, capsys):
    db = str(work / "l.db")
    cli.main(["replay", "scenarios/refusal.yaml", "--json", "--db", db])
    capsys.readouterr()
    assert cli.main(["ledger", "show", "g-doesnotexist", "--db", db]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


@pytest.mark.parametrize("mutate, key", [
    (lambda s: s.replace("sse: specimens/ceiling-1024.sse", "sse: specimens/missing.sse"), "turns[0].calls[0].sse"),
    (lambda s: s.replace("max_tokens: 1024", "max_tokens: lots"), "residence.max_tokens"),
    (lambda s: s.replace("say:", "sya:", 1), "turns[0].sya"),
    (lambda s: s.replace("standing: none", "standing: sometimes"), "residence.policy.continuation.standing"),
    (lambda s: s + "extra: 1\n", "extra"),
    (lambda s: s.replace("turns:", "turns: 3\nx:"), "turns"),
])
def test_bad_scenarios_exit_2_with_one_line_and_an_untouched_ledger(work, capsys, mutate, key):
    src = (work / "scenarios/ceiling.yaml").read_text()
    (work / "scenarios/bad.yaml").write_text(mutate(src))
    db = work / "bad.db"
    assert cli.main(["replay", "scenarios/bad.yaml", "--json", "--db", str(db)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml" in lines[0] and key in lines[0], captured.err
    assert captured.out == "" and not db.exists()


def test_continue_turn_in_replay_reports_the_generation_as_it_now_stands(work, capsys):
    assert cli.main(["replay", "scenarios/on-request.yaml", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    first, second = result["turns"]
    assert first["generation"]["id"] == second["generation"]["id"]
    assert second["generation"]["status"] == "completed" and len(second["generation"]["segments"]) == 2
    assert second["provider_calls"] == 1
    assert [p["kind"] for p in second["posts"]][-1] == "receipt"
