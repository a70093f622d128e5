"""Bad input, fuzzed: residence, policy and scenario files mutated at random.

Whatever a person types, `residents check` and `residents replay` answer with exit 2 and exactly one
stderr line naming the file and (where there is one) the key: never a traceback, never partial JSON
on stdout, and nothing written to the ledger. Mutations are built from valid documents and a table
of every key's type and range, so each generated document is wrong in a known way (and the test
knows which key must be named).
"""

from __future__ import annotations

import copy
import math
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from residents import cli
from residents.config import dotted
from residents.localservers import sse

ROOT = Path(__file__).resolve().parent.parent
FUZZ = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

POLICY: dict[str, Any] = {
    "description": "fuzz base",
    "continuation": {
        "standing": "bounded",
        "max_segments": 2,
        "max_output_tokens": 12288,
        "min_progress_chars": 16,
        "similarity_abort": 0.92,
        "min_overlap_chars": 8,
    },
    "retries": {"max_attempts": 3, "backoff_seconds": 0.0, "max_backoff_seconds": 30.0, "timeout_seconds": 60.0},
    "notices": {"retry_abandoned": False},
    "stumps": {
        "moderators_read_text": True,
        "resident_reads_own": False,
        "patient_tool": True,
        "default_access": "moderators",
    },
    "floor": {"reply_to": "mentions", "cooldown_seconds": 2.0, "max_resident_run": 3, "history_limit": 50},
    "tools": {"max_rounds": 4},
}
RESIDENCE: dict[str, Any] = {
    "name": "cairn",
    "model": "claude-3-opus-20240229",
    "max_tokens": 4096,
    "system": "You are Cairn.",
    "stop_sequences": ["END"],  # temperature: its own test (test_faults_provider), the SDK rejects it
    "discord": {"token_env": "CAIRN_TOKEN", "channels": ["general"]},
    "policy": POLICY,
}
SCENARIO: dict[str, Any] = {
    "residence": RESIDENCE,
    "turns": [
        {
            "say": {"author": "alice", "content": "Tell me about rivers."},
            "calls": [
                {"sse": "ok.sse", "end": "clean"},
                {
                    "status": 529,
                    "headers": {"retry-after": "0"},
                    "body": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                },
            ],
        },
        {"continue": True, "calls": []},
    ],
}

# Every key a valid document has: (path, tag, optional). Tags say which values are certainly wrong.
POLICY_LEAVES: list[tuple[tuple[Any, ...], str, bool]] = [
    (("name",), "str", False),
    (("description",), "str", False),
    (("continuation",), "map", False),
    (("continuation", "standing"), "enum:none,on-request,bounded", False),
    (("continuation", "max_segments"), "int", True),
    (("continuation", "max_output_tokens"), "int", True),
    (("continuation", "min_progress_chars"), "int", True),
    (("continuation", "similarity_abort"), "float", True),
    (("continuation", "min_overlap_chars"), "int", False),
    (("retries",), "map", False),
    (("retries", "max_attempts"), "int", False),
    (("retries", "backoff_seconds"), "float", False),
    (("retries", "max_backoff_seconds"), "float", False),
    (("retries", "timeout_seconds"), "float", False),
    (("notices",), "map", False),
    (("notices", "retry_abandoned"), "bool", False),
    (("stumps",), "map", False),
    (("stumps", "moderators_read_text"), "bool", False),
    (("stumps", "resident_reads_own"), "bool", False),
    (("stumps", "patient_tool"), "bool", False),
    (("stumps", "default_access"), "enum:moderators,private", False),
    (("tools",), "map", False),
    (("tools", "max_rounds"), "int", False),
    (("floor",), "map", False),
    (("floor", "reply_to"), "enum:mentions,mentions-and-replies,all", False),
    (("floor", "cooldown_seconds"), "float", False),
    (("floor", "max_resident_run"), "int", False),
    (("floor", "history_limit"), "int", False),
]
RESIDENCE_LEAVES: list[tuple[tuple[Any, ...], str, bool]] = [
    (("name",), "str", False),
    (("model",), "str", False),
    (("max_tokens",), "int", False),
    (("system",), "str", False),
    (("temperature",), "float", True),
    (("stop_sequences",), "list[str]", False),
    (("discord",), "map", True),
    (("discord", "token_env"), "str", False),
    (("discord", "channels"), "list[str]", False),
    (("policy",), "policy-ref", False),
] + [(("policy",) + p, tag, opt) for p, tag, opt in POLICY_LEAVES]
SCENARIO_LEAVES: list[tuple[tuple[Any, ...], str, bool]] = [
    (("residence",), "residence-ref", False),
    (("turns",), "list", False),
    (("turns", 0, "say"), "map", True),
    (("turns", 0, "say", "author"), "str", False),
    (("turns", 0, "say", "content"), "str", False),
    (("turns", 0, "calls"), "list", False),
    (("turns", 0, "calls", 0, "sse"), "file", True),
    (("turns", 0, "calls", 0, "end"), "enum:clean,drop", False),
    (("turns", 0, "calls", 1, "status"), "int", True),
    (("turns", 0, "calls", 1, "headers"), "headers", True),
    (("turns", 1, "continue"), "bool", False),
] + [(("residence",) + p, tag, opt) for p, tag, opt in RESIDENCE_LEAVES]

# Numeric keys with their bounds (lo, hi, integer?, lo excluded?), and strings with a minimum or a pattern.
BOUNDS: dict[tuple[Any, ...], tuple[float, float, bool, bool]] = {  # keyed from the residence mapping
    ("max_tokens",): (1, 4096, True, False),
    ("temperature",): (0.0, 1.0, False, False),
    ("policy", "continuation", "max_segments"): (1, 8, True, False),
    ("policy", "continuation", "max_output_tokens"): (1, 1_000_000, True, False),
    ("policy", "continuation", "min_progress_chars"): (1, 100_000, True, False),
    ("policy", "continuation", "similarity_abort"): (0.0, 1.0, False, False),
    ("policy", "continuation", "min_overlap_chars"): (1, 10_000, True, False),
    ("policy", "retries", "max_attempts"): (1, 10, True, False),
    ("policy", "retries", "backoff_seconds"): (0.0, 600.0, False, False),
    ("policy", "retries", "max_backoff_seconds"): (0.0, 3600.0, False, False),
    ("policy", "retries", "timeout_seconds"): (0.0, 3600.0, False, True),
    ("policy", "floor", "cooldown_seconds"): (0.0, 3600.0, False, False),
    ("policy", "floor", "max_resident_run"): (1, 100, True, False),
    ("policy", "floor", "history_limit"): (1, 500, True, False),
    ("policy", "tools", "max_rounds"): (2, 32, True, False),
    ("turns", 0, "calls", 1, "status"): (100, 599, True, False),
}
NONEMPTY = {
    ("name",),
    ("model",),
    ("discord", "token_env"),
    ("turns", 0, "say", "author"),
    ("turns", 0, "calls", 0, "sse"),
}
REQUIRED = {  # path → the key the error must name when it is deleted
    "residence": {
        ("name",): "name",
        ("model",): "model",
        ("max_tokens",): "max_tokens",
        ("discord", "token_env"): "discord.token_env",
        **{
            ("policy", "continuation", k): f"policy.continuation.{k}"
            for k in ("max_segments", "max_output_tokens", "min_progress_chars", "similarity_abort")
        },
    },
    "policy": {
        ("continuation", k): f"continuation.{k}"
        for k in ("max_segments", "max_output_tokens", "min_progress_chars", "similarity_abort")
    },
    "scenario": {
        ("residence",): "residence",
        ("turns",): "turns",
        ("turns", 0, "say", "author"): "turns[0].say.author",
        ("turns", 0, "say", "content"): "turns[0].say.content",
        ("turns", 0, "say"): "turns[0]",
        ("turns", 0, "calls", 0, "sse"): "turns[0].calls[0]",
        ("turns", 1, "continue"): "turns[1]",
        ("residence", "name"): "residence.name",
        ("residence", "max_tokens"): "residence.max_tokens",
    },
}
KINDS = {
    "policy": (POLICY, POLICY_LEAVES),
    "residence": (RESIDENCE, RESIDENCE_LEAVES),
    "scenario": (SCENARIO, SCENARIO_LEAVES),
}
# Keys pydantic's location filter in residents.config.first_error treats as its own tags (see the bug tests).
_TAG_LIKE = {"str", "int", "float", "bool", "dict", "list"}

# Text that looks odd but stays on one line: right-to-left marks, zero-width joiners, emoji, CJK.
ODD = st.text(
    alphabet=st.one_of(
        st.sampled_from("\u202e\u200f\u200b\u200d\ufeff👩🌊漢字é ß\t\"'{}:#&*!|>%@`-?,"),
        st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")),
    ),
    max_size=12,
)
ONE_LINE_KEY = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=12)


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def _known_keys(doc: Any) -> set[str]:
    return set(doc) | {"continue_"} if isinstance(doc, dict) else set()


def _wrong(tag: str, optional: bool) -> st.SearchStrategy[Any]:
    """Values a key with this tag certainly rejects (pydantic strict: no coercion)."""
    text, ints = st.text(max_size=6), st.integers(-(10**12), 10**12)
    floats, bools = st.floats(allow_nan=False, allow_infinity=False), st.booleans()
    lists = st.lists(st.integers(0, 9), min_size=1, max_size=3)
    maps = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9), min_size=1, max_size=2)
    none = st.nothing() if optional else st.none()
    if tag == "str":
        return st.one_of(ints, floats, bools, lists, maps, none)
    if tag == "int":
        return st.one_of(text, floats, bools, lists, maps, none)
    if tag == "float":
        return st.one_of(text, bools, lists, maps, none)
    if tag == "bool":
        return st.one_of(text, ints, floats, lists, maps, none)
    if tag.startswith("enum:"):
        choices = tag[5:].split(",")
        return st.one_of(text.filter(lambda s: s not in choices), ints, bools, lists, none)
    if tag == "list[str]":
        return st.one_of(text, ints, maps, st.lists(ints, min_size=1, max_size=2), none)
    if tag in ("map", "list"):
        other = maps if tag == "list" else lists
        return st.one_of(text, ints, bools, other, none)
    if tag == "policy-ref":
        return st.one_of(ints, bools, lists, st.none(), st.just("no-such-policy"))
    if tag == "residence-ref":
        return st.one_of(ints, bools, lists, st.just("no-such-residence"))
    if tag == "file":
        return st.one_of(ints, bools, lists, st.just("missing.sse"), st.just(""))
    if tag == "headers":
        return st.one_of(text, ints, lists, st.fixed_dictionaries({"retry-after": st.one_of(bools, lists, maps)}))
    raise AssertionError(tag)


def _out_of_range(path: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    if path in NONEMPTY:
        if path == ("name",):
            return st.one_of(st.just(""), ONE_LINE_KEY.filter(lambda s: not re.fullmatch(r"[A-Za-z0-9_.-]+", s)))
        return st.just("")
    lo, hi, integer, lo_excluded = BOUNDS[path]
    if integer:
        return st.one_of(st.integers(max_value=int(lo) - 1), st.integers(min_value=int(hi) + 1))
    below = st.floats(max_value=lo if lo_excluded else lo - 1e-9, min_value=-1e308)
    return st.one_of(below, st.floats(min_value=hi + 1e-9), st.just(math.nan))


def _relative(kind: str, path: tuple[Any, ...]) -> tuple[Any, ...]:
    """The path as BOUNDS/NONEMPTY key it: from the residence mapping, policy keys under ("policy", ...)."""
    if kind == "policy":
        return ("policy",) + path
    if kind == "scenario" and path[:1] == ("residence",):
        return path[1:]
    return path


@st.composite
def invalid_doc(draw: st.DrawFn, kind: str) -> tuple[Any, str | None]:
    """A document of `kind` that is certainly invalid, and the key its error must name (None: none)."""
    base, leaves = KINDS[kind]
    doc = copy.deepcopy(base)
    how = draw(st.sampled_from(["wrong-type", "unknown-key", "out-of-range", "missing", "not-a-mapping"]))
    if how == "wrong-type":
        path, tag, optional = draw(st.sampled_from(leaves))
        _set(doc, path, draw(_wrong(tag, optional)))
        return doc, dotted(path)
    if how == "unknown-key":
        maps = (
            [()]
            + [p for p, tag, _ in leaves if tag == "map"]
            + (
                [("turns", 0), ("turns", 1), ("turns", 0, "calls", 0), ("turns", 0, "calls", 1)]
                if kind == "scenario"
                else []
            )
        )
        if kind == "residence":
            maps.append(("policy",))
        if kind == "scenario":
            maps += [("residence",), ("residence", "policy")]
        path = draw(st.sampled_from(maps))
        target = _get(doc, path)
        key = draw(
            ONE_LINE_KEY.filter(
                lambda k: k not in _known_keys(target) and k != "<<" and "[" not in k and k not in _TAG_LIKE
            )
        )
        target[key] = draw(st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none()))
        return doc, dotted(path + (key,))
    if how == "out-of-range":
        choices = [p for p, _, _ in leaves if _relative(kind, p) in BOUNDS or _relative(kind, p) in NONEMPTY]
        path = draw(st.sampled_from(choices))
        _set(doc, path, draw(_out_of_range(_relative(kind, path))))
        return doc, dotted(path)
    if how == "missing":
        path, key = draw(st.sampled_from(sorted(REQUIRED[kind].items(), key=str)))
        del _get(doc, path[:-1])[path[-1]]
        return doc, key
    value = draw(
        st.one_of(
            st.integers(),
            st.text(min_size=1, max_size=8).filter(lambda s: s.strip()),
            st.lists(st.integers(), max_size=3),
            st.booleans(),
            st.floats(allow_nan=False),
        )
    )
    return value, None


BROKEN = [
    "key: [unclosed",
    "bad: 'unterminated",
    "@reserved: 1",
    "`backtick: 1",
    "a: b: c",
    "- item",
    "\tx: 1",
    "{bad: 1",
    "x: *undefined_alias",
]


@st.composite
def broken_yaml(draw: st.DrawFn, kind: str) -> str:
    lines = dump(KINDS[kind][0]).splitlines()
    at = draw(st.integers(0, len(lines)))
    text = "\n".join(lines[:at] + [draw(st.sampled_from(BROKEN))] + lines[at:]) + "\n"
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    assume(False)
    raise AssertionError


def dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)


# ---------------------------------------------------------------- running the CLI


class Layout:
    """A working folder with residences/, policies/ and a scenario, as `residents` expects."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("residences", "policies"):
            (root / d).mkdir(exist_ok=True)
        # The bounds above are written against Claude 3 Opus's 4,096 ceiling; the model is retired, so
        # `check` would refuse it: an operator row (no lifecycle) keeps the ceiling and lets it pass.
        (root / "residents.yaml").write_text(
            "models:\n  claude-3-opus: {family: Claude 3 Opus, output_ceiling: 4096, prefill: true}\n"
        )
        (root / "ok.sse").write_bytes(sse.stream("Rivers run to the sea.", "end_turn", 6))
        self.n = 0

    def write(self, kind: str, content: str | bytes) -> Path:
        """A fresh file for each example, where `check` tells its kind by folder (scenarios: by content)."""
        self.n += 1
        folder = {"policy": "policies", "residence": "residences", "scenario": "."}[kind]
        p = Path(folder) / f"fuzz{self.n}.yaml"
        (self.root / p).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
        return p

    def db(self) -> Path:
        return Path(f"ledger{self.n}.db")


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    monkeypatch.chdir(tmp_path)
    return Layout(tmp_path)


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_rejected(rc: int, out: str, err: str, file: Path | str, key: str | None, *, every: bool = False) -> None:
    """Exit 2, nothing on stdout, one stderr line that starts with the file and names the key.

    `every` (what `check` prints): one line per problem, each starting with the file.
    """
    assert rc == 2, (rc, out, err)
    assert out == ""
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.split("\n")[:-1]
    assert err.endswith("\n") and (every or len(lines) == 1) and "\r" not in err, f"not one line: {err!r}"
    assert all(line.startswith(str(file)) for line in lines), err
    if key:
        assert f": {key}" in err, (key, err)


def assert_no_ledger(db: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        assert not Path(str(db) + suffix).exists(), f"{db}{suffix} was written"


def _scenario_still_looks_like_one(doc: Any) -> bool:
    return isinstance(doc, dict) and "turns" in doc


# ---------------------------------------------------------------- properties


def test_base_documents_are_valid(layout: Layout, capsys: pytest.CaptureFixture[str]) -> None:
    """The mutations start from documents that pass, so every failure below is the mutation's."""
    paths = [str(layout.write(k, dump(KINDS[k][0]))) for k in ("policy", "residence", "scenario")]
    rc, out, err = run(capsys, ["check", *paths])
    assert (rc, err) == (0, "") and "3 file(s) valid" in out
    rc, out, err = run(capsys, ["replay", paths[2], "--json", "--db", "base.db"])
    assert rc == 0 and out.startswith("{")


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("kind", ["policy", "residence", "scenario"])
def test_check_rejects_each_invalid_document(
    layout: Layout, capsys: pytest.CaptureFixture[str], kind: str, data: st.DataObject
) -> None:
    doc, key = data.draw(invalid_doc(kind))
    p = layout.write(kind, dump(doc))
    rc, out, err = run(capsys, ["check", str(p)])
    looks = kind != "scenario" or _scenario_still_looks_like_one(doc)
    assert_rejected(rc, out, err, p, key if looks else None, every=True)


@FUZZ
@given(data=st.data())
def test_replay_rejects_each_invalid_scenario_and_writes_no_ledger(
    layout: Layout, capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    doc, key = data.draw(invalid_doc("scenario"))
    p = layout.write("scenario", dump(doc))
    db = layout.db()
    rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", str(db)])
    assert_rejected(rc, out, err, p, key)
    assert_no_ledger(db)


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("kind", ["policy", "residence", "scenario"])
def test_broken_yaml_is_one_line_exit_2(
    layout: Layout, capsys: pytest.CaptureFixture[str], kind: str, data: st.DataObject
) -> None:
    p = layout.write(kind, data.draw(broken_yaml(kind)))
    rc, out, err = run(capsys, ["check", str(p)])
    assert_rejected(rc, out, err, p, None, every=True)
    assert "invalid YAML" in err
    if kind == "scenario":
        db = layout.db()
        rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", str(db)])
        assert_rejected(rc, out, err, p, None)
        assert_no_ledger(db)


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("kind", ["residence", "scenario"])
def test_odd_unicode_in_any_text_value_never_breaks_the_cli(
    layout: Layout, capsys: pytest.CaptureFixture[str], kind: str, data: st.DataObject
) -> None:
    """Odd text in a string value may be valid or not; either way: exit 0, or exit 2 with one line."""
    base, leaves = KINDS[kind]
    doc = copy.deepcopy(base)
    path = data.draw(st.sampled_from([p for p, tag, _ in leaves if tag == "str"]))
    _set(doc, path, data.draw(ODD))
    p = layout.write(kind, dump(doc))
    rc, out, err = run(capsys, ["check", str(p)])
    if rc != 0:
        assert_rejected(rc, out, err, p, dotted(path), every=True)
    else:
        assert err == ""


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_traceback(layout: Layout, capsys: pytest.CaptureFixture[str], raw: bytes) -> None:
    p = layout.write("residence", raw)
    rc, out, err = run(capsys, ["check", str(p)])
    assert_rejected(rc, out, err, p, None, every=True)


# ---------------------------------------------------------------- cases by hand


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"- a\n- b\n",
        b"42\n",
        b"just text\n",
        b"\xff\xfe\x00bad utf-8",
        b"\xef\xbb\xbfname: [\n",
        "name: caf\u00e9\u202e\n".encode(),
    ],
)
def test_odd_whole_files(layout: Layout, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    for kind in ("residence", "scenario"):
        p = layout.write(kind, content)
        rc, out, err = run(capsys, ["check", str(p)])
        assert_rejected(rc, out, err, p, None, every=True)
    db = layout.db()
    rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", str(db)])
    assert_rejected(rc, out, err, p, None)
    assert_no_ledger(db)


def test_missing_files(layout: Layout, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, ["check", "residences/absent.yaml"])
    assert_rejected(rc, out, err, "residences/absent.yaml", None, every=True)
    assert "not found" in err
    rc, out, err = run(capsys, ["replay", "absent.yaml", "--json", "--db", "x.db"])
    assert_rejected(rc, out, err, "absent.yaml", None)
    assert_no_ledger(Path("x.db"))
    doc = copy.deepcopy(SCENARIO)
    doc["residence"] = "absent"
    p = layout.write("scenario", dump(doc))
    rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", "y.db"])
    assert_rejected(rc, out, err, p, "residence")
    assert_no_ledger(Path("y.db"))


def test_named_residence_with_a_bad_policy_names_the_policy_file(
    layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    (layout.root / "policies" / "p.yaml").write_text("retries:\n  max_attempts: 0\n")
    res = {k: v for k, v in RESIDENCE.items() if k != "policy"} | {"policy": "p"}
    (layout.root / "residences" / "r.yaml").write_text(dump(res))
    doc = copy.deepcopy(SCENARIO)
    doc["residence"] = "r"
    p = layout.write("scenario", dump(doc))
    rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", "z.db"])
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "p.yaml" in err and "retries.max_attempts" in err
    assert_no_ledger(Path("z.db"))


def test_invalid_scenario_leaves_an_existing_ledger_untouched(
    layout: Layout, capsys: pytest.CaptureFixture[str]
) -> None:
    good = layout.write("scenario", dump(SCENARIO))
    assert run(capsys, ["replay", str(good), "--json", "--db", "l.db"])[0] == 0
    before = _counts(Path("l.db"))
    assert before["generations"] == 1
    bad = copy.deepcopy(SCENARIO)
    bad["turns"][1]["calls"] = [{"status": "529"}]
    p = layout.write("scenario", dump(bad))
    rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", "l.db"])
    assert_rejected(rc, out, err, p, "turns[1].calls[0].status")
    assert _counts(Path("l.db")) == before


def _counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        return {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("generations", "attempts", "attempt_chunks", "segments", "stumps", "posts")
        }
    finally:
        con.close()


def test_real_subprocess_replay_exits_2_with_one_line(layout: Layout) -> None:
    """The installed entry point, as a person runs it: exit 2, one line, no ledger."""
    doc = copy.deepcopy(SCENARIO)
    doc["residence"]["policy"]["retries"]["max_attempts"] = 99
    p = layout.write("scenario", dump(doc))
    argv = [sys.executable, "-m", "residents", "replay", str(p), "--json", "--db", "sub.db"]
    proc = subprocess.run(
        argv,
        cwd=layout.root,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert_rejected(proc.returncode, proc.stdout, proc.stderr, p, "residence.policy.retries.max_attempts")
    assert_no_ledger(layout.root / "sub.db")


def test_real_subprocess_broken_yaml(layout: Layout) -> None:
    p = layout.write("residence", "name: [cairn\nmodel: x\n")
    proc = subprocess.run(
        [sys.executable, "-m", "residents", "check", str(p)],
        cwd=layout.root,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert_rejected(proc.returncode, proc.stdout, proc.stderr, p, None)


# ---------------------------------------------------------------- found by fuzzing (bugs in residents/config.py)


@pytest.mark.parametrize("kind", ["residence", "scenario"])
def test_deeply_nested_yaml_is_bad_input_not_an_internal_error(
    layout: Layout, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """PyYAML's composer recurses per level; a deep document must still be exit 2, not RecursionError."""
    p = layout.write(kind, "a: " + "[" * 2000 + "]" * 2000 + "\n")
    rc, out, err = run(capsys, ["check", str(p)])
    assert_rejected(rc, out, err, p, None, every=True)
    db = layout.db()
    rc, out, err = run(capsys, ["replay", str(p), "--json", "--db", str(db)])
    assert_rejected(rc, out, err, p, None)
    assert_no_ledger(db)


@pytest.mark.parametrize(
    "doc,key",
    [
        ({**RESIDENCE, "bad\nkey": 1}, "bad\\nkey"),
        ({**RESIDENCE, "policy": "no\nsuch"}, "policy"),
        ({**RESIDENCE, "odd\u2028key": 1}, "odd\\u2028key"),
    ],
)
def test_line_breaks_in_keys_and_names_stay_on_one_line(
    layout: Layout, capsys: pytest.CaptureFixture[str], doc: dict[str, Any], key: str
) -> None:
    """A key or a referenced name with a line break must not split the one error line in two."""
    p = layout.write("residence", dump(doc))
    rc, out, err = run(capsys, ["check", str(p)])
    assert_rejected(rc, out, err, p, key, every=True)
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("key", ["list", "str", "x[0]", "function-after[a]"])
def test_unknown_key_that_looks_like_a_pydantic_tag_is_still_named(
    layout: Layout, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    p = layout.write("residence", dump({**RESIDENCE, key: 1}))
    rc, out, err = run(capsys, ["check", str(p)])
    assert_rejected(rc, out, err, p, key, every=True)
    assert "unknown key" in err
