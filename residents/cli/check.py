"""`residents check`: validate residences, policies, scenarios and the project file without running."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from .. import models
from ..config import (
    PROJECT_FILE,
    ConfigError,
    Residence,
    dotted,
    line_of,
    load_policy,
    load_residence,
    read_project,
    read_yaml,
)
from .common import UsageError, config_dir


@click.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
def check(paths: tuple[Path, ...]) -> int:
    """Validate residences, policies, scenarios and residents.yaml.

    With no PATHS: residents.yaml (if present), policies/*.yaml and residences/*.yaml of the
    configuration folder (--config, default the current folder). A folder in PATHS is checked the same way when it is a configuration folder
    (it has residents.yaml, policies/ or residences/), otherwise its *.yaml files are. Every
    problem is one line naming the file, the key and the line, and an unknown key names the key
    it probably meant; any problem exits 2. A model the table does not know is a warning (with
    the nearest known id) where the residence states its output_ceiling, and an error where it
    does not. In a residence, a deprecated model is a warning and a retired one an error, each
    naming the model to use instead (a scenario replays a recording, whatever became of its model).

    \b
    Example:
      residents check residences/cairn.yaml scenarios/ceiling.yaml
      residents check scenarios/
    """
    base = config_dir()
    found: list[tuple[Path, Path]] = []  # (file, the configuration folder its names are looked up in)
    for p in paths:
        if not p.exists():
            print(f"{p}: file not found", file=sys.stderr)
            return 2
        found += _files_of(p, base) if p.is_dir() else [(p, base)]
    if not paths:
        found = _config_files(base)
        if not found:
            where = "here" if base == Path.cwd() else f"in {base}"
            raise UsageError(
                f"nothing to check: no residences/*.yaml or policies/*.yaml {where}, and no paths given "
                "(residents init writes a starter set)"
            )
    elif not found:
        raise UsageError(f"nothing to check: no .yaml files in {', '.join(map(str, paths))}")
    problems, warnings = check_files(found)
    for line in warnings + problems:
        print(line, file=sys.stderr)
    if problems:
        return 2
    print(f"{len(found)} file(s) valid")
    return 0


def _files_of(folder: Path, config: Path) -> list[tuple[Path, Path]]:
    """The files a folder argument stands for, each with the configuration folder it belongs to."""
    if (folder / PROJECT_FILE).is_file() or (folder / "policies").is_dir() or (folder / "residences").is_dir():
        return _config_files(folder)
    base = folder.parent if folder.resolve().name in ("policies", "residences") else config
    return [(f, base) for f in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml"))]


def _config_files(folder: Path) -> list[tuple[Path, Path]]:
    """A configuration folder's residents.yaml (if present), policies and residences."""
    project = folder / PROJECT_FILE
    files = (
        ([project] if project.is_file() else [])
        + sorted((folder / "policies").glob("*.yaml"))
        + sorted((folder / "residences").glob("*.yaml"))
    )
    return [(f, folder) for f in files]


def check_files(files: list[tuple[Path, Path]]) -> tuple[list[str], list[str]]:
    """Problems (every one of each file, one line each, no repeats) and warnings, files told apart by
    folder and content."""
    from ..replay.scenario import load_scenario  # the local provider server comes with it: only when checking

    problems: list[str] = []
    warnings: list[str] = []
    for p, base in files:
        try:
            kind = _kind_of(p)
            if kind == "project":
                read_project(p)
            elif kind == "policy":
                load_policy(str(p), base)
            elif kind == "scenario":
                warnings += _model_warnings(p, "residence.model", load_scenario(p, base).residence)
            else:
                res = load_residence(str(p), base)
                warnings += _model_warnings(p, "model", res)
                retired, lines = _lifecycle(p, ("model",), res)
                (problems if retired else warnings).extend(lines)
        except ConfigError as e:
            named = list(dict.fromkeys(q.file for q in e.problems))  # each file's problems in line order
            problems += [str(q) for q in sorted(e.problems, key=lambda q: (named.index(q.file), q.line or 0))]
    return list(dict.fromkeys(problems)), warnings


def _model_warnings(path: Path, key: str, res: Residence) -> list[str]:
    if models.known(res.model):
        return []
    hint = models.nearest(res.model)
    return [
        f"{path}: {key}: warning: {res.model!r} is not in the model table"
        + (f" (did you mean {hint!r}?)" if hint else "")
        + f"; its stated output_ceiling {res.output_ceiling} is taken as given"
    ]


def _lifecycle(path: Path, key: tuple[str, ...], res: Residence) -> tuple[bool, list[str]]:
    """(refused, lines): a deprecated model is a warning, a retired one an error (its requests would
    fail). Scenarios are not asked: they replay a recording, whatever became of its model."""
    found = models.lifecycle_problem(res.model)
    if found is None:
        return False, []
    retired, why = found
    _, node = read_yaml(path)
    line = line_of(node, key)
    where = f"{path}:{line}" if line else str(path)
    return retired, [f"{where}: {dotted(key)}: {'' if retired else 'warning: '}{why}"]


def _kind_of(p: Path) -> str:
    if p.name == PROJECT_FILE:
        return "project"
    if p.parent.name == "policies":
        return "policy"
    if p.parent.name == "residences":
        return "residence"
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except Exception:  # the real load reports it properly
        return "residence"
    if isinstance(data, dict) and "turns" in data:
        return "scenario"
    if isinstance(data, dict) and "model" not in data and ("continuation" in data or "retries" in data):
        return "policy"
    return "residence"
