"""The request that continues a cut output: the partial once, as prefill or as the assistant turn.

It lives with continuation, not with the context compiler: it extends a recorded request, and reads no room.
"""

from __future__ import annotations

from typing import Any

from .. import models

CONTINUE_NOTE = (
    "[The previous assistant message was cut off by the output ceiling. Continue it from exactly "
    "where it stops, mid-word if it stops mid-word, without repeating any of it.]"
)


def continuation_request(
    base: dict[str, Any], assembled: str, remaining_tokens: int, prefill_allowed: bool = True
) -> tuple[dict[str, Any], str]:
    """The request that continues `assembled`, and the trailing whitespace taken off a prefill.

    The partial appears exactly once: as the prefill where the model accepts one (and the provider
    takes one: `prefill_allowed` is False for chat completions), else as the assistant turn before a
    user turn asking to go on.
    """
    msgs = [dict(m) for m in base["messages"]]
    caps = models.caps(base["model"])
    req = {**base, "max_tokens": max(1, min(base["max_tokens"], remaining_tokens))}
    prefill = assembled.rstrip()
    if caps.accepts_prefill and prefill_allowed and prefill:
        stripped = assembled[len(prefill) :]
        req["messages"] = msgs + [{"role": "assistant", "content": prefill}]
        return req, stripped
    req["messages"] = msgs + [{"role": "assistant", "content": assembled}, {"role": "user", "content": CONTINUE_NOTE}]
    return req, ""
