"""The scaling plot: µs per KB against output size, where a flat line means linear time.

matplotlib is an optional `bench` extra; without it the figures are still written, only the PNG is not.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def scaling_png(scaling: dict[str, Any], path: str, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install -e '.[bench]'): no plot written")
        return False
    rows = scaling["rows"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    series = [
        ("overlap_us_per_kb", "find_overlap (KMP)", "o-"),
        ("similarity_us_per_kb", "similarity (fixed windows)", "s-"),
        ("split_us_per_kb", "split_text (posts ≤ 2,000)", "^-"),
        ("naive_overlap_us_per_kb", "naive overlap search (quadratic)", "x--"),
    ]
    for key, label, style in series:
        pts = [(r["size_bytes"] / 1024, r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xscale("log", base=2)
    sizes = [r["size_bytes"] // 1024 for r in rows]
    ax.set_xticks(sizes, [f"{k} KB" if k < 1024 else f"{k // 1024} MB" for k in sizes])
    ax.set_yscale("log")
    ax.set_xlabel("output size")
    ax.set_ylabel("time per KB (µs), log scale; flat = linear")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
