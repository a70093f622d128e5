"""The model table is data (residents/models.yaml plus residents.yaml `models:`), and `check` uses it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from residents import cli, models

ROOT = Path(__file__).resolve().parent.parent

RES = """name: cairn
model: {model}
max_tokens: {max_tokens}
system: hi
"""


@pytest.fixture(autouse=True)
def builtin_table():
    """A test that loads a project's overrides leaves the process with the built-in table again."""
    yield
    models.use(models.BUILTIN)


@pytest.fixture
def work(tmp_path, monkeypatch):
    (tmp_path / "residences").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_residence(work: Path, model: str, max_tokens: int = 1024, extra: str = "", name: str = "r") -> Path:
    p = work / "residences" / f"{name}.yaml"
    p.write_text(RES.format(model=model, max_tokens=max_tokens) + extra)
    return p


@pytest.mark.parametrize(
    "prefix", ["", "us.", "eu.", "apac.", "jp.", "au.", "ca.", "global.", "us-gov.", "eu-central."]
)
@pytest.mark.parametrize(
    "model, family",
    [
        ("anthropic.claude-3-5-sonnet-20240620-v1:0", "Claude 3.5 Sonnet"),
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", "Claude Sonnet 4.5"),
        ("anthropic.claude-opus-4-1-20250805-v1:0", "Claude Opus 4.1"),
    ],
)
def test_a_bedrock_id_is_known_behind_any_region_prefix(prefix, model, family):
    """Bedrock inference profiles put a geography or region before `anthropic.`; any such prefix is taken off."""
    assert models.base_id(prefix + model) == models.base_id(model)
    assert models.known(prefix + model) and models.caps(prefix + model).family == family


@pytest.mark.parametrize(
    "model",
    [
        "us.gov.anthropic.claude-3-opus-20240229",
        "US.anthropic.claude-3-opus-20240229",
        "us_gov.anthropic.claude-3-opus-20240229",
        "-us.anthropic.claude-3-opus-20240229",
        "openai.claude-3-opus-20240229",
    ],
)
def test_a_prefix_of_another_shape_is_not_taken_for_a_bedrock_region(model):
    assert not models.known(model)


@pytest.mark.parametrize(
    "model, family, ceiling, prefill",
    [
        ("claude-3-opus-20240229", "Claude 3 Opus", 4096, True),
        ("anthropic.claude-3-opus-20240229-v1:0", "Claude 3 Opus", 4096, True),  # Bedrock
        ("us.anthropic.claude-3-5-sonnet-20241022-v2:0", "Claude 3.5 Sonnet", 8192, True),  # Bedrock, cross-region
        ("claude-3-opus@20240229", "Claude 3 Opus", 4096, True),  # Vertex
        ("claude-3-5-sonnet-v2@20241022", "Claude 3.5 Sonnet", 8192, True),
        ("claude-3-5-haiku-latest", "Claude 3.5 Haiku", 8192, True),
        ("claude-3-haiku-20240307", "Claude 3 Haiku", 4096, True),
        ("claude-3-7-sonnet-20250219", "Claude 3.7 Sonnet", 64000, True),
        ("claude-opus-4-20250514", "Claude Opus 4", 32000, True),
        ("claude-opus-4-0", "Claude Opus 4", 32000, True),
        ("claude-opus-4-1-20250805", "Claude Opus 4.1", 32000, True),
        ("claude-opus-4-1", "Claude Opus 4.1", 32000, True),
        ("claude-sonnet-4-20250514", "Claude Sonnet 4", 64000, True),
        ("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", 64000, True),
        ("claude-haiku-4-5", "Claude Haiku 4.5", 64000, True),
        ("claude-opus-4-6", "Claude Opus 4.6 and later", 128000, False),
        ("claude-sonnet-4-6", "Claude Sonnet 4.6 and later", 128000, False),
        ("claude-opus-4-10", "Claude Opus 4.6 and later", 128000, False),  # 4.10, never 4.1 by a prefix
        ("claude-opus-5", "Claude 5 and later", 128000, False),
    ],
)
def test_ids_match_on_whole_segments(model, family, ceiling, prefill):
    c = models.caps(model)
    assert (c.family, c.max_output_tokens, c.accepts_prefill) == (family, ceiling, prefill)
    assert models.known(model)


@pytest.mark.parametrize(
    "model, nearest",
    [
        ("claude-sonet-4-5", "claude-sonnet-4-5"),
        ("claude-opus-4-1x", "claude-opus-4-1"),
        ("llama-3-70b", None),
        ("claude-3-opus-2024", None),
        ("claude", None),
        ("claude-opus-4-1-extended", None),
    ],
)
def test_unknown_ids_are_unknown_with_the_nearest_known_one(model, nearest):
    assert not models.known(model) and models.caps(model) is models.UNKNOWN
    if nearest:
        assert models.nearest(model) == nearest


def test_the_table_is_the_shipped_data_file():
    rows = {r.id for r in models.BUILTIN.rows}
    assert "claude-opus-4-1" in rows and "claude-opus-4-6+" in rows
    text = (ROOT / "residents" / "models.yaml").read_text(encoding="utf-8")
    assert all(f"\n  {r}:" in text for r in rows)


def test_check_names_an_unknown_model_with_did_you_mean(work, capsys):
    write_residence(work, "claude-sonet-4-5")
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"{work}/residences/r.yaml:2: model: 'claude-sonet-4-5' is not in the model table")
    assert "did you mean 'claude-sonnet-4-5'?" in err and "output_ceiling" in err


def test_an_unknown_model_with_its_output_ceiling_runs_and_check_warns(work, capsys):
    write_residence(work, "llama-3-70b", 4000, "output_ceiling: 16384\n")
    assert cli.main(["check"]) == 0
    out, err = capsys.readouterr()
    assert out == "1 file(s) valid\n"
    assert (
        err.startswith(f"{work}/residences/r.yaml: model: warning: 'llama-3-70b' is not in the model table")
        and err.count("\n") == 1
    )


@pytest.mark.parametrize(
    "model, max_tokens, extra, key, words",
    [
        ("llama-3-70b", 20000, "output_ceiling: 16384\n", "max_tokens", "above the stated output_ceiling of 16384"),
        ("claude-3-opus-20240229", 1024, "output_ceiling: 8192\n", "output_ceiling", "above claude-3-opus-20240229's"),
        ("claude-3-opus-20240229", 4096, "output_ceiling: 2048\n", "max_tokens", "of 2048"),
        ("claude-3-opus-20240229", 5000, "", "max_tokens", "output ceiling of 4096"),
        ("llama-3-70b", 1024, "output_ceiling: 0\n", "output_ceiling", "greater than or equal to 1"),
    ],
)
def test_max_tokens_is_checked_against_the_ceiling_in_force(work, capsys, model, max_tokens, extra, key, words):
    write_residence(work, model, max_tokens, extra)
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f": {key}: " in err and words in err, err


def test_project_file_models_extend_and_override_the_table(work, capsys):
    (work / "residents.yaml").write_text(
        "models:\n"
        "  my-proxy-model: {family: Proxy, output_ceiling: 16000, prefill: false}\n"
        "  claude-3-opus: {family: Claude 3 Opus, output_ceiling: 2048, prefill: true}\n"
    )
    write_residence(work, "my-proxy-model-20250101", 16000, name="a")
    write_residence(work, "claude-3-opus-20240229", 4096, name="b")
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{work}/residences/b.yaml:3: max_tokens: 4096 is above claude-3-opus-20240229's output ceiling of 2048"
    ]
    assert models.caps("my-proxy-model").family == "Proxy"
    write_residence(work, "claude-3-opus-20240229", 2048, name="b")
    assert cli.main(["check"]) == 0
    assert capsys.readouterr().out == "3 file(s) valid\n"  # residents.yaml is checked too


@pytest.mark.parametrize(
    "text, key",
    [
        ("models:\n  x: {output_ceiling: lots}\n", "models.x.output_ceiling"),
        ("models:\n  x: {prefill: true}\n", "models.x.output_ceiling"),
        ("models:\n  x: {output_ceiling: 10, colour: red}\n", "models.x.colour"),
        ("models:\n  claude-+-x: {output_ceiling: 10}\n", "models.claude-+-x"),
        ("modles: {}\n", "modles"),
    ],
)
def test_a_bad_project_file_is_one_line_naming_it_and_the_key(work, capsys, text, key):
    (work / "residents.yaml").write_text(text)
    write_residence(work, "claude-3-opus-20240229")
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{work}/residents.yaml:") and f": {key}: " in err, err


def test_an_unknown_model_stops_a_replay_with_one_line_through_the_console_script(tmp_path):
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    src = (tmp_path / "scenarios" / "ceiling.yaml").read_text()
    (tmp_path / "scenarios" / "typo.yaml").write_text(src.replace("claude-3-opus-20240229", "claude-sonet-4-5"))
    exe = Path(sys.executable).parent / "residents"
    p = subprocess.run(
        [str(exe), "replay", "scenarios/typo.yaml", "--json", "--db", "l.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "typo.yaml" in p.stderr and "residence.model" in p.stderr and "did you mean 'claude-sonnet-4-5'" in p.stderr
    assert not (tmp_path / "l.db").exists()
