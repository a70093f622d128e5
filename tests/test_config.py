"""Configuration: every problem is one line naming file, key and line; nothing unknown slips through."""

from __future__ import annotations

from pathlib import Path

import pytest

from residents import cli
from residents.config import ConfigError, load_policy, load_residence

ROOT = Path(__file__).resolve().parent.parent


def write(tmp: Path, rel: str, text: str) -> Path:
    p = tmp / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


RES = """name: cairn
model: claude-haiku-4-5
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


@pytest.mark.parametrize(
    "policy, key, line",
    [
        ("retries:\n  max_attempts: three\n", "retries.max_attempts", 2),
        ("retries:\n  max_attempts: 0\n", "retries.max_attempts", 2),
        ("retries:\n  max_atempts: 3\n", "retries.max_atempts", 2),
        ("continuation:\n  standing: forever\n", "continuation.standing", 2),
        ("continuation:\n  standing: bounded\n  max_segments: 2\n", "continuation.max_output_tokens", 1),
        (
            "continuation:\n  standing: bounded\n  max_segments: 9\n  max_output_tokens: 10\n  min_progress_chars: 1\n"
            "  similarity_abort: 0.9\n",
            "continuation.max_segments",
            3,
        ),
        (
            "continuation:\n  standing: on-request\n  max_segments: 2\n  max_output_tokens: 10\n  min_progress_chars: 1\n"
            "  similarity_abort: 1.5\n",
            "continuation.similarity_abort",
            6,
        ),
        ("stumps:\n  moderators_read_text: maybe\n", "stumps.moderators_read_text", 2),
        ("catch_up:\n  window: 10 minutes\n", "catch_up.window", 2),
        ("catch_up:\n  window: 600\n", "catch_up.window", 2),
        ("catch_up:\n  window: 25h\n", "catch_up.window", 2),
        ("catch_up:\n  windw: 10m\n", "catch_up.windw", 2),
    ],
)
def test_policy_errors_name_file_key_and_line(tmp_path, policy, key, line):
    write(tmp_path, "policies/p.yaml", policy)
    with pytest.raises(ConfigError) as e:
        load_policy("p", tmp_path)
    assert e.value.key == key
    assert e.value.line == line
    assert str(e.value).startswith(f"{tmp_path / 'policies/p.yaml'}:{line}: {key}:")


@pytest.mark.parametrize(
    "text, key",
    [
        (RES.replace("max_tokens: 4096", "max_tokens: 65000"), "max_tokens"),  # above Haiku 4.5's ceiling
        (RES.replace("max_tokens: 4096", "max_tokens: '4096'"), "max_tokens"),
        (RES + "colour: red\n", "colour"),
        (RES.replace("name: cairn\n", ""), "name"),
        (RES + "discord:\n  channels: [general]\n", "discord.token_env"),
        (RES.replace("policy: default", "policy: nowhere"), "policy"),
        (RES.replace("policy: default", "policy:\n  retries: {max_attempts: -1}"), "policy.retries.max_attempts"),
    ],
)
def test_residence_errors_name_the_key(tmp_path, text, key):
    write(tmp_path, "policies/default.yaml", "{}\n")
    write(tmp_path, "residences/r.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_residence("r", tmp_path)
    assert e.value.key == key, str(e.value)
    assert "r.yaml" in str(e.value)


def test_catch_up_window_is_a_duration_of_seconds_minutes_or_hours(tmp_path, monkeypatch, capsys):
    assert load_policy("default", ROOT).catch_up.window_seconds == 600
    for text, seconds in (("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400)):
        write(tmp_path, "policies/p.yaml", f"catch_up:\n  window: {text}\n")
        assert load_policy("p", tmp_path).catch_up.window_seconds == seconds
    write(tmp_path, "policies/p.yaml", "catch_up:\n  window: 10 minutes\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "policies/p.yaml"]) == 2
    assert capsys.readouterr().err.strip() == (
        "policies/p.yaml:2: catch_up.window: not a duration: a number and its unit (d, h, m, s), like 1h, 30m,"
        " 90s or 1h30m (got '10 minutes')"
    )


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


def test_check_reports_every_problem_of_a_file_one_line_each_in_line_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path,
        "residences/r.yaml",
        "name: r\nmodel: claude-3-opus-20240229\nmax_token: 4096\n"
        "temperature: hot\npolicy:\n  retries: {max_attempts: three}\n"
        "discord: {channels: [general]}\n",
    )
    assert cli.main(["check", "residences/r.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "residences/r.yaml:1: max_tokens: required key is missing",
        "residences/r.yaml:3: max_token: unknown key (did you mean max_tokens?)",
        "residences/r.yaml:4: temperature: Input should be a valid number (got 'hot')",
        "residences/r.yaml:6: policy.retries.max_attempts: Input should be a valid integer (got 'three')",
        "residences/r.yaml:7: discord.token_env: required key is missing",
    ]
    # elsewhere one line still stands for them, and says there are more
    with pytest.raises(ConfigError) as caught:
        load_residence("r", tmp_path)
    assert len(caught.value.problems) == 5 and str(caught.value) == str(caught.value.problems[0])
    assert cli.main(["run"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith("(and 4 more problems in this configuration: `residents check` lists them all)"), line


@pytest.mark.parametrize(
    "rel, text, expected",
    [
        (
            "residences/r.yaml",
            RES + "max_token: 4\n",
            "residences/r.yaml:6: max_token: unknown key (did you mean max_tokens?)",
        ),
        (
            "policies/p.yaml",
            "retries: {max_atempts: 2}\n",
            "policies/p.yaml:1: retries.max_atempts: unknown key (did you mean max_attempts?)",
        ),
        (
            "policies/p.yaml",
            "continuaton: {}\n",
            "policies/p.yaml:1: continuaton: unknown key (did you mean continuation?)",
        ),
        (
            "residences/r.yaml",
            RES + "discord: {token_envv: X}\n",
            "residences/r.yaml:6: discord.token_envv: unknown key (did you mean token_env?)",
        ),
        (
            "residents.yaml",
            "models:\n  my-model: {output_ceilin: 5}\n",
            "residents.yaml:2: models.my-model.output_ceilin: unknown key (did you mean output_ceiling?)",
        ),
        (
            "scenario.yaml",
            "residence: cairn\nturns:\n  - say: {autor: a, content: b}\n",
            "scenario.yaml:3: turns[0].say.autor: unknown key (did you mean author?)",
        ),
        ("residences/r.yaml", RES + "zzzz: 1\n", "residences/r.yaml:6: zzzz: unknown key"),
    ],
)
def test_an_unknown_key_names_the_key_it_probably_meant(tmp_path, monkeypatch, capsys, rel, text, expected):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "residences/cairn.yaml", RES.replace("policy: default\n", ""))
    write(tmp_path, rel, text)
    assert cli.main(["check", rel]) == 2
    assert expected in capsys.readouterr().err.splitlines()


def test_check_a_folder_checks_the_files_in_it(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "conf"
    write(conf, "policies/p.yaml", "retries: {max_attempts: lots}\n")
    write(conf, "residences/r.yaml", RES.replace("policy: default", "policy: p"))
    write(conf, "residences/typo.yaml", RES + "modle: x\n")
    write(
        conf, "scenarios/s.yaml", "residence: r\nturns:\n  - say: {author: a, content: b}\n    calls: [{status: 500}]\n"
    )
    write(conf, "scenarios/bad.yaml", "residence: r\nturns: []\n")
    monkeypatch.chdir(tmp_path)
    # a configuration folder: its policies and residences, names looked up in it
    assert cli.main(["check", "conf"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "conf/policies/p.yaml:1: retries.max_attempts: Input should be a valid integer (got 'lots')",
        "conf/residences/typo.yaml:6: modle: unknown key (did you mean model?)",
    ], err
    # a folder of residences: each file, policies from the folder beside it
    assert cli.main(["check", "conf/residences"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("conf/policies/p.yaml:1") and err[1].startswith("conf/residences/typo.yaml:6")
    # any other folder: its .yaml files (scenarios here), named residences from the working folder
    monkeypatch.chdir(conf)
    assert cli.main(["check", "scenarios"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "scenarios/bad.yaml:2: turns: List should have at least 1 item after validation, not 0" in err
    assert not any(line.startswith("scenarios/s.yaml") for line in err), err
    write(conf, "policies/p.yaml", "retries: {max_attempts: 2}\n")
    (conf / "scenarios" / "bad.yaml").unlink()
    (conf / "residences" / "typo.yaml").unlink()
    assert cli.main(["check", "scenarios", "."]) == 0
    assert capsys.readouterr().out.strip() == "3 file(s) valid"
    (tmp_path / "empty").mkdir()
    assert cli.main(["check", str(tmp_path / "empty")]) == 2
    assert "nothing to check" in capsys.readouterr().err


def test_check_names_every_bound_a_granted_standing_still_needs_at_once(tmp_path, monkeypatch, capsys):
    """A cross-key rule reports all its keys in one run, not one per fix."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "policies/p.yaml", "continuation:\n  standing: bounded\n  max_segments: 2\n")
    assert cli.main(["check", "policies/p.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"policies/p.yaml:1: continuation.{key}: required when standing is 'bounded'"
        for key in ("max_output_tokens", "min_progress_chars", "similarity_abort")
    ]


def test_check_names_a_bad_continue_button_value_and_who_may_press_by_default(tmp_path, monkeypatch, capsys):
    """`continuation.button` says who may press Continue; by default who may /continue: moderators."""
    assert load_policy("default", ROOT).continuation.button == "moderators"
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "policies/p.yaml", "continuation:\n  standing: none\n  button: everyone\n")
    assert cli.main(["check", "policies/p.yaml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "policies/p.yaml:3: continuation.button: Input should be 'moderators', 'asker' or 'anyone' (got 'everyone')"
    ]
    write(tmp_path, "policies/p.yaml", "continuation:\n  standing: none\n  button: asker\n")
    assert load_policy("p", tmp_path).continuation.button == "asker"


def test_check_names_a_bad_file_budget_and_one_above_the_models_context_window(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "policies/default.yaml", "retries: {max_attempts: 3}\n")
    write(tmp_path, "policies/negative.yaml", "attachments:\n  request_budget_tokens: -1\n")
    write(tmp_path, "policies/words.yaml", "attachments: {request_budget_tokens: lots}\n")
    write(tmp_path, "policies/typo.yaml", "attachment: {request_budget_tokens: 10}\n")
    write(
        tmp_path,
        "residences/ok.yaml",
        RES.replace("policy: default", "policy: {attachments: {request_budget_tokens: 0}}"),
    )
    write(
        tmp_path,
        "residences/wide.yaml",
        RES.replace("policy: default", "policy: {attachments: {request_budget_tokens: 300000}}"),
    )
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4, err
    assert "negative.yaml:2: attachments.request_budget_tokens: Input should be greater than or equal to 0" in err[0]
    assert "typo.yaml:1: attachment: unknown key (did you mean attachments?)" in err[1]
    assert "words.yaml:1: attachments.request_budget_tokens: Input should be a valid integer" in err[2]
    assert (
        "wide.yaml:5: policy.attachments.request_budget_tokens: 300,000 is above claude-haiku-4-5's context"
        " window of 200,000 tokens" in err[3]
    )


# ------------------------------------------------------------------ ledger.checkpoints in residents.yaml

DISCORD_RES = RES + "discord: {token_env: CKPT_TOKEN, channels: [general]}\n"


@pytest.mark.parametrize(
    "every, seconds", [("1h", 3600), ("30m", 1800), ("90s", 90), ("1h30m", 5400), ("1d", 86400), ("1s", 1)]
)
def test_checkpoints_take_a_channel_and_a_duration(tmp_path, monkeypatch, every, seconds):
    from residents.discord.run import plan_deployment

    write(tmp_path, "residences/cairn.yaml", DISCORD_RES)
    write(tmp_path, "residents.yaml", f"ledger:\n  checkpoints: {{channel: provenance, every: {every}}}\n")
    dep = plan_deployment(tmp_path, local_api=True, env={"ANTHROPIC_API_KEY": "k"})
    assert dep.checkpoints is not None
    assert (dep.checkpoints.channel, dep.checkpoints.every) == ("provenance", seconds)


def test_without_checkpoints_nothing_is_posted(tmp_path):
    from residents.discord.run import plan_deployment

    write(tmp_path, "residences/cairn.yaml", DISCORD_RES)
    assert plan_deployment(tmp_path, local_api=True, env={"ANTHROPIC_API_KEY": "k"}).checkpoints is None
    write(tmp_path, "residents.yaml", "models: {}\n")
    assert plan_deployment(tmp_path, local_api=True, env={"ANTHROPIC_API_KEY": "k"}).checkpoints is None


DURATION = "not a duration: a number and its unit (d, h, m, s), like 1h, 30m, 90s or 1h30m"


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "ledger:\n  checkpoints:\n    channel: provenance\n    every: 1 hour\n",
            f"residents.yaml:4: ledger.checkpoints.every: {DURATION} (got '1 hour')",
        ),
        (
            "ledger:\n  checkpoints:\n    channel: provenance\n    every: 3600\n",
            f"residents.yaml:4: ledger.checkpoints.every: {DURATION} (got 3600)",
        ),
        (
            "ledger:\n  checkpoints:\n    channel: provenance\n    every: 0s\n",
            "residents.yaml:4: ledger.checkpoints.every: must be between 1s and 7d (got '0s')",
        ),
        (
            "ledger:\n  checkpoints:\n    channel: provenance\n    every: 8d\n",
            "residents.yaml:4: ledger.checkpoints.every: must be between 1s and 7d (got '8d')",
        ),
        (
            "ledger:\n  checkpoints:\n    channel: two words\n    every: 1h\n",
            "residents.yaml:3: ledger.checkpoints.channel: a channel is a name, an id or guild/channel (got 'two words')",
        ),
        (
            "ledger:\n  checkpoints:\n    every: 1h\n",
            "residents.yaml:2: ledger.checkpoints.channel: required key is missing",
        ),
        (
            "ledger:\n  checkpoints: {channel: provenance, every: 1h, evry: 1h}\n",
            "residents.yaml:2: ledger.checkpoints.evry: unknown key (did you mean every?)",
        ),
        (
            "ledger:\n  checkpoint: {channel: provenance, every: 1h}\n",
            "residents.yaml:2: ledger.checkpoint: unknown key (did you mean checkpoints?)",
        ),
    ],
)
def test_a_bad_checkpoint_setting_is_one_line_naming_file_key_and_line(tmp_path, monkeypatch, capsys, text, expected):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "residences/cairn.yaml", DISCORD_RES)
    write(tmp_path, "residents.yaml", text)
    assert cli.main(["check", "residents.yaml"]) == 2
    assert expected in capsys.readouterr().err.splitlines()
    monkeypatch.setenv("CKPT_TOKEN", "t")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    assert cli.main(["run", "--discord-api", "http://127.0.0.1:9"]) == 2  # start-up stops before connecting
    assert capsys.readouterr().err.splitlines() == [f"{tmp_path}/{expected}"]


def test_check_reports_a_range_error_and_an_unknown_model_of_one_file_both(tmp_path, monkeypatch, capsys):
    """Field errors no longer hide the cross-field rules: every problem of the file is listed."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "residences/r.yaml", "name: r\nmodel: claude-fabel-5\nmax_tokens: 0\ntemperature: 3\n")
    assert cli.main(["check", "residences/r.yaml"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[0:2] for line in err] == [
        ["residences/r.yaml:2", "model"],
        ["residences/r.yaml:3", "max_tokens"],
        ["residences/r.yaml:4", "temperature"],
    ]
    assert "did you mean 'claude-fable-5'?" in err[0]


def test_check_reports_several_cross_field_rules_of_one_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path,
        "residences/r.yaml",
        "name: r\nmodel: claude-haiku-4-5\nmax_tokens: 100000\nbase_url: http://x\ntemperature: 2\n",
    )
    assert cli.main(["check", "residences/r.yaml"]) == 2
    err = capsys.readouterr().err
    assert "r.yaml:3: max_tokens: 100000 is above claude-haiku-4-5's output ceiling of 64000" in err
    assert "r.yaml:4: base_url: only with `provider: openai-compatible`" in err
    assert "r.yaml:5: temperature:" in err
