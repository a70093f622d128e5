"""The one build step pyproject.toml cannot declare: ship the repository's examples in the wheel.

residences/, policies/ and scenarios/ stay at the top of the repository, one copy each, where
people read and edit them; a built wheel carries them as residents/examples/, where `residents.bundled` finds
them once installed (`residents init`, `residents replay NAME`). An editable install needs no copy:
`residents.bundled` reads the checkout's folders. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("residences", "policies", "scenarios")


class BuildWithExamples(build_py):
    """build_py, then the shipped folders copied into the build as residents/examples/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in SHIPPED:
            dest = Path(self.build_lib) / "residents" / "examples" / name
            shutil.rmtree(dest, ignore_errors=True)  # a build folder reused across builds keeps no stale file
            shutil.copytree(name, dest, ignore=shutil.ignore_patterns("__pycache__", ".*"))


setup(cmdclass={"build_py": BuildWithExamples})
