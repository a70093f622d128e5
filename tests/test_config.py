"""Configuration: every problem is one line naming file, key and line; nothing unknown slips through."""
from __future__ import annotations

from pathlib import Path

import pytest

from bot import cli
from bot.config import ConfigError, load_policy, load_residence

ROOT = Path(__file__).resolve().parent.parent


def write(tmp: Path, rel: str, text: str) -> Path:
    p = tmp / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


RES = """name: cairn
model: claude-3-opus-20240229
max_tokens: 4096
system: hi
policy: default
"""


def test_shipped_examples_are_valid(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert cli.main(["check"]) == 0
    assert "valid" in capsys.readouterr().out


def test_default_policy_never_continues():
    assert load_policy("default", ROOT).continuation.standing == "none"
    res = load_residence("cairn", ROOT)
    assert res.policy.continuation.standing == "none"


@pytest.mark.parametrize("policy, key, line", [
    ("retries:\n  max_attempts: three\n", "retries.max_attempts", 2),
    ("retries:\n  max_attempts: 0\n", "retries.max_attempts", 2),
    ("retries:\n  max_atempts: 3\n", "retries.max_atempts", 2),
    ("continuation:\n  standing: forever\n", "continuation.standing", 2),
    ("continuation:\n  standing: bounded\n  max_segments: 2\n", "continuation.max_output_tokens", 1),
    ("continuation:\n  standing: bounded\n  max_segments: 9\n  max_output_tokens: 10\n  min_progress_chars: 1\n"
     "  similarity_abort: 0.9\n", "continuation.max_segments", 3),
    ("continuation:\n  standing: on-request\n  max_segments: 2\n  max_output_tokens: 10\n  min_progress_chars: 1\n"
     "  similarity_abort: 1.5\n", "continuation.similarity_abort", 6),
    ("stumps:\n  moderators_read_text: maybe\n", "stumps.moderators_read_text", 2),
])
def test_policy_errors_name_file_key_and_line(tmp_path, policy, key, line):
    write(tmp_path, "policies/p.yaml", policy)
    with pytest.raises(ConfigError) as e:
        load_policy("p", tmp_path)
    assert e.value.key == key
    assert e.value.line == line
    assert str(e.value).startswith(f"{tmp_path / 'policies/p.yaml'}:{line}: {key}:")


@pytest.mark.parametrize("text, key", [
    (RES.replace("max_tokens: 4096", "max_tokens: 5000"), "max_tokens"),  # above Opus's ceiling
    (RES.replace("max_tokens: 4096", "max_tokens: '4096'"), "max_tokens"),
    (RES + "colour: red\n", "colour"),
    (RES.replace("name: cairn\n", ""), "name"),
    (RES + "discord:\n  channels: [general]\n", "discord.token_env"),
    (RES.replace("policy: default", "policy: nowhere"), "policy"),
    (RES.replace("policy: default", "policy:\n  retries: {max_attempts: -1}"), "policy.retries.max_attempts"),
])
def test_residence_errors_name_the_key(tmp_path, text, key):
    write(tmp_path, "policies/default.yaml", "{}\n")
    write(tmp_path, "residences/r.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_residence("r", tmp_path)
    assert e.value.key == key, str(e.value)
    assert "r.yaml" in str(e.value)


def test_broken_yaml_and_non_mappings(tmp_path):
    write(tmp_path, "residences/bad.yaml", "name: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        load_residence("bad", tmp_path)
    assert "invalid YAML" in str(e.value) and e.value.line
    write(tmp_path, "residences/list.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_residence("list", tmp_path)


def test_check_exits_2_with_one_line_per_problem(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "policies/default.yaml", "retries: {max_attempts: 3}\n")
    write(tmp_path, "policies/broken.yaml", "retries: {max_attempts: lots}\n")
    write(tmp_path, "residences/ok.yaml", RES)
    write(tmp_path, "residences/typo.yaml", RES + "modle: x\n")
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert "broken.yaml:1: retries.max_attempts" in err[0]
    assert "typo.yaml:6: modle: unknown key" in err[1]


def test_check_missing_path_is_exit_2_without_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "nope.yaml"]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and "Traceback" not in err
