"""Residences and policies: YAML on disk → validated models.

A typo in a policy must never silently turn a guard off, so every model forbids unknown keys and
every error names the file, the key path and, where the YAML has one, the line.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
import unicodedata
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from . import models
from .provider import REGISTRY

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """One problem in one file, phrased as the single line a person reads.

    `problems` holds every problem found while reading that file (this one first), so `check` can
    print them all, one line each, while anything else still shows one line.
    """

    def __init__(self, file: str | Path, key: str, message: str, line: int | None = None) -> None:
        self.file, self.key, self.message, self.line = str(file), key, message, line
        where = f"{self.file}:{line}" if line else self.file
        text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        # One problem is one line: control and line-separator characters in names are shown escaped.
        super().__init__(
            "".join(
                c.encode("unicode_escape").decode() if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c
                for c in text
            )
        )
        self.problems: list[ConfigError] = [self]

    @staticmethod
    def combined(errors: Sequence[ConfigError]) -> ConfigError:
        """One error carrying every problem of `errors` (the first stands for them where one line is shown)."""
        first, *rest = errors
        seen: dict[str, ConfigError] = {}
        for p in [*first.problems, *(p for e in rest for p in e.problems)]:
            seen.setdefault(str(p), p)
        first.problems = list(seen.values())
        return first


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Continuation(Strict):
    """Who may continue a cut output, and the hard bounds when anyone does."""

    standing: Literal["none", "on-request", "bounded"] = "none"
    max_segments: int | None = Field(default=None, ge=1, le=8)
    max_output_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    min_progress_chars: int | None = Field(default=None, ge=1, le=100_000)
    similarity_abort: float | None = Field(default=None, ge=0.0, le=1.0)
    min_overlap_chars: int = Field(default=8, ge=1, le=10_000)
    # Who may press the Continue button on a cut output's receipt (standing `on-request`): moderators, as
    # for /continue; `asker`: moderators and the person the reply answered; `anyone` who sees the channel.
    button: Literal["moderators", "asker", "anyone"] = "moderators"

    @model_validator(mode="after")
    def _bounds_required(self) -> Continuation:
        if self.standing != "none":
            keys = ("max_segments", "max_output_tokens", "min_progress_chars", "similarity_abort")
            missing = [key for key in keys if getattr(self, key) is None]
            if missing:  # every one at once: a file's problems are all reported, not one per run
                raise _KeyError(missing[0], f"required when standing is {self.standing!r}", tuple(missing[1:]))
        return self


class Retries(Strict):
    max_attempts: int = Field(default=3, ge=1, le=10)
    backoff_seconds: float = Field(default=1.0, ge=0.0, le=600.0)
    max_backoff_seconds: float = Field(default=30.0, ge=0.0, le=3600.0)
    timeout_seconds: float = Field(default=600.0, gt=0.0, le=3600.0)


class Notices(Strict):
    """Room lines beyond the receipts, which are never optional."""

    retry_abandoned: bool = False


class StumpAccess(Strict):
    moderators_read_text: bool = True  # the operator's ceiling: False keeps every stump's text from moderators
    resident_reads_own: bool = False
    patient_tool: bool = True  # the resident gets the `stumps` tool over its own stumps
    default_access: Literal["moderators", "private"] = "moderators"  # a new stump's access, until the resident sets it


class Tools(Strict):
    """The tool loop: rounds of provider calls, each ending in tool calls whose results go back."""

    # requests in one generation's tool loop, the final answer's included
    max_rounds: int = Field(default=4, ge=2, le=32)


class Floor(Strict):
    """Turn-taking among several residents and people in one room."""

    reply_to: Literal["mentions", "mentions-and-replies", "all"] = "mentions-and-replies"
    cooldown_seconds: float = Field(default=2.0, ge=0.0, le=3600.0)
    max_resident_run: int = Field(default=3, ge=1, le=100)
    history_limit: int = Field(default=50, ge=1, le=500)


class Delivery(Strict):
    """How a reply reaches the room. `live`: shown while it is generated, edited as text arrives."""

    live: bool = False


class Attachments(Strict):
    """What a request carries of the files people post. `request_budget_tokens`: the most tokens one
    request's inline files and images may take (counted as `residents.truth.file_tokens` does), newest
    messages' files first; a file past it is one line saying so. None: a quarter of the model's context
    window (`context_window` in the model table)."""

    request_budget_tokens: int | None = Field(default=None, ge=0, le=10_000_000)


MAX_DAILY_TOKENS = 1_000_000_000_000  # a budget above this is a typo, not a budget


class PersonBudgets(Strict):
    """Tokens a day (UTC) the replies one person's mentions ask for may take, counted per person (their
    room user id), by the provider's own counts. None: no such budget."""

    daily_input_tokens: int | None = Field(default=None, ge=0, le=MAX_DAILY_TOKENS)
    daily_output_tokens: int | None = Field(default=None, ge=0, le=MAX_DAILY_TOKENS)


class Budgets(Strict):
    """Daily (UTC) token budgets of the residence, by the provider's own counts of every attempt that day:
    input (with cache writes and reads) and output. Once one is spent no provider call is made, and the
    channel is told once a day (`residents.truth.budget_notice`). None: no such budget."""

    daily_input_tokens: int | None = Field(default=None, ge=0, le=MAX_DAILY_TOKENS)
    daily_output_tokens: int | None = Field(default=None, ge=0, le=MAX_DAILY_TOKENS)
    per_person: PersonBudgets = PersonBudgets()


MAX_CATCH_UP_SECONDS = 24 * 3600


class CatchUp(Strict):
    """Mentions that arrived while the resident had no gateway session (a new session, a restart).

    Each one younger than `window` is answered once, oldest first; older ones are logged, not answered.
    """

    window: str = "10m"

    @field_validator("window", mode="before")
    @classmethod
    def _a_duration(cls, value: Any) -> str:
        """Written as `ledger.checkpoints.every` is (`duration_seconds`), kept as written for /policy show."""
        if duration_seconds(value) > MAX_CATCH_UP_SECONDS:
            raise ValueError("at most 24h")
        return value

    @property
    def window_seconds(self) -> int:
        return duration_seconds(self.window)


class Policy(Strict):
    name: str = "default"
    description: str = ""
    continuation: Continuation = Continuation()
    retries: Retries = Retries()
    notices: Notices = Notices()
    stumps: StumpAccess = StumpAccess()
    floor: Floor = Floor()
    tools: Tools = Tools()
    delivery: Delivery = Delivery()
    attachments: Attachments = Attachments()
    catch_up: CatchUp = CatchUp()
    budgets: Budgets = Budgets()


def _channel_ref(ref: str) -> str:
    if not re.fullmatch(r"[^/\s]+(/[^/\s]+)?", ref):
        raise ValueError("a channel is a name, an id or guild/channel")
    return ref


SHARDS_FORM = "`auto`, or {count: N} with optional ids: [...] (the shards this process runs, of 0..N-1)"


class ShardSettings(Strict):
    """`discord.shards`: the bot's gateway split in `count` sessions (discord.py's AutoShardedBot), each
    carrying the guilds on its shard, `(guild_id >> 22) % count`. `auto` (count None) takes the count
    Discord recommends; `ids` are the shards this process runs (all of 0..count-1 when not given), so a
    process may be handed a subset of a fixed count."""

    count: int | None = Field(ge=1)
    ids: list[int] | None = None

    @model_validator(mode="before")
    @classmethod
    def _count_given(cls, data: Any) -> Any:
        if isinstance(data, dict) and "count" not in data:
            raise _KeyError(
                "count",
                "required: how many shards the bot runs in"
                + (" (ids are some of 0..count-1; `auto` cannot be split)" if "ids" in data else ""),
            )
        return data

    @model_validator(mode="after")
    def _ids_within_count(self) -> ShardSettings:
        if self.ids is None:
            return self
        if self.count is None:
            raise _KeyError("ids", "ids need a fixed count (`auto` cannot be split)")
        if not self.ids:
            raise _KeyError("ids", "an empty list runs no shard (leave ids out to run all of them)")
        outside = [i for i in self.ids if not 0 <= i < self.count]
        if outside:
            raise _KeyError("ids", f"{outside[0]} is not a shard of {self.count} (ids run from 0 to {self.count - 1})")
        twice = sorted({i for i in self.ids if self.ids.count(i) > 1})
        if twice:
            raise _KeyError("ids", f"shard {twice[0]} is listed twice")
        return self

    @property
    def auto(self) -> bool:
        return self.count is None


def _shards_form(value: Any) -> Any:
    """`auto` stands for a count Discord recommends; any other plain value is a mistake said in one line."""
    if value == "auto":
        return {"count": None}
    if value is None or isinstance(value, dict):
        return value
    hint = f" (write {{count: {value}}})" if isinstance(value, int) and not isinstance(value, bool) else ""
    raise ValueError(f"must be {SHARDS_FORM}{hint}")


class DiscordSettings(Strict):
    token_env: str = Field(min_length=1)
    # A channel's name, its id, or `guild/channel` (a bare name must be in only one of the bot's guilds).
    channels: list[Annotated[str, AfterValidator(_channel_ref)]] = Field(default_factory=list)
    # This bot registers the moderators' slash commands and answers them for every resident of the
    # process (one copy per guild); without any such residence, the first one does.
    commands: bool = False
    # Several gateway sessions for a bot in more guilds than one session may carry (`ShardSettings`).
    shards: Annotated[ShardSettings | None, BeforeValidator(_shards_form)] = None


DEFAULT_PROVIDER = "anthropic"  # a residence that names no `provider:` is sent to Anthropic's API


class Residence(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=1_000_000)
    system: str = ""
    policy: Policy = Policy()
    discord: DiscordSettings | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    stop_sequences: list[str] = Field(default_factory=list)
    output_ceiling: int | None = Field(default=None, ge=1, le=1_000_000)
    # Who serves the model: a name in the provider registry (`residents.provider.REGISTRY`): Anthropic's
    # Messages API (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL), or any server speaking OpenAI's chat
    # completions at `base_url`, its key in the variable `api_key_env`.
    provider: str = DEFAULT_PROVIDER
    base_url: str | None = None
    api_key_env: str | None = None

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Residence:
        problems = residence_rules(self.__dict__)
        if problems:
            first, *rest = problems
            first.also = tuple(rest)
            raise first
        return self

    @classmethod
    def cross_field_problems(cls, data: Mapping[str, Any], invalid: set[str]) -> list[_KeyError]:
        """The cross-field rules over the keys that passed their own checks, so a file with a bad
        value elsewhere still hears about an unknown model or a max_tokens above its ceiling."""
        values = {n: data.get(n, f.default) for n, f in cls.model_fields.items() if n not in invalid}
        return residence_rules(values)


def residence_rules(v: Mapping[str, Any]) -> list[_KeyError]:
    """Every rule that ties a residence's keys together; each looks only at keys present in `v`."""
    rules = (_provider_settings, _provider_of_model, _within_model_ceiling, _budget_within_context_window)
    return [p for p in (rule(v) for rule in rules) if p is not None]


def _provider_settings(v: Mapping[str, Any]) -> _KeyError | None:
    """A registered provider; `base_url` and `api_key_env` belong to one configured in the residence,
    which needs both; the key itself never sits in a residence file, only the name of the variable."""
    if "provider" not in v:
        return None
    reg = REGISTRY.get(v["provider"])
    if reg is None:
        return _KeyError("provider", f"{v['provider']!r} is not a provider (one of: {', '.join(sorted(REGISTRY))})")
    given = {k: v.get(k) for k in ("base_url", "api_key_env") if k in v}
    if not reg.configured_in_residence:
        extra = [k for k, x in given.items() if x is not None]
        if extra:
            in_residence = " or ".join(sorted(n for n, r in REGISTRY.items() if r.configured_in_residence))
            return _KeyError(
                extra[0],
                f"only with `provider: {in_residence}` (the {v['provider']} provider reads "
                f"{reg.key_env} and {reg.base_url_env})",
                tuple(extra[1:]),
            )
        return None
    missing = [k for k, x in given.items() if x is None]
    if missing:
        return _KeyError(missing[0], f"required with `provider: {v['provider']}`", tuple(missing[1:]))
    base_url, api_key_env = given.get("base_url"), given.get("api_key_env")
    if base_url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", base_url):
        return _KeyError("base_url", f"{base_url!r} is not an http(s) URL (e.g. https://api.openai.com/v1)")
    if api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
        return _KeyError(
            "api_key_env",
            "the NAME of the environment variable holding the key (letters, digits and '_', "
            "e.g. OPENAI_API_KEY), never the key itself",
        )
    return None


def _provider_of_model(v: Mapping[str, Any]) -> _KeyError | None:
    """A model the table places with another provider, sent to Anthropic's API (no `provider:`),
    would only fail at the first request: say so now, naming the provider it belongs to."""
    if "model" not in v or v.get("provider") != DEFAULT_PROVIDER or not models.known(v["model"]):
        return None
    c = models.caps(v["model"])
    if c.provider == DEFAULT_PROVIDER:
        return None
    return _KeyError(
        "model",
        f"{v['model']!r} is {c.maker}'s model, but without `provider:` a residence is sent to Anthropic's API; "
        f"add `provider: {c.provider}` with `base_url` and `api_key_env`",
    )


def _budget_within_context_window(v: Mapping[str, Any]) -> _KeyError | None:
    """A file budget the model's context window cannot hold would have every request with files refused."""
    policy = v.get("policy")
    if "model" not in v or not isinstance(policy, Policy):  # a name or mapping not resolved yet: its own check
        return None
    budget = policy.attachments.request_budget_tokens
    window = models.caps(v["model"]).context_window
    if budget is not None and budget > window:
        return _KeyError(
            "policy.attachments.request_budget_tokens",
            f"{budget:,} is above {v['model']}'s context window of {window:,} tokens"
            f" (`context_window` of its row in the model table, or under `models:` in {PROJECT_FILE})",
        )
    return None


def _within_model_ceiling(v: Mapping[str, Any]) -> _KeyError | None:
    """max_tokens within the model's ceiling, which the table knows or the residence states."""
    if "model" not in v or "output_ceiling" not in v:
        return None
    model, stated = v["model"], v["output_ceiling"]
    if not models.known(model):
        if stated is None:
            hint = models.nearest(model)
            return _KeyError(
                "model",
                f"{model!r} is not in the model table"
                + (f" (did you mean {hint!r}?)" if hint else "")
                + f"; a model the table does not know needs `output_ceiling` in the residence"
                f" (or a row under `models:` in {PROJECT_FILE})",
            )
        ceiling, whose = stated, "the stated output_ceiling"
    else:
        ceiling, whose = models.caps(model).max_output_tokens, f"{model}'s output ceiling"
        if stated is not None and stated > ceiling:
            return _KeyError("output_ceiling", f"{stated} is above {whose} of {ceiling}")
        ceiling = stated or ceiling
    if "max_tokens" in v and v["max_tokens"] > ceiling:
        return _KeyError("max_tokens", f"{v['max_tokens']} is above {whose} of {ceiling}")
    return None


class ModelRow(Strict):
    """One operator row of the model table (`models:` in residents.yaml), the shape of residents/models.yaml."""

    family: str = ""
    output_ceiling: int = Field(ge=1, le=1_000_000)
    prefill: bool = False
    images: bool = False
    context_window: int | None = Field(default=None, ge=1_000, le=100_000_000)  # tokens; None: 128,000
    # US dollars per million tokens, for `residents usage`'s estimate; a price not stated is the built-in row's,
    # and the cache's follow the input price as models.yaml's `cache_prices` say.
    input_per_mtok: float | None = Field(default=None, ge=0, le=10_000)
    output_per_mtok: float | None = Field(default=None, ge=0, le=10_000)
    cache_write_per_mtok: float | None = Field(default=None, ge=0, le=10_000)
    cache_read_per_mtok: float | None = Field(default=None, ge=0, le=10_000)


# A checkpoint's cadence, as `every:` writes it: a number and its unit, or several (`1h30m`).
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNIT_SECONDS = (86_400, 3_600, 60, 1)
CHECKPOINT_FLOOR = 1  # seconds: short enough to watch a checkpoint come round, long enough not to flood a channel
CHECKPOINT_CEILING = 7 * 86_400  # a week: a witness should not wait longer for the next head


def duration_seconds(value: object) -> int:
    """`1h`, `30m`, `90s`, `1d`, `1h30m` → seconds; anything else is a ValueError saying how to write one.

    Why by hand: the four units and their sum are the whole grammar; a library would accept forms
    (`1 hour`, ISO 8601, bare numbers) a reader of residents.yaml could read two ways."""
    m = _DURATION.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None or not any(m.groups()):
        raise ValueError("not a duration: a number and its unit (d, h, m, s), like 1h, 30m, 90s or 1h30m")
    seconds = sum(int(n) * unit for n, unit in zip(m.groups(), _UNIT_SECONDS, strict=True) if n)
    if not CHECKPOINT_FLOOR <= seconds <= CHECKPOINT_CEILING:
        raise ValueError(f"must be between {CHECKPOINT_FLOOR}s and {CHECKPOINT_CEILING // 86_400}d")
    return seconds


class Checkpoints(Strict):
    """`ledger.checkpoints`: the chain's head posted in a channel at start and every `every`, for witnesses.

    The process's commands bot posts it (`discord.commands: true`, or the first residence), the same
    bot that answers /provenance; start-up stops if it cannot see or post in `channel`, or if a resident
    listens there (a checkpoint is not in the ledger, so a resident would read it as the room's words)."""

    channel: Annotated[str, AfterValidator(_channel_ref)]  # a name, an id or guild/channel, as `discord.channels`
    every: Annotated[int, BeforeValidator(duration_seconds)]  # seconds, written as a duration (1h, 30m)


def _ledger_location(value: str) -> str:
    """`ledger.db`: a SQLite file's path, or a PostgreSQL server's `postgresql://` URL."""
    scheme = urllib.parse.urlsplit(value).scheme
    if not value.strip():
        raise ValueError("empty: give a path (SQLite) or a postgresql:// URL")
    if "://" in value and scheme not in ("postgresql", "postgres"):
        raise ValueError(f"{scheme}:// is no ledger: give a path (SQLite) or a postgresql:// URL")
    return value


def _ledger_shorthand(value: Any) -> Any:
    """`ledger: PATH-OR-URL` is `ledger: {db: PATH-OR-URL}`."""
    return {"db": value} if isinstance(value, str) else value


class LedgerSettings(Strict):
    # Where the ledger is when no --db is given: a path (relative to the configuration folder) or a URL.
    db: Annotated[str, AfterValidator(_ledger_location)] | None = None
    checkpoints: Checkpoints | None = None


class ProjectFile(Strict):
    """residents.yaml at the root of the configuration folder: settings for every residence there."""

    models: dict[str, ModelRow] = Field(default_factory=dict)
    ledger: Annotated[LedgerSettings, BeforeValidator(_ledger_shorthand)] = LedgerSettings()


# The project-level file: its `models:` rows extend and override residents/models.yaml.
PROJECT_FILE = "residents.yaml"


class _KeyError(ValueError):
    """Raised inside a validator to point at a specific key rather than the whole mapping
    (and at `more` keys with the same problem, each reported on its own line)."""

    def __init__(self, key: str, message: str, more: tuple[str, ...] = ()) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message, self.more = key, message, more
        self.also: tuple[_KeyError, ...] = ()  # further problems of the same mapping, raised together


# ---------------------------------------------------------------- loading with line numbers


def read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """The parsed document and its node tree (for line numbers), or a ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, "", f"cannot be read: {e}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(path, "", "invalid YAML: nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(path, "", f"invalid YAML: {problem}", mark.line + 1 if mark else None) from None
    return data, node


def line_of(node: yaml.Node | None, loc: tuple[str | int, ...]) -> int | None:
    """The 1-based line of the deepest node along loc that the YAML has."""
    best = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == part:
                    best, node = k.start_mark.line + 1, v
                    break
            else:
                return best
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best


def dotted(loc: tuple[str | int, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def first_error(
    e: ValidationError,
    path: Path | str,
    node: yaml.Node | None,
    prefix: tuple[str | int, ...] = (),
    model: type[BaseModel] | None = None,
) -> ConfigError:
    """Turn pydantic's complaints into one error naming file, key and line, carrying every problem."""
    errors = []
    for err in e.errors(include_url=False):
        errors.append(_one_error(err, path, node, prefix, model))
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _KeyError):  # the same problem at further keys of that mapping
            for key in ctx_err.more:
                errors.append(
                    _one_error({**err, "ctx": {"error": _KeyError(key, ctx_err.message)}}, path, node, prefix, model)
                )
            errors += _rule_errors(err, list(ctx_err.also), path, node, prefix, model)
    return ConfigError.combined(errors)


def _rule_errors(
    err: Any,
    rules: list[_KeyError],
    path: Path | str,
    node: yaml.Node | None,
    prefix: tuple[str | int, ...],
    model: type[BaseModel] | None,
) -> list[ConfigError]:
    """The lines for cross-field problems found alongside `err` (each at its key, and its `more` keys)."""
    out = []
    for rule in rules:
        for key in (rule.key, *rule.more):
            out.append(_one_error({**err, "ctx": {"error": _KeyError(key, rule.message)}}, path, node, prefix, model))
    return out


def _one_error(
    err: Any, path: Path | str, node: yaml.Node | None, prefix: tuple[str | int, ...], model: type[BaseModel] | None
) -> ConfigError:
    raw = tuple(err["loc"])
    own = raw[-1:] if err["type"] == "extra_forbidden" else ()  # the user's own key, whatever it is called
    loc = tuple(
        p
        for p in raw[: len(raw) - len(own)]
        if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool", "dict", "list")))
    )
    loc += own
    msg = err["msg"]
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, _KeyError):
        loc, msg = loc + tuple(ctx_err.key.split(".")), ctx_err.message  # a key may be a dotted path
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
        hint = _nearest_key(model, raw[:-1], raw[-1]) if model is not None and raw else None
        if hint:
            msg += f" (did you mean {hint}?)"
    elif err["type"] == "missing":
        msg = "required key is missing"
    elif (
        "input" in err and err["type"] not in ("model_type", "dict_type") and not isinstance(err["input"], (dict, list))
    ):
        msg = f"{msg} (got {err['input']!r})"
    full = prefix + loc
    return ConfigError(path, dotted(full), msg, line_of(node, full))


def _nearest_key(model: type[BaseModel], loc: tuple[str | int, ...], key: object) -> str | None:
    """The valid key at `loc` of `model` a mistyped `key` most probably meant (`max_token` -> `max_tokens`)."""
    keys = _keys_at(model, loc)
    found = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6) if keys else []
    return found[0] if found else None


def _keys_at(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys the mapping at `loc` accepts, following the models' fields, lists and dicts."""
    t: Any = model
    for part in loc:
        m = _model_in(t)
        if m is not None:
            field = next((f for n, f in m.model_fields.items() if part in (n, f.alias)), None)
            if field is None:
                return []
            t = field.annotation
        elif typing.get_origin(_unwrap(t)) in (list, dict):
            t = typing.get_args(_unwrap(t))[-1]
        else:
            return []
    m = _model_in(t)
    return [f.alias or n for n, f in m.model_fields.items()] if m is not None else []


def _unwrap(t: Any) -> Any:
    """`Annotated[X, ...]` as X; `X | Y | None` as its first model member, else its first non-None one."""
    while True:
        origin = typing.get_origin(t)
        if origin is Annotated:
            t = typing.get_args(t)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(t) if a is not type(None)]
            models_ = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
            t = (models_ or members)[0]
        else:
            return t


def _model_in(t: Any) -> type[BaseModel] | None:
    t = _unwrap(t)
    return t if isinstance(t, type) and issubclass(t, BaseModel) else None


def mapping(data: Any, path: Path | str, node: yaml.Node | None, what: str, prefix: tuple = ()) -> dict:
    if data is None and not prefix:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            path,
            dotted(prefix),
            f"a {what} must be a mapping of keys, not {type(data).__name__}",
            line_of(node, prefix),
        )
    return data


def build_policy(
    data: Any, path: Path | str, node: yaml.Node | None, prefix: tuple = (), default_name: str = "inline"
) -> Policy:
    data = dict(mapping(data, path, node, "policy", prefix))
    data.setdefault("name", default_name)
    return validate(Policy, data, path, node, prefix)


def load_policy(name_or_path: str, base: Path) -> Policy:
    return _read_policy(_named(name_or_path, base / "policies"))


def _read_policy(path: Path) -> Policy:
    data, node = read_yaml(path)
    return build_policy(data, path, node, default_name=path.stem)


def load_project(base: Path) -> ProjectFile:
    """residents.yaml of the configuration folder `base`, validated; its defaults when there is none."""
    path = base / PROJECT_FILE
    if not path.is_file():
        return ProjectFile()
    data, node = read_yaml(path)
    return validate(ProjectFile, mapping(data, path, node, "project file"), path, node)


def read_project(path: Path) -> models.ModelTable:
    """The built-in model table with a project file's `models:` rows over it."""
    data, node = read_yaml(path)
    project = validate(ProjectFile, mapping(data, path, node, "project file"), path, node)
    rows = []
    for model_id, r in project.models.items():
        try:
            rows += models.rows_from({model_id: _row_data(model_id, r)}, models.CACHE_PRICES)
        except ValueError as e:
            raise ConfigError(path, dotted(("models", model_id)), str(e), line_of(node, ("models", model_id))) from None
    return models.BUILTIN.with_overrides(rows)


_PRICES = ("input_per_mtok", "output_per_mtok", "cache_write_per_mtok", "cache_read_per_mtok")


def _row_data(model_id: str, r: ModelRow) -> dict[str, Any]:
    """An operator's row as models.yaml writes one; prices it leaves out are the built-in row's for that id."""
    data: dict[str, Any] = r.model_dump(exclude=set(_PRICES))
    builtin = models.BUILTIN.lookup(model_id)
    stated = {f: getattr(r, f) for f in _PRICES if getattr(r, f) is not None}
    if builtin is not None:
        # the cache's prices follow the input price: the built-in ones only with the built-in input price
        taken = _PRICES if "input_per_mtok" not in stated else ("output_per_mtok",)
        stated = {f: getattr(builtin, f) for f in taken if getattr(builtin, f) is not None} | stated
    return data | stated


def use_project_models(base: Path) -> None:
    """Make the model table the one `base` sees: built-ins, plus its residents.yaml rows if it has one."""
    path = base / PROJECT_FILE
    models.use(read_project(path) if path.is_file() else models.BUILTIN)


def _policy_file(pol: str, path: Path | str, node: yaml.Node | None, prefix: tuple, base: Path) -> Path:
    """policies/NAME.yaml for a residence's `policy: NAME`; a path (or anything that could leave
    policies/) is an error, so a residence file cannot make the bot read a file elsewhere."""
    suffix = Path(pol).suffix if Path(pol).suffix in (".yaml", ".yml") else ""
    if not _POLICY_NAME.fullmatch(pol[: len(pol) - len(suffix)]):
        raise ConfigError(
            path,
            dotted(prefix + ("policy",)),
            f"{pol!r} is not a policy name: a policy is a name under policies/ (letters, digits, "
            "'_', '-', '.'; no '/' or leading '.') or an inline mapping, never a path",
            line_of(node, prefix + ("policy",)),
        )
    return base / "policies" / (pol if suffix else f"{pol}.yaml")


_POLICY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def build_residence(data: Any, path: Path | str, node: yaml.Node | None, base: Path, prefix: tuple = ()) -> Residence:
    """A residence mapping whose `policy` is a policy name (policies/NAME.yaml) or an inline mapping."""
    use_project_models(base)
    data = dict(mapping(data, path, node, "residence", prefix))
    try:
        data["policy"] = _residence_policy(data.get("policy", "default"), path, node, base, prefix)
    except ConfigError as e:  # the residence's own keys are checked too, so every problem is reported at once
        data["policy"] = Policy()
        try:
            validate(Residence, data, path, node, prefix)
        except ConfigError as more:
            raise ConfigError.combined([e, more]) from None
        raise
    return validate(Residence, data, path, node, prefix)


def _residence_policy(pol: Any, path: Path | str, node: yaml.Node | None, base: Path, prefix: tuple) -> Policy:
    if isinstance(pol, str):
        pol_path = _policy_file(pol, path, node, prefix, base)
        if not pol_path.exists() and pol == "default":
            return Policy()
        try:
            return _read_policy(pol_path)
        except ConfigError as e:
            if e.message == "file not found":
                raise ConfigError(
                    path,
                    dotted(prefix + ("policy",)),
                    f"no policy named {pol!r} ({pol_path})",
                    line_of(node, prefix + ("policy",)),
                ) from None
            raise
    if isinstance(pol, dict):
        return build_policy(pol, path, node, prefix + ("policy",))
    raise ConfigError(
        path, dotted(prefix + ("policy",)), "must be a policy name or a mapping", line_of(node, prefix + ("policy",))
    )


def validate(model: type[M], data: Any, path: Path | str, node: yaml.Node | None, prefix: tuple = ()) -> M:
    """Validate, turning pydantic's complaints into a ConfigError (its first line, and every problem)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        found = first_error(e, path, node, prefix, model)
        rules = getattr(model, "cross_field_problems", None)
        if rules is not None and isinstance(data, dict):
            invalid = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
            anchor = {"loc": (), "type": "value_error", "msg": ""}
            more = _rule_errors(anchor, rules(data, invalid), path, node, prefix, model)
            found = ConfigError.combined([found, *more])
        raise found from None


def load_residence(name_or_path: str, base: Path) -> Residence:
    path = _named(name_or_path, base / "residences")
    data, node = read_yaml(path)
    res = build_residence(data, path, node, base)
    return res


def load_all_residences(base: Path) -> list[Residence]:
    folder = base / "residences"
    return [load_residence(str(p), base) for p in sorted(folder.glob("*.yaml"))]


def _named(name_or_path: str, folder: Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return p if p.is_absolute() or p.exists() else (folder.parent / p)
    return folder / f"{name_or_path}.yaml"
