"""Packaging: the bundled examples and scenarios, `residents init`, the `--config` folder, and a
wheel that runs from any folder once installed (not editable).

The e2e tests build a wheel from a copy of the source tree, install it with no dependencies into a
fresh venv under tmp_path, and run its `residents` from empty folders; third-party distributions
come from this venv's site-packages by PYTHONPATH (no .pth there is read, so `residents` can only come
from the wheel — asserted).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from residents import cli, models

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "residents", "residences", "policies", "scenarios")
BUNDLED_SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """An empty working folder far from the source tree."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


# ---------------------------------------------------------------- in process: names, init, --config


def test_replay_runs_a_bundled_scenario_by_name_from_an_empty_folder(elsewhere, capsys):
    # `continuation` names its policy (`bounded`): it resolves from the bundled examples, not from here.
    assert cli.main(["replay", "continuation", "--json"]) == 0
    turn = json.loads(capsys.readouterr().out)["turns"][0]
    assert turn["generation"]["status"] == "completed" and len(turn["generation"]["segments"]) == 2
    assert list(elsewhere.iterdir()) == []

    # a file that exists is taken as typed, before any bundled name
    src = (
        (ROOT / "scenarios" / "ceiling.yaml").read_text().replace("specimens/", str(ROOT / "scenarios/specimens") + "/")
    )
    (elsewhere / "ceiling").write_text(src.replace("Describe the harbour.", "Describe the quay."))
    assert cli.main(["replay", "ceiling"]) == 0
    assert "[alice] Describe the quay." in capsys.readouterr().out


def test_replay_of_an_unknown_name_lists_the_bundled_ones(elsewhere, capsys):
    assert cli.main(["replay", "ceilling"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ceilling: file not found") and "Traceback" not in err
    assert all(name in err for name in BUNDLED_SCENARIOS)
    assert cli.main(["replay", "../scenarios/ceiling"]) == 2  # a name is never a path into the bundle
    assert "no bundled scenario" in capsys.readouterr().err


def test_init_writes_the_starter_folder_and_never_overwrites(elsewhere, capsys):
    assert cli.main(["init", "bots"]) == 0
    out = capsys.readouterr().out
    for folder in ("residences", "policies"):
        shipped = sorted(p.name for p in (ROOT / folder).glob("*.yaml"))
        assert sorted(p.name for p in (elsewhere / "bots" / folder).iterdir()) == shipped
        for name in shipped:
            assert (elsewhere / "bots" / folder / name).read_bytes() == (ROOT / folder / name).read_bytes()
            assert f"bots/{folder}/{name}" in out
    env = (elsewhere / "bots" / ".env.example").read_text()
    assert {ln.split("=")[0] for ln in env.splitlines() if "=" in ln and not ln.startswith("#")} == {
        "ANTHROPIC_API_KEY",
        "CAIRN_DISCORD_TOKEN",
        "SILL_DISCORD_TOKEN",
    }
    assert all(ln.endswith("=") for ln in env.splitlines() if "=" in ln and not ln.startswith("#"))  # no values

    edited = elsewhere / "bots" / "residences" / "cairn.yaml"
    edited.write_text(edited.read_text().replace("max_tokens: 1024", "max_tokens: 2048"))
    (elsewhere / "bots" / ".env.example").unlink()
    assert cli.main(["init", "bots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "residences/cairn.yaml" in err and "--force" in err
    assert "max_tokens: 2048" in edited.read_text() and not (elsewhere / "bots" / ".env.example").exists()
    assert cli.main(["init", "bots", "--force"]) == 0
    assert "max_tokens: 1024" in edited.read_text() and (elsewhere / "bots" / ".env.example").exists()


def test_init_starts_on_current_models_with_the_cut_in_view_and_says_how_to_make_env(elsewhere, capsys):
    """The starter residences use models Anthropic still serves as current (no retired Claude 3 Opus),
    one with a max_tokens far below its ceiling so its cut is seen early; init's advice on .env is one
    sentence."""
    assert cli.main(["init", "bots"]) == 0
    out = capsys.readouterr().out
    assert f"next: copy {Path('bots') / '.env.example'} to {Path('bots') / '.env'} and fill in its values" in out
    assert cli.main(["--config", "bots", "check"]) == 0
    assert capsys.readouterr().err == ""  # nothing deprecated, nothing retired
    limits = []
    for path in sorted((elsewhere / "bots" / "residences").glob("*.yaml")):
        res = yaml.safe_load(path.read_text())
        caps = models.caps(res["model"])
        assert caps.status == "active" and models.known(res["model"]), path
        limits.append(res["max_tokens"] / caps.max_output_tokens)
    assert min(limits) < 0.05  # a small max_tokens: a long answer is cut, and the cut is seen


def test_config_folder_is_where_residences_policies_and_the_default_ledger_resolve(elsewhere, capsys):
    assert cli.main(["init", "cfg"]) == 0
    assert cli.main(["check"]) == 2  # nothing here: the current folder is not the configuration folder
    assert "nothing to check" in capsys.readouterr().err
    assert cli.main(["--config", "cfg", "check"]) == 0
    assert "5 file(s) valid" in capsys.readouterr().out

    (elsewhere / "cfg" / "policies" / "default.yaml").write_text("retries: {max_attempts: 0}\n")
    assert cli.main(["--config", "cfg", "check"]) == 2
    assert capsys.readouterr().err.startswith("cfg/policies/default.yaml:1: retries.max_attempts: ")

    # a scenario file's residence and policy names resolve from the configuration folder
    (elsewhere / "cfg" / "policies" / "default.yaml").write_text("retries: {max_attempts: 2, backoff_seconds: 0}\n")
    src = (ROOT / "scenarios" / "retry.yaml").read_text().replace("specimens/", str(ROOT / "scenarios/specimens") + "/")
    _, turns = src.split("turns:", 1)
    (elsewhere / "named.yaml").write_text("residence: cairn\nturns:" + turns)
    db = elsewhere / "cfg" / "data" / "ledger.db"
    assert cli.main(["--config", "cfg", "replay", "named.yaml", "--json", "--db", str(db)]) == 0
    attempts = json.loads(capsys.readouterr().out)["turns"][0]["generation"]["attempts"]
    assert len(attempts) == 2  # cfg/policies/default.yaml's max_attempts, not the bundled default's 3

    # the default ledger is data/ledger.db under --config, not under the current folder
    assert cli.main(["--config", "cfg", "ledger", "list"]) == 0
    assert "failed" in capsys.readouterr().out
    assert cli.main(["ledger", "list"]) == 2
    assert capsys.readouterr().err.startswith("residents: data/ledger.db: no ledger there")
    assert not (elsewhere / "data").exists()


def test_config_must_be_an_existing_folder(elsewhere, capsys):
    assert cli.main(["--config", "missing", "check"]) == 2
    err = capsys.readouterr().err
    assert "--config" in err and "missing" in err and "Traceback" not in err


# ---------------------------------------------------------------- e2e: a wheel, installed, run from anywhere


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding only the project's wheel; its `residents` executable."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCE:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-build-isolation",
            "--no-deps",
            str(src),
            "-w",
            str(tmp / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("residents-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    inst = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert inst.returncode == 0, inst.stderr[-2000:]
    return venv


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "PYTHON"))}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # third-party distributions only: .pth files are not read
    return env


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "residents"), *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.e2e
def test_the_installed_wheel_is_what_runs_and_carries_the_examples(installed, tmp_path):
    p = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-c",
            "import residents, residents.bundled as b; print(residents.__file__); print(b.root()); print(*b.scenario_names())",
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    module, root, names = p.stdout.splitlines()
    assert Path(module).is_relative_to(installed) and not Path(module).is_relative_to(ROOT / "residents")
    assert Path(root) == Path(module).parent / "examples"
    assert names.split() == BUNDLED_SCENARIOS


@pytest.mark.e2e
def test_the_installed_wheel_replays_bundled_scenarios_by_name_from_an_empty_folder(installed, tmp_path):
    p = _run(installed, "replay", "ceiling", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    turn = json.loads(p.stdout)["turns"][0]
    assert (turn["generation"]["status"], turn["generation"]["output_tokens"]) == ("truncated", 1024)
    assert [x["kind"] for x in turn["posts"]][-1] == "receipt"
    named = _run(installed, "replay", "on-request", "--json", cwd=tmp_path)  # names the policy `on-request`
    assert named.returncode == 0, named.stderr[-2000:]
    unknown = _run(installed, "replay", "nowhere", cwd=tmp_path)
    assert unknown.returncode == 2 and "ceiling" in unknown.stderr and "Traceback" not in unknown.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.e2e
def test_the_installed_wheel_inits_checks_and_runs_the_demo_with_a_config_folder(installed, tmp_path):
    cfg, cwd = tmp_path / "cfg", tmp_path / "cwd"
    cwd.mkdir()
    made = _run(installed, "init", str(cfg), cwd=cwd)
    assert made.returncode == 0, made.stderr
    assert {p.relative_to(cfg).as_posix() for p in cfg.rglob("*") if p.is_file()} == {
        ".env.example",
        *(f"{d}/{p.name}" for d in ("residences", "policies") for p in (ROOT / d).glob("*.yaml")),
    }
    checked = _run(installed, "--config", str(cfg), "check", cwd=cwd)
    assert checked.returncode == 0 and "5 file(s) valid" in checked.stdout, checked.stderr

    demo = _run(installed, "--config", str(cfg), "demo", "--headless", "--port", "0", cwd=cwd)
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert (
        "[cairn · receipt] -# Output ceiling reached at 4,096 tokens; the remainder was not generated." in demo.stdout
    )
    assert (cfg / "data" / "demo.db").is_file()  # the demo's one ledger lives under --config
    assert list(cwd.iterdir()) == []
