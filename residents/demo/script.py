"""The demo's scripted provider: canned streams that show every boundary in a minute.

Cairn's first reply reaches its residence's max_tokens (4,096) mid-word; Sill's first attempt fails
mid-stream and is retried (leaving a stump); everything after is ordinary speech. Replies are
made up deterministically, so the demo reads the same every time.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..localservers import sse
from ..localservers.provider import Call

NOUNS = [
    "harbour",
    "lighthouse",
    "breakwater",
    "tide",
    "ferry",
    "gull",
    "net",
    "quay",
    "lantern",
    "buoy",
    "channel",
    "shoal",
    "chart",
    "keel",
    "current",
    "mooring",
    "sandbar",
    "fog",
    "bell",
    "pier",
]
VERBS = ["holds", "turns", "carries", "shelters", "marks", "follows", "meets", "outlasts", "answers", "keeps"]
ADJS = ["old", "grey", "slow", "narrow", "salt-worn", "quiet", "northern", "patient", "bright", "low"]


def prose(seed: int, chars: int) -> str:
    """Deterministic plausible prose of about `chars` characters, in paragraphs."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        para = []
        for _ in range(rng.randint(3, 6)):
            s = (
                f"The {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)}"
                f"{rng.choice(['', ' at dusk', ' in winter', ' when the wind backs', ' for the ' + rng.choice(NOUNS)])}."
            )
            para.append(s)
        text = " ".join(para)
        out.append(text)
        size += len(text) + 2
    return "\n\n".join(out)


def cut_mid_word(text: str, chars: int) -> str:
    """The first `chars` characters, moved so the cut falls inside a word, as ceilings often do."""
    cut = min(chars, len(text) - 1)
    while cut < len(text) - 1 and not (text[cut - 1].isalpha() and text[cut].isalpha()):
        cut += 1
    return text[:cut]


@dataclass
class Scripted:
    """Per-resident queues of canned calls; an empty queue falls back to an ordinary reply."""

    queues: dict[str, list[Call]]
    model: dict[str, str]
    seed: int = 7

    def __post_init__(self) -> None:
        self.counts: dict[str, int] = defaultdict(int)
        self._script = {name: list(calls) for name, calls in self.queues.items()}

    def reset(self) -> None:
        """The canned calls again, from the first (the demo's "Play again")."""
        self.queues = {name: list(calls) for name, calls in self._script.items()}
        self.counts.clear()

    def who(self, body: dict[str, Any]) -> str:
        system = body.get("system") or ""
        if isinstance(system, list):
            system = " ".join(b.get("text", "") for b in system if isinstance(b, dict))
        for name in self.queues:
            if re.search(rf"\b{re.escape(name)}\b", system, re.I):
                return name
        return next(iter(self.queues), "resident")

    def __call__(self, body: dict[str, Any]) -> Call:
        name = self.who(body)
        self.counts[name] += 1
        q = self.queues.get(name)
        if q:
            return q.pop(0)
        last = ""
        msgs = body.get("messages") or []
        if msgs and isinstance(msgs[-1].get("content"), str):
            last = msgs[-1]["content"].rsplit("\n", 1)[-1]
        topic = next((n for n in NOUNS if n in last.lower()), "harbour")
        text = (
            f"On the {topic}: " + prose(self.seed * 31 + self.counts[name] + sum(map(ord, name)), 420).split("\n\n")[0]
        )
        return Call(
            sse=sse.stream(text, "end_turn", max(1, len(text) // 4), model=self.model.get(name, "claude")),
            chunk_bytes=256,
        )


def demo_responder(models: dict[str, str]) -> Scripted:
    ceiling = cut_mid_word(prose(1, 17_500), 16_400)
    fragment = prose(2, 700)[:311]
    return Scripted(
        queues={
            "cairn": [
                Call(
                    sse=sse.stream(ceiling, "max_tokens", 4096, model=models.get("cairn", "claude")),
                    chunk_bytes=1024,
                    chunk_delay=0.02,
                )
            ],  # ~4 s: Cairn's live reply is seen growing
            "sill": [
                Call(
                    sse=sse.head(models.get("sill", "claude"))
                    + b"".join(sse.delta(p) for p in sse.pieces(fragment))
                    + sse.error("overloaded_error", "Overloaded")
                )
            ],
        },
        model=models,
    )
