"""Synthetic outputs and their SSE streams, deterministic so every run measures the same bytes.

The text mixes prose, markdown lists and fenced code (so delivery planning meets fences), and the
stream cuts it into small text deltas of 1–7 characters (about one token each), as Claude sends them.
"""

from __future__ import annotations

import random

from residents.localservers import sse

CHARS_PER_TOKEN = 4
_WORDS = (
    "the of and to in is that it for as with was on be by this are from at or an have not which but "
    "all were when we there can more one has their if will each about how up out them then she many some so "
    "these would other into its like time two him see could no way people than first water been call who "
    "now find long down day did get come made may part river stone window ledger output continue truth "
    "résumé naïve café — “quoted” 東京 😀"
).split()
_CODE = (
    "def f(x):\n    return x * 2\n",
    "for i in range(10):\n    print(i)\n",
    "let y = await fetch(url);\n",
    "SELECT id, text FROM posts WHERE seq > 3;\n",
)


def text(chars: int, seed: int = 7) -> str:
    """About `chars` characters of markdown-like prose, cut to exactly `chars`."""
    rnd = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < chars:
        roll = rnd.random()
        if roll < 0.08:
            block = "```python\n" + "".join(rnd.choice(_CODE) for _ in range(rnd.randint(2, 12))) + "```\n\n"
        elif roll < 0.2:
            block = (
                "".join(f"- {' '.join(rnd.choices(_WORDS, k=rnd.randint(3, 12)))}\n" for _ in range(rnd.randint(2, 6)))
                + "\n"
            )
        else:
            sentences = []
            for _ in range(rnd.randint(2, 7)):
                words = rnd.choices(_WORDS, k=rnd.randint(5, 24))
                sentences.append(" ".join(words).capitalize() + rnd.choice((".", ".", ".", "?", "!")))
            block = " ".join(sentences) + "\n\n"
        out.append(block)
        n += len(block)
    return "".join(out)[:chars]


def deltas(t: str, seed: int = 11) -> list[str]:
    """`t` cut into pieces of 1–7 characters (mean 4: about a token each)."""
    rnd = random.Random(seed)
    out, i = [], 0
    while i < len(t):
        k = rnd.randint(1, 7)
        out.append(t[i : i + k])
        i += k
    return out


def stream(t: str, stop_reason: str = "end_turn", model: str = "claude-sonnet-4-6") -> bytes:
    """A whole recorded-style stream for `t`, in small deltas."""
    parts = deltas(t)
    return (
        sse.head(model)
        + b"".join(sse.delta(p) for p in parts)
        + sse.tail(stop_reason, max(1, len(t) // CHARS_PER_TOKEN))
    )


def for_tokens(tokens: int, stop_reason: str = "end_turn") -> tuple[str, bytes]:
    """The text of a `tokens`-token output and its stream."""
    t = text(tokens * CHARS_PER_TOKEN)
    return t, stream(t, stop_reason)
