"""The verbs people type: replay (readable and JSON), check, ledger list/show/stumps, help, and their errors."""

from __future__ import annotations

import ast
import asyncio
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from residents import cli
from residents.localservers import sse

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


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda s: s.replace("sse: specimens/ceiling-1024.sse", "sse: specimens/missing.sse"), "turns[0].calls[0].sse"),
        (lambda s: s.replace("max_tokens: 1024", "max_tokens: lots"), "residence.max_tokens"),
        (lambda s: s.replace("say:", "sya:", 1), "turns[0].sya"),
        (lambda s: s.replace("standing: none", "standing: sometimes"), "residence.policy.continuation.standing"),
        (lambda s: s + "extra: 1\n", "extra"),
        (lambda s: s.replace("turns:", "turns: 3\nx:"), "turns"),
    ],
)
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


# ---------------------------------------------------------------- the click package: help, version, groups


def _console_script() -> list[str]:
    """The installed `residents` entry point of this interpreter's environment."""
    exe = Path(sys.executable).parent / "residents"
    return [str(exe)] if exe.exists() else [shutil.which("residents") or "residents"]


def run_residents(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*_console_script(), *args], cwd=cwd, capture_output=True, timeout=120)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
        out.append((prefix + (name,), cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, prefix + (name,))
    return out


def test_every_verb_and_option_has_help_and_every_verb_an_example():
    from residents.cli import cli as group

    verbs = _commands(group)
    assert {" ".join(v) for v, _ in verbs} >= {
        "replay",
        "check",
        "run",
        "room",
        "demo",
        "ledger",
        "ledger list",
        "ledger show",
        "ledger stumps",
        "ledger verify",
    }
    runner = CliRunner()
    for words, cmd in verbs:
        assert cmd.help and cmd.get_short_help_str(80).strip(), words
        for p in cmd.params:
            assert not isinstance(p, click.Option) or p.help, (words, p.name)
        result = runner.invoke(group, [*words, "--help"])
        assert result.exit_code == 0, result.output
        assert "Example:" in result.output and f"residents {' '.join(words)}" in result.output, words


def test_version_and_bare_groups_through_the_console_script(tmp_path):
    version = run_residents("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.decode().strip() == "residents 0.1.0"
    bare = run_residents("ledger", cwd=tmp_path)  # asking for the ledger verbs is not an error
    assert bare.returncode == 0 and bare.stderr == b""
    listing = bare.stdout.decode()
    for verb in ("list", "show", "stumps", "verify"):
        assert f"\n  {verb} " in listing, listing
    nothing = run_residents(cwd=tmp_path)
    assert nothing.returncode == 2 and "replay" in nothing.stderr.decode()


def _import_graph() -> dict[str, set[str]]:
    """Which bot module imports which, counting imports inside functions too (they are cycles all the same)."""
    mods: dict[str, tuple[Path, bool]] = {}
    for path in (ROOT / "residents").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (path, is_pkg) in mods.items():
        here = m.split(".") if is_pkg else m.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join((here[: len(here) - node.level + 1] if node.level else []) + [node.module or ""]).strip(
                    "."
                )
                subs = {f"{base}.{a.name}" for a in node.names} & mods.keys()
                graph[m] |= subs or ({base} & mods.keys())
        graph[m].discard(m)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return False


def test_the_cli_and_config_are_in_no_import_cycle():
    """Only the CLI (and `python -m residents`) imports the CLI; config never reaches replay, which builds on it."""
    graph = _import_graph()
    cli_modules = {m for m in graph if m == "residents.cli" or m.startswith("residents.cli.")}
    assert {
        "residents.cli.replay",
        "residents.cli.check",
        "residents.cli.ledger",
        "residents.cli.run",
        "residents.cli.room",
        "residents.cli.demo",
    } <= cli_modules
    for m, targets in graph.items():
        if m not in cli_modules and m != "residents.__main__":
            assert not targets & cli_modules, (m, targets & cli_modules)
    for m in cli_modules | {
        "residents.config",
        "residents.models",
        "residents.ledger.verify",
        "residents.replay.scenario",
    }:
        assert not any(_reaches(graph, t, m) for t in graph[m]), f"{m} is in an import cycle"
    assert not _reaches(graph, "residents.config", "residents.replay.scenario")


# ---------------------------------------------------------------- ledger stumps: newest first, paged, no text read


async def _ledger_with_stumps(path: Path, n: int) -> list[str]:
    """n stumps of one generation, one second apart (ids oldest first), written through the Ledger API."""
    from residents.ledger import Ledger
    from residents.records import Generation, Stump

    lg = await Ledger.open(path)
    try:
        g = Generation(
            id="g-000000000001",
            residence="cairn",
            channel="general",
            model="claude-3-opus-20240229",
            created_at=1_000.0,
        )
        await lg.create_generation(g)
        stumps = [
            Stump(
                id=f"s-{i:012d}",
                generation_id=g.id,
                attempt_id=None,
                cause="retry-abandoned",
                text="x" * (10 + i) + "\ud83d",
                output_tokens=None,
                created_at=1_000.0 + i,
                residence="cairn",
            )
            for i in range(n)
        ]
        await lg.add_stumps(stumps)
        return [s.id for s in stumps]
    finally:
        await lg.close()


async def test_list_stump_meta_is_newest_first_paged_and_reads_no_text(tmp_path):
    from residents.ledger import Ledger

    ids = await _ledger_with_stumps(tmp_path / "l.db", 5)
    lg = await Ledger.open(tmp_path / "l.db")
    try:
        read: list[tuple[str | None, str | None]] = []

        def watch(action: int, table: str | None, column: str | None, _db: str | None, _src: str | None) -> int:
            if action == sqlite3.SQLITE_READ:
                read.append((table, column))
            return sqlite3.SQLITE_OK

        await lg.db.set_authorizer(watch)
        first = await lg.list_stump_meta(limit=2)
        rest = await lg.list_stump_meta(limit=10, before=first[-1].id)
        assert [s.id for s in first] == ids[::-1][:2] and [s.id for s in rest] == ids[::-1][2:]
        assert [s.chars for s in first + rest] == [11 + i for i in range(5)][::-1]
        assert all(s.text == "" for s in first + rest)
        assert ("stumps", "text") not in read and ("stumps", "chars") in read
        await lg.db.set_authorizer(None)
        assert await lg.list_stump_meta(cause="max_tokens") == []
        assert [s.id for s in await lg.list_stump_meta("cairn", "retry-abandoned", limit=1)] == ids[-1:]
        assert await lg.list_stump_meta(channels=[]) == [] and await lg.list_stump_meta(channels=["dock"]) == []
        assert len(await lg.list_stump_meta(channels=["general", "dock"])) == 5
        assert await lg.list_stump_meta(before="s-doesnotexist") == []
    finally:
        await lg.close()


def test_ledger_stumps_names_a_block_stumps_type_and_index(work, capsys):
    """A reasoning block cut at the ceiling is a block stump: the listing (and the query under it,
    which reads no text) names its block's type and index, as `ledger show` does."""
    db = str(work / "l.db")
    assert cli.main(["replay", "scenarios/thinking-cut.yaml", "--db", db]) == 0
    capsys.readouterr()
    assert cli.main(["ledger", "stumps", "--db", db]) == 0
    listing = capsys.readouterr().out
    assert "thinking block #0" in listing and "None" not in listing
    assert cli.main(["ledger", "stumps", "--db", db, "--json"]) == 0
    [meta] = json.loads(capsys.readouterr().out)
    assert (meta["scope"], meta["cause"], meta["block"], meta["block_type"]) == ("block", "max_tokens", 0, "thinking")

    async def query() -> None:
        from residents.ledger import Ledger

        lg = await Ledger.open(Path(db))
        try:
            [s] = await lg.list_stump_meta("sill")
            full = await lg.get_stump(s.id)
            assert full is not None and (s.block, s.block_type) == (full.block, full.block_type) == (0, "thinking")
            assert s.text == "" and s.chars == full.chars > 0
        finally:
            await lg.close()

    asyncio.run(query())


def test_ledger_stumps_pages_newest_first_through_the_console_script(tmp_path):
    ids = asyncio.run(_ledger_with_stumps(tmp_path / "l.db", 5))
    first = run_residents("ledger", "stumps", "--db", "l.db", "--json", "--limit", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    assert [s["id"] for s in page] == [ids[4], ids[3]] and [s["chars"] for s in page] == [15, 14]
    assert first.stderr.decode().strip() == f"older stumps: residents ledger stumps --before {ids[3]}"
    last = run_residents("ledger", "stumps", "--db", "l.db", "--limit", "3", "--before", ids[3], cwd=tmp_path)
    table = last.stdout.decode().splitlines()
    assert last.returncode == 0 and last.stderr == b""
    assert [line.split()[0] for line in table] == [ids[2], ids[1], ids[0]]
    unknown = run_residents("ledger", "stumps", "--db", "l.db", "--before", "s-nope", cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stderr.decode().count("\n") == 1 and b"s-nope" in unknown.stderr


# ---------------------------------------------------------------- a residence's policy: a name under policies/


@pytest.mark.parametrize(
    "ref",
    ["../outside", "/etc/passwd", "sub/strict", "../outside.yaml", str(Path("..") / "x"), ".hidden", "..", "C:evil"],
)
def test_a_policy_reference_never_leaves_policies(work, capsys, ref):
    (work / "outside.yaml").write_text("retries: {max_attempts: 2}\n")  # a valid policy, outside policies/
    (work / "policies" / "sub").mkdir()
    (work / "policies" / "sub" / "strict.yaml").write_text("{}\n")
    text = (work / "residences" / "cairn.yaml").read_text()
    (work / "residences" / "cairn.yaml").write_text(text.replace("policy: default", f"policy: {json.dumps(ref)}"))
    assert cli.main(["check", "residences/cairn.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("residences/cairn.yaml:") and ": policy: " in err, err
    assert "not a policy name" in err


def test_a_policy_name_with_its_suffix_is_still_under_policies(work, capsys):
    (work / "default.yaml").write_text("retries: {max_attempts: lots}\n")  # would fail if read
    text = (work / "residences" / "cairn.yaml").read_text()
    (work / "residences" / "cairn.yaml").write_text(text.replace("policy: default", "policy: default.yaml"))
    assert cli.main(["check", "residences/cairn.yaml"]) == 0, capsys.readouterr().err


def test_a_policy_path_in_a_scenario_is_one_line_through_the_console_script(work):
    (work / "outside.yaml").write_text("retries: {max_attempts: 2}\n")
    src = (work / "scenarios" / "ceiling.yaml").read_text()
    (work / "scenarios" / "escape.yaml").write_text(
        src.replace(
            "policy: {continuation: {standing: none}, retries: {max_attempts: 3, backoff_seconds: 0}}",
            "policy: ../outside",
        )
    )
    p = run_residents("replay", "scenarios/escape.yaml", "--json", "--db", "x.db", cwd=work)
    err = p.stderr.decode()
    assert p.returncode == 2 and p.stdout == b"" and err.count("\n") == 1, err
    assert "escape.yaml" in err and "residence.policy" in err and not (work / "x.db").exists()


# ---------------------------------------------------------------- output stays valid UTF-8 around lone surrogates


def test_json_and_text_output_escape_a_lone_surrogate_the_ledger_keeps(work):
    text = "Half a face: \ud83d, then the rest."
    (work / "scenarios" / "lone.sse").write_bytes(sse.stream(text, "end_turn", 9))
    (work / "scenarios" / "lone.yaml").write_text(
        "residence: {name: cairn, model: claude-3-opus-20240229, max_tokens: 4096, policy: {retries: {max_attempts: 1}}}\n"
        "turns:\n  - say: {author: alice, content: hi}\n    calls: [{sse: lone.sse}]\n"
    )
    replayed = run_residents("replay", "scenarios/lone.yaml", "--json", "--db", "l.db", cwd=work)
    assert replayed.returncode == 0, replayed.stderr
    gen = json.loads(replayed.stdout.decode("utf-8"))["turns"][0]["generation"]
    assert gen["text"] == text and b"\\ud83d" in replayed.stdout

    shown = run_residents("ledger", "show", gen["id"], "--db", "l.db", "--json", cwd=work)
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout.decode("utf-8"))  # strict UTF-8: no raw surrogate on the wire
    assert record["text"] == text and record["attempts"][0]["text"] == text

    readable = run_residents("ledger", "show", gen["id"], "--db", "l.db", cwd=work)
    assert readable.returncode == 0, readable.stderr
    assert "Half a face: \ufffd, then the rest." in readable.stdout.decode("utf-8")
    transcript = run_residents("replay", "scenarios/lone.yaml", cwd=work)
    assert transcript.returncode == 0 and "\ufffd" in transcript.stdout.decode("utf-8")
