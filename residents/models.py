"""What each model can do, from a table that is data (`residents/models.yaml`).

Continuation, context and config ask this table instead of matching model names themselves, so a
new model is one row in the data file, or in the operator's `models:` overrides (read by
`residents.config`), and nowhere else. Ids are matched on whole segments, so a prefix of a version number
(`claude-opus-4-1` against `claude-opus-4-10`) never passes for the version.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from functools import cached_property
from importlib import resources
from typing import Any

import yaml
from rapidfuzz import fuzz, process

from .records import ModelStatus

DEFAULT_CONTEXT_WINDOW = 128_000  # tokens, of a row that states none and of a model the table does not know


@dataclass(frozen=True)
class ModelCaps:
    family: str
    max_output_tokens: int
    accepts_prefill: bool
    accepts_images: bool = False  # image content blocks (PNG, JPEG, GIF, WebP); without it they are described
    context_window: int = DEFAULT_CONTEXT_WINDOW  # tokens one request may hold, as published: sets the file budget
    input_per_mtok: float | None = None  # US dollars per million input tokens
    output_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None  # per million input tokens written to the prompt cache
    cache_read_per_mtok: float | None = None  # per million input tokens read from it
    status: ModelStatus = ModelStatus.ACTIVE
    released: date | None = None
    deprecated: date | None = None
    retirement: date | None = None  # announced (deprecated), happened (retired) or earliest (legacy)
    replacement: str | None = None  # the id the provider recommends instead
    provider: str = "anthropic"  # the residence `provider:` that serves it
    maker: str = "Anthropic"


# An id the table does not know: assume the newest behaviour (no prefill), which is the one that
# cannot fail with a 400; no images either (they are described instead, which cannot fail). Its ceiling here only answers callers that ask; a residence with such a
# model must state its own `output_ceiling` (bot.config), and max_tokens is checked against that.
UNKNOWN = ModelCaps("unknown model", 128000, False)

# Decorations providers add around a model id, taken off before matching (see residents/models.yaml).
# Bedrock: `anthropic.` after an optional inference-profile prefix, a geography or region in lower-case
# words joined by `-` (`us.`, `eu.`, `apac.`, `global.`, `us-gov.`, ...), taken generically.
_BEDROCK_PREFIX = re.compile(r"^(?:[a-z]{2,12}(?:-[a-z]{2,12})*\.)?anthropic\.")
_DECORATIONS = (
    re.compile(r"@.*$"),
    re.compile(r"-v\d+(?::\d+)?$"),
    re.compile(r"-\d{8}$"),
    re.compile(r"-\d{4}-\d{2}-\d{2}$"),  # OpenAI's dated ids: gpt-4o-2024-08-06
    re.compile(r"-latest$"),
)
_OPEN_END = re.compile(r"^(\d+)\+$")


def base_id(model: str) -> str:
    """The id without a Bedrock prefix or version, a Vertex version, a date (either form) or `-latest`."""
    m = _BEDROCK_PREFIX.sub("", model.strip())
    for pattern in _DECORATIONS:
        m = pattern.sub("", m)
    return m


def _number(segment: str) -> int | None:
    return int(segment) if segment.isascii() and segment.isdigit() else None


@dataclass(frozen=True)
class Row:
    """One row of the table: an id (whole segments; a last segment `N+` is open-ended) and its caps."""

    id: str
    caps: ModelCaps

    @cached_property
    def _parts(self) -> tuple[tuple[str, ...], int | None]:
        segs = tuple(base_id(self.id).split("-"))
        m = _OPEN_END.match(segs[-1])
        return (segs[:-1], int(m.group(1))) if m else (segs, None)

    @property
    def example(self) -> str:
        """A concrete id this row covers: what a "did you mean" names."""
        return self.id[:-1] if self.id.endswith("+") else self.id

    def covers(self, segments: tuple[str, ...]) -> bool:
        fixed, at_least = self._parts
        if at_least is None:
            return segments == fixed
        rest = segments[len(fixed) :]
        numbers = [_number(s) for s in rest]
        return segments[: len(fixed)] == fixed and bool(rest) and None not in numbers and (numbers[0] or 0) >= at_least


def row(model_id: str, family: str, output_ceiling: int, prefill: bool, images: bool = False, **published: Any) -> Row:
    """A checked row; ValueError says what is wrong with the id. `published` holds the other ModelCaps
    fields (context window, prices, lifecycle) as the table states them."""
    if not model_id or model_id != model_id.strip() or any(c.isspace() for c in model_id):
        raise ValueError("a model id is one word, without spaces")
    segs = base_id(model_id).split("-")
    if not all(segs) or any("+" in s for s in segs[:-1]) or ("+" in segs[-1] and not _OPEN_END.match(segs[-1])):
        raise ValueError("a model id is segments joined by '-', and only the last may be `N+` (a number and up)")
    if "status" in published:
        published["status"] = ModelStatus(published["status"])
    if published.get("context_window") is None:  # a row that states none (an operator's, often)
        published.pop("context_window", None)
    return Row(model_id, ModelCaps(family or model_id, output_ceiling, prefill, images, **published))


class ModelTable:
    """Rows in the order they are tried: exact ids before open-ended ones, overrides before built-ins."""

    def __init__(self, rows: Iterable[Row]) -> None:
        rows = list(rows)
        self.rows = [r for r in rows if not r.id.endswith("+")] + [r for r in rows if r.id.endswith("+")]

    def with_overrides(self, rows: Iterable[Row]) -> ModelTable:
        return ModelTable([*ModelTable(rows).rows, *self.rows])

    def lookup(self, model: str) -> ModelCaps | None:
        segments = tuple(base_id(model).split("-"))
        for r in self.rows:
            if r.covers(segments):
                return r.caps
        return None

    def nearest(self, model: str) -> str | None:
        """The known id closest to an unknown one (a typo's likely intent), if any is close."""
        ids = list(dict.fromkeys(r.example for r in self.rows))
        found = process.extractOne(base_id(model), ids, scorer=fuzz.ratio, score_cutoff=75)
        return found[0] if found else None


def rows_from(data: Mapping[str, Any], cache_prices: Mapping[str, Mapping[str, float]] | None = None) -> list[Row]:
    """Rows from a `models:` mapping whose values are already checked (config validates the operator's).

    `cache_prices`: per provider, the prompt cache's prices as multiples of a row's input price (`write`,
    `read`), for a row with an input price that states no cache price of its own."""
    fixed = ("family", "output_ceiling", "prefill", "images")
    out = []
    for k, v in data.items():
        published = {f: x for f, x in v.items() if f not in fixed}
        times = (cache_prices or {}).get(published.get("provider", "anthropic"))
        if times and published.get("input_per_mtok") is not None:
            published.setdefault("cache_write_per_mtok", _priced(published["input_per_mtok"], times["write"]))
            published.setdefault("cache_read_per_mtok", _priced(published["input_per_mtok"], times["read"]))
        out.append(
            row(
                k,
                v.get("family", ""),
                v["output_ceiling"],
                v.get("prefill", False),
                v.get("images", False),
                **published,
            )
        )
    return out


def _priced(per_mtok: float, times: float) -> float:
    """A price times a multiplier, to a millionth of a dollar (1.25 x $3 is $3.75, not 3.7500000000000004)."""
    return round(per_mtok * times, 6)


def estimated_cost(
    caps: ModelCaps, input_tokens: int, output_tokens: int, cache_write_tokens: int, cache_read_tokens: int
) -> float | None:
    """US dollars for these counts at the table's list prices: an estimate (the provider's invoice is the
    bill: discounts, batch or long-context prices are not here). None when a count with tokens has no price."""
    total = 0.0
    for count, price in (
        (input_tokens, caps.input_per_mtok),
        (output_tokens, caps.output_per_mtok),
        (cache_write_tokens, caps.cache_write_per_mtok),
        (cache_read_tokens, caps.cache_read_per_mtok),
    ):
        if count:
            if price is None:
                return None
            total += count * price / 1_000_000
    return total


def _read_builtin() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("models.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


_DATA = _read_builtin()
CACHE_PRICES: dict[str, dict[str, float]] = _DATA.get("cache_prices") or {}


def _builtin() -> ModelTable:
    return ModelTable(rows_from(_DATA["models"], CACHE_PRICES))


BUILTIN = _builtin()
_active = BUILTIN


def use(table: ModelTable) -> None:
    """Make `table` (built-ins plus a project's overrides) the one `caps` and `known` answer from."""
    global _active
    _active = table


def table() -> ModelTable:
    return _active


def caps(model: str) -> ModelCaps:
    return _active.lookup(model) or UNKNOWN


def known(model: str) -> bool:
    return _active.lookup(model) is not None


def nearest(model: str) -> str | None:
    return _active.nearest(model)


def lifecycle_problem(model: str) -> tuple[bool, str] | None:
    """(refused, why) for a deprecated or retired model, naming the date and the replacement to use
    (followed past replacements that are themselves retired); None for an active or legacy one."""
    c = _active.lookup(model)
    if c is None or c.status not in (ModelStatus.DEPRECATED, ModelStatus.RETIRED):
        return None
    retired = c.status is ModelStatus.RETIRED
    when = f" on {c.retirement.isoformat()}" if c.retirement else ""
    why = (
        f"{c.family} was retired{when}: requests to it fail"
        if retired
        else (f"{c.family} is deprecated and retires{when}")
    )
    chain: list[str] = []  # the replacements named, followed until one is current
    use = c.replacement
    while use is not None and use not in chain and base_id(use) != base_id(model):
        chain.append(use)
        nxt = _active.lookup(use)
        if nxt is None or nxt.status is ModelStatus.ACTIVE or nxt.replacement is None:
            break
        use = nxt.replacement
    if not chain:
        return retired, why
    via = f" (by the replacements named: {' -> '.join(chain)})" if len(chain) > 1 else ""
    return retired, f"{why}; use {chain[-1]!r} instead{via}"
