"""The model table is data (residents/models.yaml plus residents.yaml `models:`), and `check` uses it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from residents import cli, config, models

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
        ("claude-opus-4-6", "Claude Opus 4.6", 128000, False),
        ("claude-sonnet-4-6", "Claude Sonnet 4.6", 64000, False),
        ("claude-opus-5", "Claude Opus 5", 128000, False),
        ("claude-opus-5-5", "Claude Opus 5.5", 128000, False),
        ("claude-fable-5-1", "Claude Fable 5.1", 128000, False),
        ("claude-mythos-5", "Claude Mythos 5", 128000, False),
        ("claude-haiku-5-5", "Claude Haiku 5.5", 128000, False),
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
        ("claude-opus-4-10", None),  # 4.10, never 4.1 by a prefix, and no row guesses it
    ],
)
def test_unknown_ids_are_unknown_with_the_nearest_known_one(model, nearest):
    assert not models.known(model) and models.caps(model) is models.UNKNOWN
    if nearest:
        assert models.nearest(model) == nearest


def test_the_table_is_the_shipped_data_file():
    rows = {r.id for r in models.BUILTIN.rows}
    assert "claude-opus-4-1" in rows and "claude-fable-5-1" in rows
    assert not any(r.endswith("+") for r in rows)  # every built-in row is a published model, none a guess
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


@pytest.mark.parametrize("model", ["claude-fable-5-1", "claude-mythos-5", "claude-opus-5-5", "claude-sonnet-5"])
def test_todays_models_pass_check_without_an_output_ceiling(work, capsys, model):
    """The table names today's models, so a residence with one needs no `output_ceiling` of its own."""
    write_residence(work, model, 4096)
    assert cli.main(["check"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "model, context, prices, status, replacement",
    [
        ("claude-opus-5-5", 1_000_000, (4, 20), "active", None),
        ("claude-fable-5-1", 1_000_000, (10, 50), "active", None),
        ("claude-haiku-4-5-20251001", 200_000, (1, 5), "active", None),
        ("claude-opus-5", 1_000_000, (5, 25), "legacy", "claude-opus-5-5"),
        ("claude-opus-4-8", 1_000_000, (5, 25), "legacy", "claude-opus-5-5"),
        ("claude-opus-4-5-20251101", 200_000, (5, 25), "deprecated", "claude-opus-5-5"),
        ("claude-3-opus-20240229", 200_000, (15, 75), "retired", "claude-opus-4-1"),
    ],
)
def test_each_row_carries_its_published_window_prices_and_lifecycle(model, context, prices, status, replacement):
    c = models.caps(model)
    assert (c.context_window, (c.input_per_mtok, c.output_per_mtok)) == (context, prices)
    assert (c.status, c.replacement) == (status, replacement)


def test_the_table_says_which_pages_and_which_day_it_was_read_from():
    text = (ROOT / "residents" / "models.yaml").read_text(encoding="utf-8")
    header = text[: text.index("\nmodels:")]
    assert "Read on 2026-12-04" in header
    assert "https://platform.claude.com/docs/en/models" in header
    assert "https://platform.claude.com/docs/en/about-claude/model-deprecations" in header


def test_check_warns_on_a_deprecated_model_and_refuses_a_retired_one_naming_the_replacement(work, capsys):
    write_residence(work, "claude-opus-4-5-20251101", 4096, name="a")
    assert cli.main(["check"]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"{work}/residences/a.yaml:2: model: warning: Claude Opus 4.5 is deprecated and retires on 2027-01-22; "
        "use 'claude-opus-5-5' instead\n"
    )
    write_residence(work, "claude-3-opus-20240229", 4096, name="b")
    assert cli.main(["check"]) == 2
    warning, refusal = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"{work}/residences/a.yaml:2: model: warning: ")
    assert refusal.startswith(
        f"{work}/residences/b.yaml:2: model: Claude 3 Opus was retired on 2026-01-05: requests to it fail; "
        "use 'claude-opus-5-5' instead"
    )
    assert "claude-opus-4-1 -> claude-opus-4-8 -> claude-opus-5-5" in refusal  # the replacements, followed


def test_a_retired_model_in_a_scenario_still_replays_and_checks(tmp_path, capsys):
    """A scenario replays a recording: what became of its model since does not stop it."""
    assert cli.main(["check", str(ROOT / "scenarios" / "ceiling.yaml")]) == 0
    assert capsys.readouterr().err == ""


def test_an_operator_row_may_still_be_open_ended(work, capsys):
    (work / "residents.yaml").write_text("models:\n  claude-opus-9+: {family: Opus 9 on, output_ceiling: 200000}\n")
    write_residence(work, "claude-opus-9-1", 150000)
    assert cli.main(["check"]) == 0, capsys.readouterr().err
    assert models.caps("claude-opus-12").family == "Opus 9 on" and not models.known("claude-opus-8")


def test_an_openai_model_without_provider_names_the_provider_it_belongs_to(work, capsys):
    write_residence(work, "gpt-4o", 1024)
    assert cli.main(["check"]) == 2
    assert capsys.readouterr().err == (
        f"{work}/residences/r.yaml:2: model: 'gpt-4o' is OpenAI's model, but without `provider:` a residence is "
        "sent to Anthropic's API; add `provider: openai-compatible` with `base_url` and `api_key_env`\n"
    )


def test_cache_prices_follow_the_input_price_and_an_operator_row_may_set_any_price(work):
    """Anthropic's pricing page: a cache write is 1.25 times the input price, a read 0.1 times (models.yaml's
    cache_prices); a chat model has none. An operator's row keeps the built-in prices it does not state."""
    c = models.caps("claude-sonnet-4-5")
    assert (c.input_per_mtok, c.output_per_mtok, c.cache_write_per_mtok, c.cache_read_per_mtok) == (3, 15, 3.75, 0.3)
    assert models.caps("gpt-4o").cache_read_per_mtok is None
    assert models.estimated_cost(c, 1_000_000, 100_000, 200_000, 2_000_000) == pytest.approx(3 + 1.5 + 0.75 + 0.6)
    assert models.estimated_cost(models.caps("gpt-4o"), 10, 0, 0, 0) is None
    (work / "residents.yaml").write_text(
        "models:\n"
        "  claude-sonnet-4-5: {output_ceiling: 64000, input_per_mtok: 2}\n"
        "  claude-haiku-4-5: {output_ceiling: 64000, cache_read_per_mtok: 0.05}\n"
    )
    try:
        config.use_project_models(work)
        mine = models.caps("claude-sonnet-4-5")
        assert (mine.input_per_mtok, mine.output_per_mtok, mine.cache_write_per_mtok, mine.cache_read_per_mtok) == (
            2,
            15,
            2.5,
            0.2,
        )
        haiku = models.caps("claude-haiku-4-5")
        assert (haiku.input_per_mtok, haiku.cache_write_per_mtok, haiku.cache_read_per_mtok) == (1, 1.25, 0.05)
    finally:
        models.use(models.BUILTIN)
