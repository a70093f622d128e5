"""The ledger at scale: build a realistic ledger of N generations fast, then time the reads people and
start-up make on it, and `ledger verify` (time, rate, peak memory).

`python -m bench ledger-scale --generations 1000000 --db /tmp/big.db` (the default run of `python -m
bench` takes 100,000). The ledger is written through the real schema (migrations applied by
`Ledger.open`) with the statements the Ledger itself writes (`Ledger._generation_insert`,
`_attempt_settle`, ...), the posts the delivery planner plans, and a chain whose entries are the
chain module's own, hashed here in bulk: `residents ledger verify` passes on it. What goes in:

- several residences in several guilds' channels, each generation one turn of a channel whose
  request carries that channel's last 50 room lines (`history_limit`'s default), as `compile` does;
- the field's proportions (assumed, from the issue's replays): 7% of outputs cut at `max_tokens`
  (partial posts, a receipt, an output stump), 4% with an attempt abandoned and retried (a
  retry-abandoned stump), the rest completed in one attempt; every post delivered;
- at the end, as a crash leaves it: a few generations still pending with an attempt streaming, and
  a few posts not yet delivered.

Each read is timed as the median of several runs of the Ledger method (or module function) that
start-up, the CLI, the moderation cog and the context compiler call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

from residents.delivery.plan import plan
from residents.ledger import Ledger, appending, chain
from residents.ledger.access import own_stumps
from residents.ledger.connection import sqlite_session
from residents.ledger.requests import Part
from residents.records import Attempt, Generation, Post, Segment, Stump, new_id, numbered
from residents.truth import RETRY_ABANDONED, stump_cause

CUT_SHARE = 0.07
RETRY_SHARE = 0.04
WINDOW = 50  # room lines in each request: history_limit's default
RESIDENCES = ("cairn", "sill", "moss", "tarn")
GUILDS = {"g1": ("c11", "c12", "c13"), "g2": ("c21", "c22"), "g3": ("c31", "c32", "c33", "c34")}
PENDING = 3  # generations a crash left pending, at the end
UNDELIVERED = 4  # posts a crash left undelivered, at the end
WORDS = (
    "the river runs past the old mill and the light on the water is cold and clear in the morning while "
    "a heron waits by the reeds for something to move and nobody says much about the weather any more"
).split()


def _texts(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(200_000))


def _id(rng: random.Random, prefix: str) -> str:
    """Ids as the project makes them (`records.new_id`: time first), so records made together sit together."""
    return new_id(prefix)


def build(path: str, n: int, seed: int = 1, batch: int = 5_000) -> dict[str, Any]:
    """Write a ledger of `n` generations to `path` (a new file); returns what went in and how long it took."""
    if os.path.exists(path):
        raise SystemExit(f"{path}: exists; ledger-scale builds a new ledger (remove it or name another)")
    t0 = time.perf_counter()

    async def migrate() -> None:
        async with Ledger.open(path):
            pass

    asyncio.run(migrate())
    rng = random.Random(seed)
    corpus = _texts(rng)
    conn = sqlite_session(path)  # the ledger's statements: `$n` parameters, bound by number
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-200000")
    channels = [(g, c) for g, cs in GUILDS.items() for c in cs]
    windows: dict[str, deque[tuple[str, str]]] = {c: deque(maxlen=WINDOW) for _, c in channels}
    memo: dict[str, Part] = {}
    stored_parts: set[int] = set()
    seq, prev = 0, chain.GENESIS_PREV
    message = 10**17
    counts = {"generations": 0, "attempts": 0, "stumps": 0, "posts": 0, "chain": 0, "cut": 0, "retried": 0}
    start = time.time() - n * 30.0
    pending_from = n - PENDING

    def text_of(lo: int, hi: int) -> str:
        size = rng.randint(lo, hi)
        at = rng.randrange(0, len(corpus) - size)
        return corpus[at : at + size].strip() or "ok"

    for first in range(0, n, batch):
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        entries: list[tuple[str, str | None, dict[str, Any]]] = []
        deliveries: list[tuple[Post, str]] = []
        for i in range(first, min(n, first + batch)):
            _guild, channel = channels[rng.randrange(len(channels))]
            residence = RESIDENCES[i % len(RESIDENCES)]
            at = start + i * 30.0
            said = f"person{rng.randrange(40)}: {text_of(40, 300)}"
            window = windows[channel]
            window.append(("user", said))
            message += 1
            request = {
                "model": "claude-sonnet-4-6",
                "max_tokens": 1024,
                "system": f"You are {residence}, a resident of this room.",
                "messages": [{"role": r, "content": t} for r, t in window],
            }
            g = Generation(
                id=_id(rng, "g-"),
                residence=residence,
                channel=channel,
                model="claude-sonnet-4-6",
                trigger=str(message),
                seen_upto=str(message),
                request=request,
                created_at=at,
            )
            for st in Ledger._generation_insert(g, memo):  # each part once per build, as the ledger keeps it
                if st[0] == Ledger.PART_INSERT:
                    if st[1][0] in stored_parts:
                        continue
                    stored_parts.add(st[1][0])
                stmts.append(st)
            counts["generations"] += 1
            if i >= pending_from:  # a crash: still pending, its attempt streaming with what reached disk
                a = Attempt(id=_id(rng, "a-"), generation_id=g.id, segment=1, index=1, started_at=at)
                stmts.append(
                    (
                        "INSERT INTO attempts (id, generation_id, segment, idx, outcome, started_at) VALUES ($1,$2,$3,$4,$5,$6)",
                        (a.id, a.generation_id, a.segment, a.index, a.outcome, a.started_at),
                    )
                )
                stmts.append((Ledger._CHUNK, (a.id, 0, 0, "text", text_of(50, 400).encode(), None)))
                counts["attempts"] += 1
                continue
            cut = rng.random() < CUT_SHARE
            retried = rng.random() < RETRY_SHARE
            attempts: list[Attempt] = []
            stumps: list[Stump] = []
            if retried:
                a0 = Attempt(id=_id(rng, "a-"), generation_id=g.id, segment=1, index=1, started_at=at)
                a0.text, a0.outcome, a0.discard_reason, a0.ended_at = (
                    text_of(20, 600),
                    "abandoned",
                    RETRY_ABANDONED,
                    at + 2,
                )
                a0.error = "overloaded_error"
                attempts.append(a0)
            a = Attempt(id=_id(rng, "a-"), generation_id=g.id, segment=1, index=len(attempts) + 1, started_at=at + 3)
            a.text = text_of(2500, 4500) if cut else text_of(60, 900)
            a.outcome, a.stop_reason = ("truncated", "max_tokens") if cut else ("completed", "end_turn")
            a.output_tokens, a.ended_at = len(a.text) // 4, at + 9
            if retried:
                attempts[0].replaced_by = a.id
                stumps.append(
                    Stump(
                        id=_id(rng, "s-"),
                        generation_id=g.id,
                        attempt_id=attempts[0].id,
                        cause=RETRY_ABANDONED,
                        text=attempts[0].text,
                        output_tokens=None,
                        replaced_by=a.id,
                        created_at=at + 2,
                        residence=residence,
                    )
                )
            attempts.append(a)
            g.attempts = attempts
            g.text, g.status, g.stop_reason, g.output_tokens = a.text, a.outcome, a.stop_reason, a.output_tokens
            g.segments = [Segment(1, a.id, a.stop_reason, len(a.text), a.output_tokens)]
            g.finished_at = at + 9
            cause = stump_cause(g.status, g.stop_reason)
            if cause is not None:
                stumps.append(
                    Stump(
                        id=_id(rng, "s-"),
                        generation_id=g.id,
                        attempt_id=a.id,
                        cause=cause,
                        text=g.text,
                        output_tokens=g.output_tokens,
                        scope="output",
                        # published when a text post of it is delivered: m008's trigger marks it, as for
                        # the ledger (the last few posts stay undelivered, and so may their stump)
                        created_at=at + 9,
                        residence=residence,
                    )
                )
            counts["cut"] += cut
            counts["retried"] += retried
            for x in attempts:
                stmts.append(
                    (
                        "INSERT INTO attempts (id, generation_id, segment, idx, outcome, started_at) VALUES ($1,$2,$3,$4,$5,$6)",
                        (x.id, x.generation_id, x.segment, x.index, "streaming", x.started_at),
                    )
                )
                stmts += [st for st in Ledger._attempt_settle(x) if st[0] != appending.APPEND and "DELETE" not in st[0]]
                entries.append(("attempt", x.id, chain.attempt_payload(x)))
            stmts += [st for st in Ledger._generation_settle(g) if "DELETE" not in st[0]]
            entries.append(("generation", g.id, chain.generation_payload(g)))
            stmts += [Ledger._stump_insert(s) for s in stumps]
            entries += [("stump", s.id, chain.stump_payload(s)) for s in stumps]
            posts = numbered(plan(g.ending(), g.text), g.id, channel, 1)
            stmts += [Ledger._post_insert(p) for p in posts]
            entries += [("post", p.id, chain.post_payload(p)) for p in posts]
            for p in posts:
                message += 1
                if i < n - 1 or len(deliveries) < len(posts) - UNDELIVERED:
                    deliveries.append((p, str(message)))
            window.append(("assistant", g.text))
            counts["attempts"] += len(attempts)
            counts["stumps"] += len(stumps)
            counts["posts"] += len(posts)
        if first + batch >= n:  # the last few posts of the ledger wait for delivery, as after a crash
            deliveries = deliveries[: max(0, len(deliveries) - UNDELIVERED)]
        for p, mid in deliveries:
            stmts.append(("UPDATE posts SET message_id=$1, delivered_at=$2 WHERE id=$3", (mid, time.time(), p.id)))
            entries.append(("delivered", p.id, chain.delivered_payload(p.id, mid)))
        rows = []
        for kind, record, payload in entries:
            seq += 1
            body = appending.append(kind, record, payload)[1][2]
            digest = chain.entry_hash(seq, prev, body)
            rows.append((seq, kind, record, prev, body, digest))
            prev = digest
        counts["chain"] += len(rows)
        by_sql: dict[str, list[tuple[Any, ...]]] = {}  # each statement in bulk, in the order first written
        for sql, params in stmts:
            by_sql.setdefault(sql, []).append(params)
        conn.execute("BEGIN")
        for sql, rows_ in by_sql.items():
            conn.executemany(sql, rows_)
        conn.executemany("INSERT INTO chain (seq, kind, record, prev, body, hash) VALUES ($1,$2,$3,$4,$5,$6)", rows)
        conn.execute("COMMIT")
        if len(memo) > 200_000:
            memo.clear()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {**counts, "build_s": time.perf_counter() - t0, "db_bytes": os.path.getsize(path)}


async def _reads(path: str, rounds: int) -> dict[str, dict[str, float]]:
    """Median milliseconds (wall and CPU) of each read people and start-up make, the ledger already open
    as in a running process (the first round reads cold pages; the median is of warm ones)."""
    from residents.context.compile import RoomMessage, ledger_message_ids, own_generation_ids
    from residents.ledger import live

    async with Ledger.open(path) as lg:
        last = list(
            await lg.db.execute_fetchall(
                "SELECT g.residence, g.channel FROM generations g ORDER BY created_at DESC LIMIT 1 OFFSET 10"
            )
        )[0]
        residence, channel = last[0], last[1]
        delivered = [
            r[0]
            for r in await lg.db.execute_fetchall(
                "SELECT p.message_id FROM posts p CROSS JOIN generations g ON g.id = p.generation_id WHERE g.channel=$1"
                " AND p.message_id IS NOT NULL ORDER BY g.created_at DESC LIMIT 60",
                (channel,),
            )
        ]

        async def compile_reads() -> None:  # what Resident._context reads for one turn: posts, then generations
            history = [RoomMessage(m, "cairn", True, "") for m in delivered]
            posts = await lg.posts_by_message(ledger_message_ids(history))
            await lg.generations_brief(own_generation_ids(history, posts))

        async def settle() -> None:  # bot.generation.recovery and bot.delivery.resume at start-up
            await lg.unsettled_generations()
            await lg.streaming_generations()
            await lg.generations_without_posts()

        reads = {
            "ledger_list": lambda: lg.list_generations(None, 20),
            "ledger_list_residence": lambda: lg.list_generations(residence, 20),
            "ledger_stumps": lambda: lg.list_stump_meta(None, None, limit=51),
            "ledger_stumps_cause": lambda: lg.list_stump_meta(None, "max_tokens", limit=51),
            "stumps_list_cog": lambda: lg.list_stump_meta(None, None, limit=11, channels=GUILDS["g2"]),
            "stumps_tool": lambda: own_stumps(lg, residence, channel, 20),
            "undelivered_posts": lambda: lg.undelivered_posts_of(residence),
            "crash_settlement": settle,
            "live_left_in_progress": lambda: live.in_progress(lg, residence),
            "compile_context": compile_reads,
            "latest_generation": lambda: lg.latest_generation(residence, channel),
        }
        out: dict[str, dict[str, float]] = {}
        for name, fn in reads.items():
            walls, cpus = [], []
            for _ in range(rounds):
                t, c = time.perf_counter(), time.process_time()
                await fn()
                walls.append((time.perf_counter() - t) * 1e3)
                cpus.append((time.process_time() - c) * 1e3)  # the ledger's thread included
            out[name] = {
                "wall_ms": statistics.median(walls),
                "cpu_ms": statistics.median(cpus),
                "max_wall_ms": max(walls),
            }
        return out


def verify(path: str) -> dict[str, Any]:
    """`residents ledger verify` as a whole process: its time, CPU and peak RSS (the kernel's high-water
    mark of that process, read until it ends: a forked child's rusage would count this process too), and
    the highest of the processes it starts (a worker sharing the check of a long ledger,
    `verify.PARALLEL_FROM`, and multiprocessing's resource tracker), and every process's peak summed.
    CPU is theirs and its own together."""
    exe = os.path.join(os.path.dirname(sys.executable), "residents")
    said = tempfile.TemporaryFile()  # (a pipe read only at the end would stop a ledger of many lines)
    t = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen([exe, "ledger", "verify", "--db", path], stdout=said, stderr=subprocess.STDOUT)
    peak_kib = 0
    workers: dict[int, int] = {}  # pid -> its VmHWM
    while True:
        peak_kib = max(peak_kib, _hwm_kib(proc.pid))
        for pid in _children(proc.pid):
            workers[pid] = max(workers.get(pid, 0), _hwm_kib(pid))
        try:
            proc.wait(timeout=0.05)  # (within a few ms of its end; the empty ledger's runs wait alike)
            break
        except subprocess.TimeoutExpired:
            continue
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    said.seek(0)
    lines = said.read().decode(errors="replace").strip().splitlines()
    said.close()
    return {
        "ok": proc.returncode == 0,
        "output": lines[-1:],
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "peak_rss_mib": peak_kib / 1024,
        "workers": len(workers),
        "worker_peak_rss_mib": max(workers.values(), default=0) / 1024,
        "total_peak_rss_mib": (peak_kib + sum(workers.values())) / 1024,
    }


def _hwm_kib(pid: int) -> int:
    """A process's peak RSS so far (`VmHWM`), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (read from /proc: the kernel's children file is not always there)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", encoding="ascii", errors="replace") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


VERIFY_RUNS = 5
TARGET = 10_000  # generations checked a second at 1,000,000 on 2 cores (issue 26)


def run(path: str, n: int, rounds: int = 9, check: bool = True, runs: int = VERIFY_RUNS) -> dict[str, Any]:
    built = build(path, n)
    r: dict[str, Any] = {"generations": n, "built": built, "reads_ms": asyncio.run(_reads(path, rounds))}
    r["bytes_per_generation"] = built["db_bytes"] / n
    if check:
        r["verify"] = verify_runs(path, n, runs)
    return r


def verify_runs(path: str, n: int, runs: int = VERIFY_RUNS) -> dict[str, Any]:
    """`verify` timed `runs` times (a shared machine's speed varies from one run to the next): the
    median run's figures, the range of the wall times, and the highest peak memory of any run.

    Each run is paired with one on an empty ledger (the same command, the interpreter's start, its
    imports and the ledger's opening, and nothing to check): the check's own rate is the generations
    over the difference, start-up excluded as in every other figure here; the whole process's rate is
    given beside it."""
    speed = [_reference()]
    got, idle = [], []
    with tempfile.TemporaryDirectory() as where:
        empty = os.path.join(where, "empty.db")
        asyncio.run(_create(empty))
        for _ in range(runs):
            start_run = verify(empty)
            if not start_run["ok"]:
                raise SystemExit(f"verify on an empty ledger failed: {' '.join(start_run['output'])}")
            idle.append(start_run["wall_s"])
            got.append(verify(path))
            speed.append(_reference())
    start = statistics.median(idle)
    walls = sorted(g["wall_s"] for g in got)
    v = dict(sorted(got, key=lambda g: g["wall_s"])[len(got) // 2])
    v.update(
        ok=all(g["ok"] for g in got),
        runs=len(got),
        wall_min_s=walls[0],
        wall_max_s=walls[-1],
        cpu_s=statistics.median(g["cpu_s"] for g in got),
        peak_rss_mib=max(g["peak_rss_mib"] for g in got),
        worker_peak_rss_mib=max(g["worker_peak_rss_mib"] for g in got),
        total_peak_rss_mib=max(g["total_peak_rss_mib"] for g in got),
        start_s=start,
    )
    # (a ledger checked in about the time the interpreter takes to start has no rate of its own to give)
    v["generations_per_s"] = n / (v["wall_s"] - start) if v["wall_s"] > 2 * start else None
    v["generations_per_s_range"] = [n / (w - start) if w > 2 * start else None for w in (walls[-1], walls[0])]
    v["generations_per_s_whole"] = n / v["wall_s"]
    v["generations_per_cpu_s"] = n / max(v["cpu_s"], 1e-9)
    v["reference_s"] = statistics.median(speed)
    return v


async def _create(path: str) -> None:
    """An empty ledger, migrated (what `verify` opens on a fresh install)."""
    async with Ledger.open(path):
        pass


def _reference() -> float:
    """The machine's speed just then: CPU seconds of a fixed pure-Python loop (a shared VM's speed has
    been seen to vary by half within an hour; this says which speed a figure was measured at)."""
    t = time.process_time()
    x = 0
    for i in range(5_000_000):
        x += i
    return time.process_time() - t


def at_scale(n: int) -> dict[str, Any]:
    """The default run's figure: a ledger of `n` generations built in a scratch folder, measured, removed."""
    import shutil

    from .common import scratch

    where = scratch("ledger-scale")
    try:
        return run(os.path.join(where, "ledger.db"), n)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def table(r: dict[str, Any]) -> str:
    b = r["built"]
    lines = [
        f"ledger at {r['generations']:,} generations: built in {b['build_s']:.0f} s, "
        f"{b['db_bytes'] / 2**20:,.0f} MiB ({r['bytes_per_generation'] / 1024:.1f} KiB a generation); "
        f"{b['attempts']:,} attempts, {b['stumps']:,} stumps, {b['posts']:,} posts, {b['chain']:,} chain entries",
        "   reads, median ms wall/cpu: "
        + ", ".join(f"{k} {v['wall_ms']:.2f}/{v['cpu_ms']:.2f}" for k, v in r["reads_ms"].items()),
    ]
    if r.get("verify"):
        lines.append(verify_line(r["verify"]))
    return "\n".join(lines)


def verify_line(v: dict[str, Any]) -> str:
    low, high = (f"{r:,.0f}" if r is not None else "n/a" for r in v["generations_per_s_range"])
    rate = v["generations_per_s"]
    checked = (
        f"{rate:,.0f} generations/s checked ({low}–{high}; {v['generations_per_s_whole']:,.0f}/s whole process);"
        f" target {TARGET:,}/s {'met' if rate >= TARGET else 'MISSED'}"
        if rate is not None
        else f"too short beside start-up for a rate of its own ({v['generations_per_s_whole']:,.0f}/s whole process)"
    )
    return (
        f"   ledger verify: {'ok, the ledger verifies clean' if v['ok'] else 'FAILED: ' + ' '.join(v['output'])};"
        f" median of {v['runs']} runs"
        f" {v['wall_s']:.1f} s (range {v['wall_min_s']:.1f}–{v['wall_max_s']:.1f}), of which start-up"
        f" {v['start_s']:.2f} s (an empty ledger's run): {checked};"
        f" CPU {v['cpu_s']:.1f} s ({v['generations_per_cpu_s']:,.0f}/s of CPU); peak RSS {v['peak_rss_mib']:.0f} MiB"
        + (
            f" (+ {v['workers']} child process(es), each ≤ {v['worker_peak_rss_mib']:.0f} MiB;"
            f" every process's peak summed {v['total_peak_rss_mib']:.0f} MiB)"
            if v["workers"]
            else ""
        )
        + f"; machine reference {v['reference_s'] * 1000:.0f} ms (5,000,000 Python additions, CPU; median around the runs)"
    )


def main(argv: list[str]) -> int:
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m bench ledger-scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--generations", type=int, default=100_000, help="how many generations (default 100,000)")
    p.add_argument("--db", required=True, help="the ledger file to build (must not exist)")
    p.add_argument("--no-verify", action="store_true", help="skip timing `residents ledger verify`")
    p.add_argument("--verify-only", action="store_true", help="only time `verify` on the existing ledger --db")
    p.add_argument("--runs", type=int, default=VERIFY_RUNS, help=f"times `verify` is run (default {VERIFY_RUNS})")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    if a.verify_only:
        if not os.path.exists(a.db):
            raise SystemExit(f"{a.db}: no ledger there to verify (build one first: drop --verify-only)")
        with contextlib.closing(sqlite3.connect(a.db)) as conn:
            n = conn.execute("SELECT count(*) FROM generations").fetchone()[0]
        v = verify_runs(a.db, n, a.runs)
        print(json.dumps(v, indent=1) if a.json else verify_line(v))
        return 0 if v["ok"] else 1
    r = run(a.db, a.generations, check=not a.no_verify, runs=a.runs)
    print(json.dumps(r, indent=1) if a.json else table(r))
    return 0 if r.get("verify", {"ok": True})["ok"] else 1  # a ledger that fails verify is no measure
