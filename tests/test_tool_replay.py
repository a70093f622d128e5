"""Tool rounds through `residents replay --json` (the replay contract: `tool_rounds`, post kind
`recovered`): scenarios script a round as a call whose stream ends in `tool_use`, then the next call's
stream. Each run is checked in its JSON, then `ledger verify --strict` over the ledger it left."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from residents import cli
from residents.localservers import sse

ROOT = Path(__file__).resolve().parent.parent
SPECIMENS = ROOT / "scenarios" / "specimens"
SAYS = sse.text_of((SPECIMENS / "tool-list.sse").read_bytes())
END_TEXT = sse.text_of((SPECIMENS / "end-turn.sse").read_bytes())
CEILING_TEXT = sse.text_of((SPECIMENS / "ceiling-1024.sse").read_bytes())
FRAGMENT = sse.text_of((SPECIMENS / "overloaded-after-257.sse").read_bytes())


@pytest.fixture
def work(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def replay(work: Path, capsys: pytest.CaptureFixture[str], scenario: str) -> dict[str, Any]:
    db = str(work / "ledger.db")
    assert cli.main(["replay", f"scenarios/{scenario}", "--json", "--db", db]) == 0
    result = json.loads(capsys.readouterr().out)
    assert cli.main(["ledger", "verify", "--db", db, "--strict"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    return result


def text_posts(turn: dict[str, Any]) -> list[str]:
    return [p["content"] for p in turn["posts"] if p["kind"] in ("speech", "partial")]


def test_a_list_round_is_listed_with_its_result(work, capsys):
    out = replay(work, capsys, "tool-list.yaml")
    first, second = out["turns"]
    assert first["generation"]["tool_rounds"] == []
    g = second["generation"]
    [r] = g["tool_rounds"]
    assert (r["round"], r["name"], r["input"], r["is_error"]) == (1, "stumps", {"action": "list"}, False)
    [stump] = out["stumps"]
    assert [s["id"] for s in r["result"]["stumps"]] == [stump["id"]] and r["result"]["stumps"][0]["chars"] == 257
    assert (g["status"], g["text"]) == ("completed", SAYS + "\n\n" + END_TEXT)
    assert [p["kind"] for p in second["posts"]] == ["speech"] and text_posts(second) == [g["text"]]
    assert second["provider_calls"] == 2 and "tools" in second["requests"][0]
    [block] = [b for b in second["requests"][1]["messages"][-1]["content"] if b["type"] == "tool_result"]
    assert json.loads(block["content"]) == r["result"] and block["tool_use_id"] == r["tool_use_id"]


def test_an_unknown_action_is_an_error_result(work, capsys):
    out = replay(work, capsys, "tool-unknown-action.yaml")
    [t] = out["turns"]
    [r] = t["generation"]["tool_rounds"]
    assert r["is_error"] is True and r["input"] == {"action": "forget", "id": "s-000000000000"}
    assert r["result"] == {"error": "unknown action 'forget'; the actions are list, read, set_access, publish"}
    assert t["generation"]["status"] == "completed" and t["provider_calls"] == 2
    [block] = t["requests"][1]["messages"][-1]["content"]
    assert block["is_error"] is True


def test_the_round_limit_ends_incomplete_with_its_receipt(work, capsys):
    out = replay(work, capsys, "tool-round-limit.yaml")
    [t] = out["turns"]
    g = t["generation"]
    assert (g["status"], g["stop_reason"], g["text"]) == ("incomplete", "tool-round-limit", SAYS + "\n\n" + SAYS)
    assert len(g["tool_rounds"]) == 1 and t["provider_calls"] == 2  # max_rounds × max_attempts bounds it
    assert [p["kind"] for p in t["posts"]] == ["partial", "receipt"]
    assert (
        t["posts"][-1]["content"]
        == "-# Tool round limit reached; a further tool call was not run, and the output may be incomplete."
    )
    assert sorted(s["cause"] for s in out["stumps"]) == ["tool-round-limit", "tool-round-limit"]


def test_a_ceiling_inside_a_round_is_truncated_as_usual(work, capsys):
    out = replay(work, capsys, "tool-cut.yaml")
    [t] = out["turns"]
    g = t["generation"]
    assert (g["status"], g["stop_reason"], g["truncated"]) == ("truncated", "max_tokens", True)
    assert g["text"] == SAYS + "\n\n" + CEILING_TEXT and g["chars"] == len(g["text"])
    kinds = [p["kind"] for p in t["posts"]]
    assert kinds.count("receipt") == 1 and kinds[-1] == "receipt" and "speech" not in kinds
    assert "Output ceiling reached at 1,024 tokens; the remainder was not generated." in t["posts"][-1]["content"]
    squash = lambda s: "".join(s.split())  # noqa: E731
    assert squash("".join(text_posts(t))) == squash(g["text"])
    assert g["continuation"]["ended"] == "disabled" and t["provider_calls"] == 2


def test_a_round_whose_attempt_is_retried(work, capsys):
    out = replay(work, capsys, "tool-retry.yaml")
    [t] = out["turns"]
    g = t["generation"]
    assert [(a["segment"], a["index"], a["outcome"]) for a in g["attempts"]] == [
        (1, 1, "completed"),
        (2, 1, "abandoned"),
        (2, 2, "completed"),
    ]
    assert g["text"] == SAYS + "\n\n" + END_TEXT and FRAGMENT[:60] not in "".join(p["content"] for p in t["posts"])
    [s] = out["stumps"]
    assert (s["cause"], s["chars"], s["published"]) == ("retry-abandoned", 257, False)
    assert t["requests"][1] == t["requests"][2]  # the retry sends the same round again
    assert len(g["tool_rounds"]) == 1 and t["provider_calls"] == 3
