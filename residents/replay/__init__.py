"""`residents replay`: the offline contract of docs/scenarios.md, on the real pipeline."""

from .run import replay, transcript
from .scenario import Scenario, load_scenario

__all__ = ["Scenario", "load_scenario", "replay", "transcript"]
