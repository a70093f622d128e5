"""`python -m bench scale --quick` measures something real: it runs whole `residents run` processes on
SQLite and on a real PostgreSQL server against the local room and the scripted provider, prints one
table side by side, and every person's message got exactly one reply, counted from the room.

The run also asks for 2 PostgreSQL processes sharing the ledger under leases: their column carries figures
and a failover time, and no lease changed hands while the clock ran (start-up's handovers are excluded).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESIDENTS, MESSAGES, ROUNDS = 20, 40, 2  # what --quick runs
NUMBER = r"\d+\.\d"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """One quick run for the module: its table (stdout) and its figures (--json)."""
    out = tmp_path_factory.mktemp("scale") / "scale.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--quick", "--procs", "1,2", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def column(r: dict[str, Any], label: str) -> dict[str, Any]:
    [c] = [c for c in r["columns"] if c["label"] == label]
    return c


def test_the_table_puts_sqlite_and_postgresql_side_by_side(quick: tuple[str, dict[str, Any]]) -> None:
    table, r = quick
    lines = table.splitlines()
    paced = f"@ {r['rate']:g}/s"
    assert lines[0].startswith(f"scale: {RESIDENTS} residents in {RESIDENTS} channels, {MESSAGES} messages a round")
    assert lines[1].split() == ["SQLite", "1", "proc", "PG", "1", "proc", "PG", "2", "procs"]
    rows = {line[:24].strip(): line[24:] for line in lines[2:7]}
    assert list(rows) == [
        "gen/s median [range]",
        "CPU per gen, median",
        f"first post p50 {paced}",
        f"first post p99 {paced}",
        "failover (SIGKILL)",
    ]
    cells = {k: [v[i : i + 22].strip() for i in range(0, 66, 22)] for k, v in rows.items()}
    for i in (0, 1):  # SQLite 1, PG 1: figures
        assert re.fullmatch(rf"{NUMBER} \[{NUMBER}–{NUMBER}\]", cells["gen/s median [range]"][i])
        assert re.fullmatch(r"\d+\.\d ms", cells["CPU per gen, median"][i])
        assert re.fullmatch(r"\d+ ms", cells[f"first post p50 {paced}"][i])
        assert re.fullmatch(r"\d+ ms", cells[f"first post p99 {paced}"][i])
        assert cells["failover (SIGKILL)"][i] == "–"
    pg2 = [c[2] for c in cells.values()]  # two processes share the ledger: figures, and the failover's time
    assert re.fullmatch(rf"{NUMBER} \[{NUMBER}–{NUMBER}\]", pg2[0])
    assert re.fullmatch(r"\d+ ms", pg2[3])
    assert re.fullmatch(r"\d+\.\d\d s", pg2[4])


def test_every_message_got_exactly_one_reply_counted_from_the_room(quick: tuple[str, dict[str, Any]]) -> None:
    _, r = quick
    for label in ("SQLite 1 proc", "PG 1 proc"):
        c = column(r, label)
        asked = RESIDENTS + MESSAGES * ROUNDS + MESSAGES  # a warm-up mention per channel, the rounds, the paced
        assert c["replies"] == {"messages": asked, "answered_once": asked, "unanswered": 0, "other": 0}, label
        assert c["startup_s"] > 0
        assert len(c["rounds"]) == ROUNDS
        for rnd in c["rounds"]:
            # every message of the round settled one generation in the ledger; the cut ones were cut
            assert rnd["generations"] == rnd["messages"] == MESSAGES
            assert rnd["cut"] == rnd["cut_asked"] == MESSAGES // 10
            assert rnd["generations_per_s"] == pytest.approx(rnd["generations"] / rnd["wall_s"])
            assert rnd["cpu_ms_per_generation"] > 0  # the residents' processes did the work
        assert 0 < c["latency_p50_ms"] <= c["latency_p99_ms"] <= c["latency_max_ms"]
        assert 0 < c["paced_messages_per_s"] <= r["rate"] * 1.05  # posted on the schedule, never ahead of it
    pg2 = column(r, "PG 2 procs")
    assert pg2["replies"]["answered_once"] == pg2["replies"]["messages"]
    assert pg2["failover_s"] is not None and pg2["failover_s"] > 0
    # The clock started once the leases had settled: none changed hands during the rounds or the paced phase.
    assert pg2["timed_handovers"] == 0
    assert (column(r, "SQLite 1 proc")["timed_handovers"], column(r, "PG 1 proc")["timed_handovers"]) == (None, 0)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--procs", "1,two"], "--procs 1,two: write counts separated by commas, e.g. 1,2,4"),
        (["--procs", "0"], "--procs 0: every count is at least 1"),
        (["--residents", "1001"], "--residents 1001: from 1 to 1000 (one channel and one bot each)"),
        (["--rate", "0"], "--messages, --rounds: at least 1; --rate: above 0"),
    ],
)
def test_a_bad_option_is_one_line_and_status_2(
    args: list[str], line: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))  # bench/ sits beside the package, not in it
    from bench import scale

    assert scale.main(args) == 2
    assert capsys.readouterr().err.splitlines() == [f"python -m bench scale: {line}"]
