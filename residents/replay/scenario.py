"""Replay scenario files (docs/scenarios.md): YAML → validated turns with their recorded calls.

Everything is checked before anything runs, so a bad scenario exits 2 with nothing in the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from ..config import ConfigError, Residence, Strict, build_residence, dotted, line_of, mapping, read_yaml, validate
from ..localservers.provider import Call


class Say(Strict):
    author: str = Field(min_length=1)
    content: str


class CallSpec(Strict):
    sse: str | None = Field(None, min_length=1)
    end: Literal["clean", "drop"] = "clean"
    status: int | None = Field(None, ge=100, le=599)
    headers: dict[str, str] | None = None
    body: Any = None

    @model_validator(mode="before")
    @classmethod
    def _header_values_as_text(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("headers"), dict):
            h = data["headers"]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, str) for v in h.values()):
                data = {**data, "headers": {str(k): str(v) for k, v in h.items()}}
        return data

    @model_validator(mode="after")
    def _one_kind(self) -> CallSpec:
        if (self.sse is None) == (self.status is None):
            raise ValueError("a call needs exactly one of `sse` (a recorded stream) or `status` (an HTTP error)")
        return self


class Turn(Strict):
    say: Say | None = None
    continue_: bool = Field(False, alias="continue")
    calls: list[CallSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_action(self) -> Turn:
        if (self.say is None) == (not self.continue_):
            raise ValueError("a turn needs exactly one of `say` or `continue: true`")
        return self


class ScenarioFile(Strict):
    residence: Any
    turns: list[Turn] = Field(min_length=1)


@dataclass
class LoadedTurn:
    say: Say | None
    continue_: bool
    calls: list[Call]


@dataclass
class Scenario:
    path: Path
    residence: Residence
    turns: list[LoadedTurn]


def load_scenario(path: Path, base: Path | None = None) -> Scenario:
    """Validate a scenario; named residences and policies are looked up under `base` (the working folder)."""
    base = base or Path.cwd()
    data, node = read_yaml(path)
    data = mapping(data, path, node, "scenario")
    problems: list[ConfigError] = []  # every problem of the file is reported, not only the first
    sf: ScenarioFile | None = None
    try:
        sf = validate(ScenarioFile, data, path, node)
    except ConfigError as e:
        problems.append(e)
    residence: Residence | None = None
    if "residence" in data:
        try:
            residence = _residence(data["residence"], path, node, base)
        except ConfigError as e:
            problems.append(e)
    turns = []
    for ti, t in enumerate(sf.turns if sf is not None else []):
        calls = []
        for ci, c in enumerate(t.calls):
            try:
                calls.append(_call(c, path, node, ("turns", ti, "calls", ci)))
            except ConfigError as e:
                problems.append(e)
        turns.append(LoadedTurn(t.say, t.continue_, calls))
    if problems:
        raise ConfigError.combined(problems)
    assert residence is not None
    return Scenario(path, residence, turns)


def _residence(res_data: Any, path: Path, node: Any, base: Path) -> Residence:
    """The scenario's residence: a name under residences/ or an inline mapping."""
    if isinstance(res_data, str):
        from ..config import load_residence

        try:
            return load_residence(res_data, base)
        except ConfigError as e:
            if e.message == "file not found":
                raise ConfigError(
                    path, "residence", f"no residence named {res_data!r} ({e.file})", line_of(node, ("residence",))
                ) from None
            raise
    return build_residence(res_data, path, node, base, prefix=("residence",))


def _call(c: CallSpec, path: Path, node: Any, loc: tuple) -> Call:
    if c.sse is not None:
        sse_path = (path.parent / c.sse) if not Path(c.sse).is_absolute() else Path(c.sse)
        try:
            raw = sse_path.read_bytes()
        except OSError as e:
            reason = "file not found" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror})"
            raise ConfigError(
                path, dotted(loc + ("sse",)), f"{reason}: {sse_path}", line_of(node, loc + ("sse",))
            ) from None
        return Call(sse=raw, end=c.end, headers=dict(c.headers or {}))
    return Call(status=c.status, headers=dict(c.headers or {}), body=c.body, end=c.end)
