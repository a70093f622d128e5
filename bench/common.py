"""Small helpers the benchmark sections share: timing, medians, a scratch folder."""

from __future__ import annotations

import gc
import math
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass
class Sample:
    wall: float
    cpu: float  # process CPU time, every thread included (the ledger's worker thread too)


async def measure(fn: Callable[[], Awaitable[Any]]) -> tuple[Sample, Any]:
    """One timed run; garbage is collected first so one run's leftovers are not billed to the next."""
    gc.collect()
    w, c = time.perf_counter(), time.process_time()
    out = await fn()
    return Sample(time.perf_counter() - w, time.process_time() - c), out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: list[float]) -> dict[str, float]:
    """Median and range of a set of runs: what a figure is, and how far a busy machine moved it."""
    return {"median": median(xs), "min": min(xs), "max": max(xs)}


def percentile(xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an unsorted list."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


def scratch(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=f"residents-bench-{prefix}-")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    import platform

    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_avg_1min_at_start": round(load, 2),
    }
