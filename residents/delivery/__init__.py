"""Delivery planning: outcome → posts by kind, within Discord's limits."""

from .plan import plan, plan_continuation, split_text

__all__ = ["plan", "plan_continuation", "split_text"]
