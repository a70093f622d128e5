"""`python -m bench`: every benchmark in one run, a table on stdout, figures in bench/results.json and
the scaling plot in bench/scaling.png. Sections run one after another so they do not disturb each other;
the concurrency section runs in a child process so its peak memory is its own.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

from . import e2e, ledger_scale, ledger_writes, live, memory, overhead, plot, scale, scaling
from .common import HERE, ROOT, machine

log = logging.getLogger(__name__)

TARGET = 1.10
PROCESS_TARGET = 1.05  # per-stream CPU of `residents replay` against the bare SDK (issue 15, target 1)
BIG_CHARS, TINY_CHARS = 2_000_000, 64  # the whole-process streams: per-stream cost is big minus tiny
LINEAR = 1.15  # the largest log–log exponent of time against size still called linear


def _concurrency(n: int, tokens: int, pace: float | None, stall: float = 0.0) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.concurrency", str(n), str(tokens)] + ([str(pace)] if pace else [])
    cmd += [str(stall)] if stall else []
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"bench.concurrency failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run(quick: bool) -> dict[str, Any]:
    r: dict[str, Any] = {"machine": machine(), "started": datetime.datetime.now().isoformat(timespec="seconds")}
    t0 = time.perf_counter()
    k = 1 if quick else 0  # --quick: fewer rounds and smaller loads, for a smoke run
    log.info("1/8 overhead in one process")
    r["overhead"] = asyncio.run(
        overhead.in_process({"4k": (4096, 3 if k else 20, True), "128k": (128_000, 1 if k else 5, False)})
    )
    log.info("1/8 overhead as whole processes, per stream")
    r["process"] = overhead.processes(BIG_CHARS // 8 if k else BIG_CHARS, TINY_CHARS, 2 if k else 5)
    log.info("2/8 scaling")
    r["scaling"] = scaling.run()
    log.info("3/8 concurrency (paced, then with stalls)")
    n = 10 if k else 100
    r["concurrency"] = {
        "saturated": _concurrency(n, 4096, None),
        "paced": _concurrency(n, 320, 64.0),
        "stalls": _concurrency(n, 320, 64.0, 3.0),  # each stream stalls once, for up to 3 s
    }
    log.info("4/8 ledger writes")
    r["ledger"] = asyncio.run(ledger_writes.run(200 if k else 1000))
    log.info("5/8 first visible text, live and not")
    r["live"] = asyncio.run(live.run(rounds=1 if k else 3))
    log.info("6/8 the ledger at scale (1,000,000 on demand: python -m bench ledger-scale)")
    r["ledger_scale"] = ledger_scale.at_scale(10_000 if k else 100_000)
    log.info("7/8 memory: residents run idle, and with 100 generations of 16 KB in flight")
    r["memory"] = asyncio.run(memory.run())
    log.info("8/8 end to end: a person's message to the first post, against bare SDK + one POST")
    r["e2e"] = asyncio.run(e2e.run(rounds=3 if k else 7))
    r["targets"] = {"overhead_max_ratio": TARGET, "process_max_ratio": PROCESS_TARGET, "linear_max_exponent": LINEAR}
    for label, v in r["overhead"].items():
        r["targets"][f"overhead_{label}_cpu_met"] = v["cpu_ratio"] <= TARGET
        r["targets"][f"overhead_{label}_wall_met"] = v["wall_ratio"] <= TARGET
    r["targets"]["process_per_stream_cpu_met"] = r["process"]["cpu_ratio"] <= PROCESS_TARGET
    r["targets"]["scaling_linear"] = all(
        b <= LINEAR for key, b in r["scaling"]["exponent"].items() if not key.startswith("naive")
    )
    r["duration_s"] = time.perf_counter() - t0
    return r


def table(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        f"residents bench · {m['nproc']}× {m['cpu']} · Python {m['python']} · load {m['load_avg_1min_at_start']}"
        f" · {r['duration_s']:.0f} s",
        "",
    ]
    lines.append(
        "1. overhead vs bare SDK (medians)   bare wall/cpu      pipeline wall/cpu   ratio wall/cpu (paired) [of minima]"
    )
    for label, v in r["overhead"].items():
        lines.append(
            f"   in-process {label:<5} x{v['rounds']:<2}          {v['bare_wall_s'] * 1e3:7.1f}/{v['bare_cpu_s'] * 1e3:7.1f} ms"
            f"  {v['pipeline_wall_s'] * 1e3:7.1f}/{v['pipeline_cpu_s'] * 1e3:7.1f} ms"
            f"  {v['wall_ratio']:.3f}/{v['cpu_ratio']:.3f} ({v['wall_ratio_paired']:.3f}/{v['cpu_ratio_paired']:.3f})"
            f" [{v['wall_ratio_of_minima']:.3f}/{v['cpu_ratio_of_minima']:.3f}]"
        )
    for name, v in r["overhead"]["4k"].get("layers", {}).items():
        lines.append(
            f"      4k layer {name:<38} cpu median {v['cpu_ms']:5.1f} ms {v['cpu_ratio']:.3f}×,"
            f" min {v['cpu_min_ms']:5.1f} ms {v['cpu_ratio_of_minima']:.3f}×"
        )
    p = r["process"]

    def rng(x: dict[str, float], scale: float = 1.0, fmt: str = ".3f") -> str:
        return f"{x['median'] * scale:{fmt}} ({x['min'] * scale:{fmt}}–{x['max'] * scale:{fmt}})"

    lines.append(
        f"   per stream, whole processes ({p['big_chars']:,} chars less {p['tiny_chars']} chars, x{p['rounds']},"
        f" CPU, median (range))"
    )
    for side in ("bare", "replay", "floor"):
        lines.append(f"      {side:<8} {rng(p[side]['per_stream_cpu_s'], 1e3, ',.0f')} ms")
    lines.append(
        f"      replay / bare {p['cpu_ratio']:.3f} (paired {rng(p['cpu_ratio_paired'])});"
        f" above the floor, paired {rng(p['cpu_ratio_above_floor_paired'])}"
    )
    lines += ["", "2. scaling, µs per KB    size   find_overlap  similarity  split_text  naive overlap"]
    for row in r["scaling"]["rows"]:
        naive = f"{row['naive_overlap_us_per_kb']:12.0f}" if "naive_overlap_us_per_kb" in row else "           –"
        lines.append(
            f"   {row['size_bytes'] // 1024:>23} KB {row['overlap_us_per_kb']:10.1f} {row['similarity_us_per_kb']:11.2f}"
            f" {row['split_us_per_kb']:11.2f} {naive}"
        )
    e = r["scaling"]["exponent"]
    lines.append(
        f"   exponent b (time ∝ size^b): overlap {e['overlap_us_per_kb']:.2f}, similarity "
        f"{e['similarity_us_per_kb']:.2f}, split {e['split_us_per_kb']:.2f}, naive {e['naive_overlap_us_per_kb']:.2f}"
        f" (to {r['scaling']['naive_largest_bytes'] // 1024} KB); split of 2 MB: {r['scaling']['split_2mb_ms']:.1f} ms"
    )
    lines += [
        "",
        "3. concurrency             gens  tokens each  wall s  gens/s  deltas/s  flush delay p50/p99 ms  peak RSS (growth) MiB",
    ]
    for label, c in r["concurrency"].items():
        pace = f"@{c['pace_tokens_per_s']:.0f} tok/s" if c["pace_tokens_per_s"] else "unpaced"
        lines.append(
            f"   {label:<9} {pace:<12} {c['generations']:>4} {c['tokens_each']:>12} {c['wall_s']:7.2f} "
            f"{c['generations_per_s']:7.1f} {c['deltas_per_s']:9.0f}  {c['flush_delay_p50_ms']:9.0f}/{c['flush_delay_p99_ms']:.0f}"
            f"            {c['peak_rss_mib']:.0f} ({c['peak_rss_growth_mib']:.0f})"
        )
    lines.append("   (stalls: every paced stream goes silent once, for up to 3 s; target: p99 ≤ 250 ms)")
    lr = r["ledger"]["records"]
    lines += [
        "",
        "4. ledger (WAL, sustained)",
        f"   attempts/s {lr['attempts_per_s']:.0f} · posts/s (add + delivered) {lr['posts_per_s']:.0f} · "
        f"2,048-char chunks/s {lr['chunks_per_s']:.0f}",
    ]
    for label in ("reply_2k", "cut_16k"):
        v = r["ledger"][label]
        lines.append(
            f"   {label}: {v['generations_per_s']:.0f} whole generations/s, "
            f"{v['db_bytes_per_1000'] / 2**20:.1f} MiB per 1,000 generations "
            f"({v['db_bytes_per_text_byte']:.1f}× the text)"
        )
    lv = r.get("live")
    if lv:
        lines += [
            "",
            f"5. a person's message → first visible text ({lv['tokens']} tokens at {lv['pace_tokens_per_s']:.0f} tok/s,"
            f" median of {lv['rounds']})",
            f"   settled delivery: first text {lv['settled']['first_visible_s']:.2f} s, whole reply "
            f"{lv['settled']['whole_reply_s']:.2f} s · live: first text {lv['live']['first_visible_s']:.2f} s, "
            f"whole reply {lv['live']['whole_reply_s']:.2f} s",
        ]
    if r.get("ledger_scale"):
        lines += ["", ledger_scale.table(r["ledger_scale"])]
    mem = r.get("memory")
    if mem:
        lines += [
            "",
            f"memory of `residents run` ({mem['residents']} residents, {mem['channels']} channels)",
            f"   idle RSS {mem['idle_rss_mib']:.0f} MiB · 100 generations of 16 KB: peak {mem['load_peak_rss_mib']:.0f} MiB,"
            f" {mem['after_rss_mib']:.0f} MiB after (targets: idle < 120 MB "
            f"{'met' if mem['idle_rss_mib'] * 2**20 < 120e6 else 'MISSED'}, peak < 200 MB "
            f"{'met' if mem['load_peak_rss_mib'] * 2**20 < 200e6 else 'MISSED'})",
        ]
    e = r.get("e2e")
    if e:
        lines += [
            "",
            f"end to end: a person's message → first post, {e['reply_chars']}-char reply, median of {e['rounds']}",
            f"   residents {e['residents']['wall_ms']:.1f} ms ({e['residents']['wall_range_ms'][0]:.1f}–"
            f"{e['residents']['wall_range_ms'][1]:.1f}) · minimum {e['minimum']['wall_ms']:.1f} ms"
            f" ({e['minimum']['wall_range_ms'][0]:.1f}–{e['minimum']['wall_range_ms'][1]:.1f}) ·"
            f" ratio {e['wall_ratio']:.2f}× wall, {e['cpu_ratio']:.2f}× CPU"
            f" (target ≤ 1.5× {'met' if e['wall_ratio'] <= 1.5 else 'MISSED'})",
        ]
    t = r["targets"]
    verdicts = [f"{k.removesuffix('_met')} {'met' if v else 'MISSED'}" for k, v in t.items() if k.endswith("_met")]
    lines += [
        "",
        f"targets (≤{TARGET}× the bare SDK in one process, ≤{PROCESS_TARGET}× per stream as processes): "
        + ", ".join(verdicts),
        f"scaling: {'linear' if t['scaling_linear'] else 'NOT linear'} (every exponent ≤ {LINEAR})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["ledger-scale"]:  # `python -m bench ledger-scale --generations N --db PATH`
        return ledger_scale.main(args[1:])
    if args[:1] == ["scale"]:  # `python -m bench scale [--quick] [--procs 1,2,4] ...`
        return scale.main(args[1:])
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a smoke run: fewer rounds, 10 concurrent generations")
    p.add_argument("--out", default=HERE, help="folder for results.json and scaling.png (default: bench/)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(args)
    logging.basicConfig(
        level=logging.INFO if a.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s: %(message)s",
    )
    if not a.verbose:
        logging.getLogger("bench").setLevel(logging.INFO)
    r = run(a.quick)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(r, f, indent=1)
        f.write("\n")
    m = r["machine"]
    plot.scaling_png(
        r["scaling"],
        os.path.join(a.out, "scaling.png"),
        f"time per KB against output size · {m['nproc']}× {m['cpu']}, Python {m['python']}",
    )
    print(table(r))
    return 0
