"""Delivery planning: outcome → posts by kind, within Discord's limits."""
from ..truth import LIMIT
from .plan import Planned, plan, plan_continuation, split_text

__all__ = ["LIMIT", "Planned", "plan", "plan_continuation", "split_text"]
