"""Delivery planning: outcome → posts by kind, within Discord's limits."""
from .plan import LIMIT, Planned, plan, plan_continuation, split_text

__all__ = ["LIMIT", "Planned", "plan", "plan_continuation", "split_text"]
