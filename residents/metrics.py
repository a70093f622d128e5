"""`residents run --metrics-port N`: Prometheus metrics and health checks of one process, on 127.0.0.1.

The metrics are an `Observer` (`residents.observe`): each count is taken where its fact settles (an
attempt's stream ended, a generation settled in the ledger, a post left the outbox, a ledger commit
returned), read from the records there, never from wording. Gauges are read when scraped: each channel's
outbox backlog, each bot's gateway session, whether the ledger takes writes. Everything lives in one
`CollectorRegistry` owned by the run, none in prometheus_client's process-wide default one.

Names follow the OpenTelemetry GenAI conventions where they exist, as Prometheus spells them
(`gen_ai.client.token.usage` → `gen_ai_client_token_usage`, `gen_ai.token.type` → `gen_ai_token_type`);
the rest are `residents_*`. docs/operations.md lists them.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .records import Attempt, Generation, Post, PostKind, Status, Stump

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
# `/readyz` fails while a post has waited in an outbox longer than this (seconds; `--ready-post-age`).
READY_POST_AGE = 120.0

# gen_ai.token.type → the attempt's field holding the provider's count of that kind (None: it gave none).
# `input` is OpenTelemetry's name; the two cache kinds have none there yet. Input counts exclude the cache's.
TOKEN_TYPES: dict[str, str] = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_creation": "cache_write_tokens",
    "cache_read": "cache_read_tokens",
}
# The bucket boundaries OpenTelemetry gives gen_ai.client.token.usage.
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
# ... and gen_ai.client.operation.duration (and time to first chunk), in seconds.
CALL_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

SETTLED = [s.value for s in Status if s is not Status.PENDING]

Sessions = Callable[[], dict[str, bool]]  # residence → whether its bot has a gateway session
Backlog = Callable[[], dict[str, tuple[int, float | None]]]  # channel → posts waiting, oldest queued at


@dataclass
class Sources:
    """What the gauges and `/readyz` read when asked; a run attaches them as its parts start."""

    sessions: Sessions = dict
    backlog: Backlog = dict
    ledger_open: Callable[[], bool] = lambda: False


class Metrics:
    """The run's metrics (an `Observer`) and what `/readyz` decides from them."""

    def __init__(self, residences: Iterable[str], ready_post_age: float = READY_POST_AGE) -> None:
        self.registry = CollectorRegistry()
        self.sources = Sources()
        self.ready_post_age = ready_post_age
        self.ledger_refused = False  # the last ledger commit had a write the disk refused
        r = self.registry
        self.generations = Counter(
            "residents_generations", "Replies settled, by status", ["residence", "status"], registry=r
        )
        self.truncations = Counter(
            "residents_truncations", "Provider streams cut at a ceiling (attempts truncated)", ["residence"], registry=r
        )
        self.stumps = Counter(
            "residents_stumps", "Stumps kept, by cause and scope", ["residence", "cause", "scope"], registry=r
        )
        self.continuations = Counter(
            "residents_continuations",
            "Continuation segments appended: bounded (within the reply) or on-request (/continue)",
            ["residence", "how"],
            registry=r,
        )
        self.attempts = Counter(
            "residents_attempts", "Provider attempts ended, by outcome", ["residence", "outcome"], registry=r
        )
        self.failures = Counter(
            "residents_provider_failures",
            "Provider attempts that failed, by failure kind",
            ["residence", "kind"],
            registry=r,
        )
        self.notices = Counter("residents_notices", "Notices posted, by reason", ["residence", "reason"], registry=r)
        self.posts = Counter(
            "residents_posts_delivered", "Posts in the room, by kind", ["residence", "kind"], registry=r
        )
        self.set_aside = Counter(
            "residents_posts_set_aside", "Posts the room refused try after try, set aside", ["residence"], registry=r
        )
        self.tokens = Histogram(
            "gen_ai_client_token_usage",
            "Tokens per provider attempt as the provider counted them (gen_ai.client.token.usage)",
            ["residence", "gen_ai_request_model", "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.first_chunk = Histogram(
            "gen_ai_client_operation_time_to_first_chunk",
            "Seconds from a provider call to its first content block (gen_ai.client.operation.time_to_first_chunk)",
            ["residence", "gen_ai_request_model"],
            buckets=CALL_BUCKETS,
            unit="seconds",
            registry=r,
        )
        self.call = Histogram(
            "gen_ai_client_operation_duration",
            "Seconds of one provider call, to its stream's end (gen_ai.client.operation.duration)",
            ["residence", "gen_ai_request_model", "error_type"],
            buckets=CALL_BUCKETS,
            unit="seconds",
            registry=r,
        )
        self.turns = Histogram(
            "residents_turn_duration",
            "Seconds of a turn, from taking it up to its posts in the room",
            ["residence"],
            buckets=TURN_BUCKETS,
            unit="seconds",
            registry=r,
        )
        self.commits = Histogram(
            "residents_ledger_commit_duration",
            "Seconds of one ledger commit (a group of changes) in the ledger's thread",
            buckets=COMMIT_BUCKETS,
            unit="seconds",
            registry=r,
        )
        for name in residences:  # present from the first scrape, so a rate starts at zero
            for status in SETTLED:
                self.generations.labels(name, status)
            self.truncations.labels(name)
            for how in ("bounded", "on-request"):
                self.continuations.labels(name, how)
        r.register(_Gauges(self))

    # ------------------------------------------------------------------ the Observer

    def attempt_ended(self, g: Generation, a: Attempt, seconds: float, first_content: float | None) -> None:
        self.attempts.labels(g.residence, a.outcome).inc()
        if a.outcome == "truncated":
            self.truncations.labels(g.residence).inc()
        if a.error:
            self.failures.labels(g.residence, a.error).inc()
        for kind, attr in TOKEN_TYPES.items():
            count = getattr(a, attr, None)
            if count is not None:
                self.tokens.labels(g.residence, g.model, kind).observe(count)
        if first_content is not None:
            self.first_chunk.labels(g.residence, g.model).observe(first_content)
        self.call.labels(g.residence, g.model, a.error or "").observe(seconds)

    def generation_settled(self, g: Generation, *, new: bool, stumps: Sequence[Stump], continuations: int) -> None:
        if new:
            self.generations.labels(g.residence, g.status).inc()
        if continuations > 0:
            self.continuations.labels(g.residence, "bounded" if new else "on-request").inc(continuations)
        for s in stumps:
            self.stumps.labels(g.residence, str(s.cause), s.scope).inc()

    def turn_ended(self, residence: str, channel: str, seconds: float) -> None:
        self.turns.labels(residence).observe(seconds)

    def post_delivered(self, residence: str, post: Post) -> None:
        if post.message_id is None:
            self.set_aside.labels(residence).inc()
            return
        self.posts.labels(residence, post.kind).inc()
        if post.kind == PostKind.NOTICE:
            self.notices.labels(residence, post.reason or "unknown").inc()

    def committed(self, seconds: float, refused: bool) -> None:
        self.commits.observe(seconds)
        self.ledger_refused = refused

    # ------------------------------------------------------------------ health

    def unready(self, now: float | None = None) -> list[str]:
        """Why the process is not ready, one line each; none when it is."""
        now = time.time() if now is None else now
        why = []
        sessions = self.sources.sessions()
        if not sessions:
            why.append("no bot has started")
        why += [f"{name}: no gateway session" for name, has in sessions.items() if not has]
        if not self.sources.ledger_open():
            why.append("the ledger is not open")
        elif self.ledger_refused:
            why.append("the ledger refused a write at its last commit (disk full or an I/O error)")
        for channel, (waiting, since) in sorted(self.sources.backlog().items()):
            if since is not None and now - since > self.ready_post_age:
                why.append(
                    f"outbox {channel}: {waiting} post(s) wait, the oldest for {now - since:.0f}s "
                    f"(more than {self.ready_post_age:g}s)"
                )
        return why


@dataclass(eq=False)  # registered by identity
class _Gauges(Collector):
    """The gauges, read from the run's parts at each scrape."""

    metrics: Metrics
    now: Callable[[], float] = field(default=time.time)

    def collect(self) -> Iterator[Metric]:
        src, now = self.metrics.sources, self.now()
        depth = GaugeMetricFamily("residents_outbox_posts", "Posts waiting in a channel's outbox", labels=["channel"])
        age = GaugeMetricFamily(
            "residents_outbox_oldest_post_age_seconds",
            "Seconds the oldest post waiting in a channel's outbox has waited (0: none waits)",
            labels=["channel"],
        )
        for channel, (waiting, since) in sorted(src.backlog().items()):
            depth.add_metric([channel], waiting)
            age.add_metric([channel], max(0.0, now - since) if since is not None else 0.0)
        sessions = GaugeMetricFamily(
            "residents_gateway_sessions",
            "Gateway sessions of each residence's bot (1: connected)",
            labels=["residence"],
        )
        for name, has in sorted(src.sessions().items()):
            sessions.add_metric([name], 1.0 if has else 0.0)
        writable = GaugeMetricFamily(
            "residents_ledger_writable", "1 while the ledger is open and its last commit wrote everything"
        )
        writable.add_metric([], 1.0 if src.ledger_open() and not self.metrics.ledger_refused else 0.0)
        ready = GaugeMetricFamily("residents_ready", "1 while /readyz answers 200")
        ready.add_metric([], 0.0 if self.metrics.unready(now) else 1.0)
        yield from (depth, age, sessions, writable, ready)


class MetricsPortInUse(Exception):
    """`--metrics-port` names a port that cannot be bound: one line naming the option."""


class MetricsServer:
    """`/metrics`, `/healthz` and `/readyz` on 127.0.0.1, for one run."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self, port: int) -> str:
        """Listen on `port` (0: any free one); the base URL. MetricsPortInUse names `--metrics-port`."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, HOST, port).start()
        except OSError as e:
            await runner.cleanup()
            if e.errno == errno.EADDRINUSE:
                raise MetricsPortInUse(
                    f"--metrics-port {port}: {HOST}:{port} is already in use; pass another port (0: any free port)"
                ) from None
            raise MetricsPortInUse(f"--metrics-port {port}: cannot serve on {HOST}:{port}: {e.strerror or e}") from None
        self._runner = runner
        self.url = f"http://{HOST}:{runner.addresses[0][1]}"
        log.info("metrics on %s/metrics, health on /healthz and /readyz", self.url)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        why = self.metrics.unready()
        if why:
            return web.Response(status=503, text="".join(f"not ready: {line}\n" for line in why))
        return web.Response(text="ready\n")
