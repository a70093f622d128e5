"""The test run itself: a hanging test fails on its own timeout, and caches stay out of the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HANGS_AND_FAILS = """
import time
from hypothesis import given, strategies as st


def test_hangs():
    time.sleep(120)


@given(st.integers())
def test_falsified(x):
    assert x < 5
"""


def test_a_hanging_test_fails_on_its_timeout_and_caches_go_to_the_temporary_folder(tmp_path):
    """Run from the checkout as a person would: pytest's lastfailed cache and hypothesis's example
    database are written (a failure writes both), under RESIDENTS_TEST_CACHE, and neither
    `.pytest_cache` nor `.hypothesis` appears in the tree; the sleeping test is stopped at its
    timeout rather than holding the run."""
    (tmp_path / "test_run.py").write_text(HANGS_AND_FAILS)
    cache = tmp_path / "cache"
    env = {**os.environ, "RESIDENTS_TEST_CACHE": str(cache), "PYTHONPATH": str(ROOT / "tests")}
    in_tree = [ROOT / ".pytest_cache", ROOT / ".hypothesis"]
    before = [p.exists() for p in in_tree]
    try:
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "conftest",
                "--rootdir",
                str(ROOT),
                "-c",
                str(ROOT / "pyproject.toml"),
                "--timeout",
                "3",
                str(tmp_path / "test_run.py"),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        made = [path.name for path, was in zip(in_tree, before, strict=True) if path.exists() and not was]
    finally:
        for path, was in zip(in_tree, before, strict=True):
            if path.exists() and not was:
                shutil.rmtree(path)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Timeout" in out and "2 failed" in out, out
    assert made == [], f"written into the source tree: {made}"
    assert (cache / "pytest").is_dir() and (cache / "hypothesis").is_dir()
