"""Section 2: the continuation guards and delivery planning must grow linearly with output size.

For each size S (16 KB … 2 MB): a prior output of S chars and a new segment of S chars that opens by
repeating the prior's last 256 chars, as a continuation does. `find_overlap` (KMP) and `similarity`
are timed on them, `split_text` on the assembled 2·S output, all in µs per KB of the input they
read. The naive overlap search (try every length, longest first, by slicing) is the quadratic
contrast; its sizes stop before one run would pass NAIVE_BUDGET seconds (about 4× per doubling).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from residents.continuation.assemble import find_overlap, similarity
from residents.delivery import split_text

from . import streams

log = logging.getLogger(__name__)

KB = 1024
SIZES = [16 * KB * 2**i for i in range(8)]  # 16 KB … 2 MB
OVERLAP = 256
NAIVE_BUDGET = 0.5


def naive_overlap(prior: str, new: str, min_overlap: int = 1) -> int:
    """The obvious search: the longest k with prior ending in new[:k], longest first. Quadratic."""
    for k in range(min(len(prior), len(new)), min_overlap - 1, -1):
        if prior.endswith(new[:k]):
            return k
    return 0


def _time(fn: Callable[[], Any], min_total: float = 0.05, max_runs: int = 50, min_runs: int = 3) -> float:
    """Fastest of repeated calls: at least `min_runs` (the largest sizes too, where one call is slow
    and one timing alone would be whatever a neighbour left it), and more until `min_total` seconds."""
    runs: list[float] = []
    total = 0.0
    while (total < min_total or len(runs) < min_runs) and len(runs) < max_runs:
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
        total += runs[-1]
    return min(runs)


def exponent(rows: list[dict[str, Any]], key: str) -> float:
    """b in time ∝ size^b, by least squares over log–log points: 1 is linear, 2 quadratic."""
    pts = [(math.log(r["size_bytes"]), math.log(r[key] * r["size_bytes"])) for r in rows if key in r]
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def run() -> dict[str, Any]:
    big = streams.text(2 * SIZES[-1] + OVERLAP, seed=21)
    rows: list[dict[str, Any]] = []
    naive_on = True
    for size in SIZES:
        prior = big[:size]
        new = prior[-OVERLAP:] + big[size : 2 * size - OVERLAP]
        got = find_overlap(prior, new, 8)
        if got != OVERLAP:
            raise AssertionError(f"find_overlap found {got} at {size}, expected {OVERLAP}")
        added = new[got:]
        assembled = prior + added
        kb = size / KB
        row: dict[str, Any] = {
            "size_bytes": size,
            "overlap_us_per_kb": _time(lambda: find_overlap(prior, new, 8)) / kb * 1e6,
            "similarity_us_per_kb": _time(lambda: similarity(prior, added)) / kb * 1e6,
            "split_us_per_kb": _time(lambda: split_text(assembled)) / (2 * kb) * 1e6,
            "posts": len(split_text(assembled)),
        }
        if naive_on:
            if naive_overlap(prior, new, 8) != OVERLAP:
                raise AssertionError("the naive search disagrees with find_overlap")
            t = _time(lambda: naive_overlap(prior, new, 8), min_total=0.02)
            row["naive_overlap_us_per_kb"] = t / kb * 1e6
            naive_on = t < NAIVE_BUDGET / 4  # the next size takes about four times as long
        rows.append(row)
        log.info("scaling %d KB: %s", size // KB, row)
    keys = ("overlap_us_per_kb", "similarity_us_per_kb", "split_us_per_kb", "naive_overlap_us_per_kb")
    growth = {}
    for k in keys:
        have = [r for r in rows if k in r]
        growth[k] = have[-1][k] / have[0][k]
    naive = [r for r in rows if "naive_overlap_us_per_kb" in r]
    return {
        "overlap_chars": OVERLAP,
        "rows": rows,
        "per_kb_growth_16kb_to_largest": growth,
        "exponent": {k: exponent(rows, k) for k in keys},
        "naive_largest_bytes": naive[-1]["size_bytes"],
        "split_2mb_ms": _time(lambda: split_text(big[: 2 * 1024 * KB])) * 1000,
    }


if __name__ == "__main__":
    import json

    logging.basicConfig(level=logging.INFO)
    print(json.dumps(run(), indent=1))
