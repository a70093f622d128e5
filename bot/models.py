"""What each Claude model can do, in one table.

Continuation and delivery ask this table instead of matching model names themselves, so a new model
is one row here and nowhere else.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelCaps:
    family: str
    max_output_tokens: int
    accepts_prefill: bool


# (pattern over the model id, capabilities); first match wins, so specific rows come first.
_TABLE: list[tuple[str, ModelCaps]] = [
    (r"^claude-3-opus", ModelCaps("Claude 3 Opus", 4096, True)),
    (r"^claude-3-sonnet", ModelCaps("Claude 3 Sonnet", 4096, True)),
    (r"^claude-3-haiku", ModelCaps("Claude 3 Haiku", 4096, True)),
    (r"^claude-3-5-(sonnet|haiku)", ModelCaps("Claude 3.5", 8192, True)),
    (r"^claude-3-7-sonnet", ModelCaps("Claude 3.7 Sonnet", 64000, True)),
    (r"^claude-opus-4-(0|1)\b|^claude-opus-4-20|^claude-opus-4-1", ModelCaps("Claude Opus 4/4.1", 32000, True)),
    (r"^claude-opus-4$", ModelCaps("Claude Opus 4", 32000, True)),
    (r"^claude-sonnet-4-20|^claude-sonnet-4$|^claude-sonnet-4-0", ModelCaps("Claude Sonnet 4", 64000, True)),
    (r"^claude-(sonnet|haiku|opus)-4-5", ModelCaps("Claude 4.5", 64000, True)),
    (r"^claude-(opus|sonnet)-4-([6-9]|\d\d)", ModelCaps("Claude 4.6 and later", 128000, False)),
    (r"^claude-(opus|sonnet|haiku)-([5-9]|\d\d)", ModelCaps("Claude 5 and later", 128000, False)),
]

# An id the table does not know: assume the newest behaviour (no prefill), which is the one that
# cannot fail with a 400, and a generous ceiling, since the provider enforces the real one.
UNKNOWN = ModelCaps("unknown model", 128000, False)


def caps(model: str) -> ModelCaps:
    for pattern, c in _TABLE:
        if re.search(pattern, model):
            return c
    return UNKNOWN


def known(model: str) -> bool:
    return caps(model) is not UNKNOWN
