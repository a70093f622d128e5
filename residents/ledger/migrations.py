"""Small named schema steps, applied once each, in order, and recorded in `_migrations`.

A step is never edited after it ships; a change is a new step, so any old ledger file upgrades.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from . import appending, chain, rows
from .connection import Connection, Session
from .postgres import MIGRATE_LOCK
from .schema_postgres import BASELINE, BASELINE_UPTO

log = logging.getLogger(__name__)

MIGRATIONS: list[tuple[str, str | Callable[[sqlite3.Connection], None]]] = []
# Each step after PostgreSQL's baseline (`schema_postgres`, which stands for m001…m044) in PostgreSQL's
# words, by name: a step without one stops a PostgreSQL ledger's migration, naming it.
POSTGRESQL: dict[str, str | Callable[[Session], None]] = {}


def step(name: str, sql: str, postgresql: str | None = None) -> None:
    """A step; `postgresql`: the same step in PostgreSQL's words (types BIGINT, DOUBLE PRECISION, BYTEA:
    `schema_postgres`). Every step after the baseline needs one, even when the text is the same: a
    PostgreSQL ledger's migration stops at a step without one, naming it, rather than guess."""
    MIGRATIONS.append((name, sql))
    if postgresql is not None:
        POSTGRESQL[name] = postgresql


def pystep(name: str, run: Callable[[sqlite3.Connection], None]) -> None:
    """A step SQL alone cannot express (rewriting rows by content); it runs in the connection's thread,
    inside the step's transaction."""
    MIGRATIONS.append((name, run))


# Text columns are BLOBs of UTF-8 (surrogates passed through), so every emitted text is kept
# byte-exact, even a lone surrogate a provider's JSON escapes can carry.
step(
    "m001_generations",
    """
CREATE TABLE generations (
  id TEXT PRIMARY KEY,
  residence TEXT NOT NULL,
  channel TEXT NOT NULL,
  model TEXT NOT NULL,
  status TEXT NOT NULL,
  stop_reason TEXT,
  text BLOB NOT NULL DEFAULT x'',
  chars INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER,
  standing TEXT NOT NULL,
  continuation_ended TEXT NOT NULL,
  trigger TEXT,
  request BLOB,
  created_at REAL NOT NULL,
  finished_at REAL
);
CREATE INDEX generations_residence ON generations(residence, created_at);
""",
)

step(
    "m002_attempts",
    """
CREATE TABLE attempts (
  id TEXT PRIMARY KEY,
  generation_id TEXT NOT NULL REFERENCES generations(id),
  segment INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  outcome TEXT NOT NULL,
  stop_reason TEXT,
  discard_reason TEXT,
  error TEXT,
  text BLOB NOT NULL DEFAULT x'',
  chars INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER,
  request_id TEXT,
  replaced_by TEXT,
  started_at REAL NOT NULL,
  ended_at REAL
);
CREATE INDEX attempts_generation ON attempts(generation_id, segment, idx);
CREATE TABLE attempt_chunks (
  attempt_id TEXT NOT NULL REFERENCES attempts(id),
  seq INTEGER NOT NULL,
  text BLOB NOT NULL,
  PRIMARY KEY (attempt_id, seq)
);
""",
)

step(
    "m003_segments",
    """
CREATE TABLE segments (
  generation_id TEXT NOT NULL REFERENCES generations(id),
  idx INTEGER NOT NULL,
  attempt_id TEXT NOT NULL REFERENCES attempts(id),
  stop_reason TEXT,
  chars INTEGER NOT NULL,
  output_tokens INTEGER,
  overlap_removed INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (generation_id, idx)
);
""",
)

step(
    "m004_stumps",
    """
CREATE TABLE stumps (
  id TEXT PRIMARY KEY,
  generation_id TEXT NOT NULL REFERENCES generations(id),
  attempt_id TEXT,
  residence TEXT NOT NULL,
  scope TEXT NOT NULL,          -- 'output': the generation's own text; 'attempt': a text set aside
  cause TEXT NOT NULL,
  text BLOB NOT NULL,
  chars INTEGER NOT NULL,
  output_tokens INTEGER,
  published INTEGER NOT NULL DEFAULT 0,
  replaced_by TEXT,
  created_at REAL NOT NULL
);
CREATE INDEX stumps_residence ON stumps(residence, created_at);
CREATE INDEX stumps_generation ON stumps(generation_id);
""",
)

step(
    "m005_posts",
    """
CREATE TABLE posts (
  id TEXT PRIMARY KEY,
  generation_id TEXT REFERENCES generations(id),  -- NULL for a notice about no generation
  seq INTEGER NOT NULL,
  kind TEXT NOT NULL,
  content BLOB NOT NULL,
  channel TEXT NOT NULL,
  message_id TEXT,
  delivered_at REAL,
  UNIQUE (generation_id, seq)
);
CREATE INDEX posts_message ON posts(message_id);
""",
)

step(
    "m006_attempt_stop_details",
    """
ALTER TABLE attempts ADD COLUMN stop_details TEXT;  -- the provider's JSON, e.g. a refusal's category
""",
)

step(
    "m007_generation_seen_upto",
    """
ALTER TABLE generations ADD COLUMN seen_upto TEXT;  -- the newest room message the request was compiled from
""",
)

# A stump's `published` is a fact about delivery: the moment a text post of its generation gets a
# message id, the generation's standing output stump reached the room. The schema keeps it so, in
# the same statement as the delivery itself.
step(
    "m008_published_on_delivery",
    """
CREATE TRIGGER posts_published AFTER UPDATE OF message_id ON posts
WHEN NEW.message_id IS NOT NULL AND NEW.kind IN ('partial', 'speech')
BEGIN
  UPDATE stumps SET published = 1
   WHERE generation_id = NEW.generation_id AND scope = 'output' AND replaced_by IS NULL AND published = 0;
END;
""",
)

# Every content block of every attempt, in order (`pos`), with the provider's index and declared
# type and its exact content; a text block's `text_offset` is where its text begins in the attempt's
# text (text blocks joined by a paragraph break). While an attempt streams, its chunks name their
# block, so recovery can rebuild the blocks from what reached disk. A stump of scope 'block' is the
# content of a non-text block an output stopped in.
step(
    "m009_blocks",
    """
CREATE TABLE attempt_blocks (
  attempt_id TEXT NOT NULL REFERENCES attempts(id),
  pos INTEGER NOT NULL,
  idx INTEGER NOT NULL,
  type TEXT NOT NULL,
  content BLOB NOT NULL,
  chars INTEGER NOT NULL,
  text_offset INTEGER,
  start TEXT,                   -- the start event's content_block, JSON as given (less its content field)
  extras TEXT,                  -- its other deltas (signature, citations, unknown), JSON as given
  PRIMARY KEY (attempt_id, pos)
);
ALTER TABLE attempt_chunks ADD COLUMN block INTEGER;        -- NULL: text of a ledger before m009
ALTER TABLE attempt_chunks ADD COLUMN block_type TEXT;
ALTER TABLE attempt_chunks ADD COLUMN block_start TEXT;     -- on a block's first chunk
ALTER TABLE stumps ADD COLUMN block INTEGER;                -- scope 'block': the block's provider index
ALTER TABLE stumps ADD COLUMN block_type TEXT;
""",
)

step(
    "m009_request_replacements",
    """
ALTER TABLE attempts ADD COLUMN request_replacements INTEGER NOT NULL DEFAULT 0;  -- lone surrogates sent as U+FFFD
""",
)

# Content goes to the room as valid Unicode (`residents.text.outbound`): the post keeps its exact text, and
# this says how many lone surrogates the room got as U+FFFD instead. NULL: recorded before the count.
step(
    "m013_post_replacements",
    """
ALTER TABLE posts ADD COLUMN replacements INTEGER;
""",
)

# Why each post exists (`residents.records.PostReason`), so `ledger verify` reads meaning from a column and
# never from a post's wording. Rows recorded before this step are derived once, here: a text post
# from its kind, a receipt from its kind, a notice from the wording `residents.truth` gave it when it was
# written (frozen here as it was then); any other notice was an output's no-text line.
step(
    "m016_post_reason",
    """
ALTER TABLE posts ADD COLUMN reason TEXT NOT NULL DEFAULT 'unknown';
UPDATE posts SET reason = CASE
  WHEN kind IN ('speech', 'partial') THEN 'text'
  WHEN kind = 'receipt' THEN 'receipt'
  WHEN CAST(content AS TEXT) LIKE '-# Continuation not available:%' THEN 'declined-continue'
  WHEN CAST(content AS TEXT) LIKE '-# Provider attempt% interrupted and retried;%' THEN 'abandoned-notice'
  WHEN CAST(content AS TEXT) LIKE '-# Provider rejected the API key%' THEN 'key-rejected'
  WHEN CAST(content AS TEXT) LIKE '-# Provider declined this reply%' THEN 'refusal'
  ELSE 'no-text' END;
""",
)


# The resident decides who may read its stumps' text (`stumps` tool, `set_access`): `access` is
# `moderators` or `private`. A new stump starts with its residence's `stumps.default_access`, kept in
# `stump_access_defaults` (written by the generator) and applied by the trigger in the same insert,
# so no stump is ever readable by moderators for a moment against the policy. Each change the
# resident makes is kept in `stump_access_changes`, with the generation whose tool call made it.
step(
    "m020_stump_access",
    """
ALTER TABLE stumps ADD COLUMN access TEXT NOT NULL DEFAULT 'moderators';
CREATE TABLE stump_access_defaults (
  residence TEXT PRIMARY KEY,
  access TEXT NOT NULL
);
CREATE TRIGGER stumps_default_access AFTER INSERT ON stumps
WHEN EXISTS (SELECT 1 FROM stump_access_defaults WHERE residence = NEW.residence)
BEGIN
  UPDATE stumps SET access = (SELECT access FROM stump_access_defaults WHERE residence = NEW.residence)
   WHERE id = NEW.id;
END;
CREATE TABLE stump_access_changes (
  stump_id TEXT NOT NULL REFERENCES stumps(id),
  access TEXT NOT NULL,
  set_by TEXT NOT NULL,          -- the residence
  generation_id TEXT,            -- the generation whose tool call set it
  set_at REAL NOT NULL
);
CREATE INDEX stump_access_changes_stump ON stump_access_changes(stump_id, set_at);
""",
)

# Every read of a stump's text, by its resident's tool or a moderator's /stumps show.
step(
    "m021_stump_reads",
    """
CREATE TABLE stump_reads (
  stump_id TEXT NOT NULL REFERENCES stumps(id),
  reader TEXT NOT NULL,          -- the residence, or the moderator (name and Discord id)
  reader_kind TEXT NOT NULL,     -- 'resident' | 'moderator'
  generation_id TEXT,            -- a resident's read: the generation whose tool call read it
  read_at REAL NOT NULL
);
CREATE INDEX stump_reads_stump ON stump_reads(stump_id, read_at);
""",
)

# The tool loop: each tool call a generation made, by round (the request it answered) and position
# in that round, with the attempt that made it, its input as parsed (JSON) and the result sent back.
step(
    "m022_tool_calls",
    """
CREATE TABLE tool_calls (
  generation_id TEXT NOT NULL REFERENCES generations(id),
  round INTEGER NOT NULL,
  pos INTEGER NOT NULL,
  attempt_id TEXT NOT NULL REFERENCES attempts(id),
  tool_use_id TEXT NOT NULL,
  name TEXT NOT NULL,
  input BLOB NOT NULL,           -- JSON; the streamed input JSON is the attempt's tool_use block
  result BLOB NOT NULL,          -- JSON object sent back in the tool_result block
  is_error INTEGER NOT NULL,
  created_at REAL NOT NULL,
  PRIMARY KEY (generation_id, round, pos)
);
""",
)

# A stump published at its resident's request: posts of kind 'recovered' (its text) and the one
# receipt after them name the stump; they belong to the stump's generation. Delivering a recovered
# post marks the stump published, as m008 does for a generation's own text.
step(
    "m023_recovered_posts",
    """
ALTER TABLE posts ADD COLUMN stump_id TEXT;
CREATE INDEX posts_stump ON posts(stump_id) WHERE stump_id IS NOT NULL;
CREATE TRIGGER posts_recovered_published AFTER UPDATE OF message_id ON posts
WHEN NEW.message_id IS NOT NULL AND NEW.kind = 'recovered' AND NEW.stump_id IS NOT NULL
BEGIN
  UPDATE stumps SET published = 1 WHERE id = NEW.stump_id AND published = 0;
END;
""",
)
# The hash chain (`residents.ledger.chain`): every settled generation, stump, post and delivery appended as
# an entry whose hash covers the entry before it, in the same transaction as the change it records.
# `kind` and `record` repeat the entry's own fields, for lookups. Append-only: an UPDATE or DELETE is
# refused here (a determined editor can drop the triggers, which `ledger verify` then shows).
step(
    "m025_chain",
    """
CREATE TABLE chain (
  seq INTEGER PRIMARY KEY,      -- 1, 2, 3 ... in the order appended
  kind TEXT NOT NULL,           -- generation | stump | post | delivered | genesis | ...
  record TEXT,                  -- the id of the record it attests (NULL for genesis)
  prev TEXT NOT NULL,           -- the previous entry's hash; 64 zeros for the first
  body TEXT NOT NULL,           -- the entry: canonical JSON, ASCII
  hash TEXT NOT NULL            -- SHA-256, lowercase hex, of {"entry":body,"prev":prev,"seq":seq} canonical
);
CREATE INDEX chain_record ON chain(record, seq);
CREATE TRIGGER chain_no_update BEFORE UPDATE ON chain BEGIN SELECT RAISE(ABORT, 'the chain is append-only'); END;
CREATE TRIGGER chain_no_delete BEFORE DELETE ON chain BEGIN SELECT RAISE(ABORT, 'the chain is append-only'); END;
""",
)

# A reply shown live (policy `delivery.live`): every message created while it was generated, with
# what it showed last (without the in-progress marker). `state`: live (in progress), adopted (became
# post `post_id` of the settled reply), set-aside (the text of a retried attempt: a published stump),
# withdrawn (left in progress by a stopped process; removed from the room at the next start).
step(
    "m030_live_messages",
    """
CREATE TABLE live_messages (
  nonce TEXT PRIMARY KEY,           -- recorded before the message is sent: a stop mid-send leaves it findable
  message_id TEXT UNIQUE,           -- NULL until the room answered the send
  generation_id TEXT NOT NULL REFERENCES generations(id),
  attempt_id TEXT NOT NULL REFERENCES attempts(id),
  idx INTEGER NOT NULL,
  channel TEXT NOT NULL,
  residence TEXT NOT NULL,
  content BLOB NOT NULL,
  state TEXT NOT NULL DEFAULT 'live',
  post_id TEXT REFERENCES posts(id),
  stump_id TEXT REFERENCES stumps(id),
  created_at REAL NOT NULL,
  UNIQUE (attempt_id, idx)
);
CREATE INDEX live_messages_generation ON live_messages(generation_id);
""",
)


# The reads people and start-up make, each an index seek or an ORDER BY ... LIMIT walked on an index,
# never a scan of a big table (tests/test_ledger_scale.py checks every one with EXPLAIN QUERY PLAN):
# `ledger list` and `ledger stumps` newest first, the stumps of one cause, crash settlement's pending
# generations and streaming attempts, a residence's latest generation in a channel (/continue), live
# messages left in progress. (Undelivered posts are found on `posts_message`, by their NULL message id.)
step(
    "m031_read_indexes",
    """
CREATE INDEX generations_created ON generations(created_at);
CREATE INDEX generations_pending ON generations(created_at) WHERE status = 'pending';
CREATE INDEX stumps_created ON stumps(created_at);
CREATE INDEX stumps_cause ON stumps(cause, created_at);
CREATE INDEX attempts_streaming ON attempts(generation_id) WHERE outcome = 'streaming';
CREATE INDEX generations_channel ON generations(residence, channel, created_at);
CREATE INDEX live_messages_live ON live_messages(residence, created_at) WHERE state = 'live';
""",
)

# Whether a generation has its own posts planned (any post not publishing a stump), kept by the schema
# in the same insert as the post, so start-up finds settled generations with none through an index
# of only those (`Ledger.generations_without_posts`) instead of reading every generation.
step(
    "m032_generation_planned",
    """
ALTER TABLE generations ADD COLUMN planned INTEGER NOT NULL DEFAULT 0;
UPDATE generations SET planned = 1
 WHERE EXISTS (SELECT 1 FROM posts p WHERE p.generation_id = generations.id AND p.stump_id IS NULL);
CREATE TRIGGER posts_planned AFTER INSERT ON posts
WHEN NEW.generation_id IS NOT NULL AND NEW.stump_id IS NULL
BEGIN
  UPDATE generations SET planned = 1 WHERE id = NEW.generation_id AND planned = 0;
END;
CREATE INDEX generations_unplanned ON generations(created_at) WHERE planned = 0 AND status != 'pending';
""",
)


# A generation's request stored by content (`residents.ledger.requests`): each part of its messages (a room
# line of a text message, or a whole message of blocks) once in `request_parts`, keyed by its SHA-256;
# the generation keeps `request_ref`, the request less its messages' text plus the parts' keys. So a
# busy room's ledger grows with what was said, not with the history repeated in every turn's request.
# The conversion of rows written before this step is `m034_request_parts_convert` (Python, below).
step(
    "m033_request_parts",
    """
CREATE TABLE request_parts (
  id INTEGER PRIMARY KEY,       -- the SHA-256's first 8 bytes, a signed big-endian integer
  sha256 BLOB NOT NULL,         -- the whole SHA-256 of body
  body BLOB NOT NULL            -- UTF-8, lone surrogates passed through
);
CREATE TRIGGER request_parts_collision BEFORE INSERT ON request_parts
WHEN EXISTS (SELECT 1 FROM request_parts WHERE id = NEW.id AND sha256 != NEW.sha256)
BEGIN
  SELECT RAISE(ABORT, 'two request parts share the first 8 bytes of their SHA-256');
END;
ALTER TABLE generations ADD COLUMN request_ref BLOB;  -- JSON (bot.ledger.requests); NULL: see `request`
""",
)


def _convert_requests(conn: sqlite3.Connection) -> None:
    """Store the requests of rows written before m033 by content; a row whose JSON would not come back
    byte for byte stays as it was (in `request`), so no request ever reads back different."""
    from .requests import Part, pack, unpack_bytes

    known: set[int] = set()  # parts written in this step (bounded: INSERT OR IGNORE keeps it right anyway)
    memo: dict[str, Part] = {}  # lines seen in this step: each is hashed once however many requests carry it
    last = -1
    while True:
        rows = conn.execute(
            "SELECT rowid, request FROM generations WHERE rowid > $1 AND request IS NOT NULL ORDER BY rowid LIMIT 500",
            (last,),
        ).fetchall()
        if not rows:
            return
        for rowid, blob in rows:
            last = rowid
            if len(memo) > 100_000 or len(known) > 1_000_000:
                memo.clear()
                known.clear()
            if not isinstance(blob, bytes):  # not as the ledger writes it (a TEXT value): left as it is
                continue
            try:
                packed = pack(json.loads(blob.decode("utf-8", "surrogatepass")), memo)
                parts = {p.id: p.body for p in packed.parts}
                back = unpack_bytes(packed.ref, parts)
            except (ValueError, TypeError, RecursionError):  # not JSON, not UTF-8, nested too deep: left whole
                continue
            if back != blob:
                continue
            conn.executemany(
                "INSERT OR IGNORE INTO request_parts (id, sha256, body) VALUES ($1,$2,$3)",
                [(p.id, p.sha256, p.body) for p in packed.parts if p.id not in known],
            )
            known.update(parts)
            conn.execute("UPDATE generations SET request_ref=$1, request=NULL WHERE rowid=$2", (packed.ref, rowid))


pystep("m034_request_parts_convert", _convert_requests)


# The files a generation's request was compiled with (`residents.context.attachments`): each by name, type,
# size and SHA-256, never its bytes, and how it was shown (`shown`: image | text | described; `reason`:
# why one was described). The stored request holds each image as a reference to the same SHA-256.
step(
    "m040_attachments",
    """
CREATE TABLE attachments (
  generation_id TEXT NOT NULL REFERENCES generations(id),
  message_id TEXT NOT NULL,         -- the room message it was attached to
  position INTEGER NOT NULL,        -- its place among that message's attachments, from 0
  name TEXT NOT NULL,
  media_type TEXT,                  -- from its bytes where read (magic numbers), else as the room declared it
  size INTEGER NOT NULL,            -- bytes
  sha256 TEXT,                      -- NULL when its bytes were not read (over every limit, or not fetched)
  shown TEXT NOT NULL,
  reason TEXT,
  PRIMARY KEY (generation_id, message_id, position)
);
""",
)


# A record's latest entry of one kind (what `verify` holds the record against, what Provenance names) is
# one seek on an index that covers it; with (record, seq) alone SQLite read every entry of the record
# (a post has its `post` and `delivered` entries) from the table to test its kind.
step(
    "m041_chain_record_kind",
    """
CREATE INDEX chain_record_kind ON chain(record, kind, seq);
DROP INDEX chain_record;
""",
)


# A post the room refused try after try (HTTP 400, 403, 404) is set aside, never delivered: `refused` is the
# refusal as the room gave it ("403 Forbidden (error code: 50013): Missing Permissions"), `refused_at` when,
# `refused_status` and `refused_code` the HTTP status and Discord's error code (what its chain entry states).
# Few posts are: `verify` and the chain read them on their own partial index.
step(
    "m043_refused_posts",
    """
ALTER TABLE posts ADD COLUMN refused TEXT;
ALTER TABLE posts ADD COLUMN refused_at REAL;
ALTER TABLE posts ADD COLUMN refused_status INTEGER;
ALTER TABLE posts ADD COLUMN refused_code INTEGER;
CREATE INDEX posts_refused ON posts(id) WHERE refused IS NOT NULL;
""",
)
# Which of a channel's messages a resident has already answered (`Ledger.answered`, asked when it catches up
# on mentions missed across a new gateway session): one seek per message id, not a walk of its generations.
step(
    "m044_generations_trigger",
    """
CREATE INDEX generations_trigger ON generations(trigger, residence) WHERE trigger IS NOT NULL;
""",
)

# What each provider call cost, as the provider counted it (`residents usage`, /usage, daily budgets): input
# neither read from nor written to its prompt cache, input written to it, input read from it (output_tokens
# is m001's); NULL where the provider gave no count. Budgets sum a day's attempts (`attempts_started`) and,
# per person, the generations a person's mention asked for (`generations.person`: their room user id). A
# reply a spent budget refused is recorded, and the one notice a channel gets of it a day (`post_id`; NULL
# for a refusal the channel had already been told of that day).
step(
    "m045_usage_budgets",
    """
ALTER TABLE attempts ADD COLUMN input_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN cache_write_tokens INTEGER;
ALTER TABLE attempts ADD COLUMN cache_read_tokens INTEGER;
CREATE INDEX attempts_started ON attempts(started_at);
ALTER TABLE generations ADD COLUMN person TEXT;
CREATE TABLE budget_refusals (
  id TEXT PRIMARY KEY,
  residence TEXT NOT NULL,
  channel TEXT NOT NULL,
  trigger TEXT,                 -- the room message a reply was asked for
  person TEXT,                  -- its author's room user id
  scope TEXT NOT NULL,          -- residence | person: whose budget was spent
  tokens TEXT NOT NULL,         -- input | output: which budget
  budget INTEGER NOT NULL,      -- the daily budget, in tokens
  spent INTEGER NOT NULL,       -- tokens counted that day when the reply was refused
  day TEXT NOT NULL,            -- the UTC day, YYYY-MM-DD
  post_id TEXT,                 -- the notice posted of it, or NULL
  created_at REAL NOT NULL
);
CREATE INDEX budget_refusals_told ON budget_refusals(residence, channel, day) WHERE post_id IS NOT NULL;
CREATE INDEX budget_refusals_trigger ON budget_refusals(trigger, residence) WHERE trigger IS NOT NULL;
""",
    postgresql="""
ALTER TABLE attempts ADD COLUMN input_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN cache_write_tokens BIGINT;
ALTER TABLE attempts ADD COLUMN cache_read_tokens BIGINT;
CREATE INDEX attempts_started ON attempts(started_at);
ALTER TABLE generations ADD COLUMN person TEXT;
CREATE TABLE budget_refusals (
  id TEXT PRIMARY KEY,
  residence TEXT NOT NULL,
  channel TEXT NOT NULL,
  trigger TEXT,
  person TEXT,
  scope TEXT NOT NULL,
  tokens TEXT NOT NULL,
  budget BIGINT NOT NULL,
  spent BIGINT NOT NULL,
  day TEXT NOT NULL,
  post_id TEXT,
  created_at DOUBLE PRECISION NOT NULL,
  rowid BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE
);
CREATE INDEX budget_refusals_told ON budget_refusals(residence, channel, day) WHERE post_id IS NOT NULL;
CREATE INDEX budget_refusals_trigger ON budget_refusals(trigger, residence) WHERE trigger IS NOT NULL;
""",
)

# Several `residents run` processes on one PostgreSQL ledger (`residents.ledger.leases`): who runs, and which
# process drives each bot (or shard of one) under a lease. Operational state, not records: no chain entry
# is made of these rows, and `verify` reads none of them. Times are the database's clock, in seconds.
# SQLite keeps one process by its file lock; the tables are made there too, and stay empty.
step(
    "m046_processes_leases",
    """
CREATE TABLE processes (
  id INTEGER PRIMARY KEY,
  host TEXT NOT NULL,
  pid INTEGER NOT NULL,
  started_at REAL NOT NULL,
  heartbeat_at REAL NOT NULL,
  lease_seconds REAL NOT NULL,  -- its lease length: alive while its heartbeat is younger than this
  stopped_at REAL
);
CREATE TABLE leases (
  unit TEXT PRIMARY KEY,        -- a residence's name, or NAME#SHARD for one shard of a sharded bot
  residence TEXT NOT NULL,
  shard INTEGER,                -- the shard id, or NULL for the whole bot
  holder INTEGER REFERENCES processes(id),
  epoch INTEGER NOT NULL DEFAULT 0,
  acquired_at REAL,
  expires_at REAL
);
""",
    postgresql="""
CREATE TABLE processes (
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  host TEXT NOT NULL,
  pid BIGINT NOT NULL,
  started_at DOUBLE PRECISION NOT NULL,
  heartbeat_at DOUBLE PRECISION NOT NULL,
  lease_seconds DOUBLE PRECISION NOT NULL,
  stopped_at DOUBLE PRECISION
);
CREATE TABLE leases (
  unit TEXT PRIMARY KEY,
  residence TEXT NOT NULL,
  shard BIGINT,
  holder BIGINT REFERENCES processes(id),
  epoch BIGINT NOT NULL DEFAULT 0,
  acquired_at DOUBLE PRECISION,
  expires_at DOUBLE PRECISION
);
""",
)


# Which room messages a resident has taken a turn on (`Ledger.claim_reply`): claimed once, before any
# provider call, so a message re-delivered by the gateway, caught up after a reconnect or seen by another
# process gets no second reply. Claims for ledgers from before it are read from what answered a message
# then: a generation's trigger, or a reply a spent budget refused. (Independent of m046: it reads and
# writes only tables that m045 and before made.)
step(
    "m047_reply_claims",
    """
CREATE TABLE reply_claims (
  residence TEXT NOT NULL,
  trigger TEXT NOT NULL,        -- the room message a turn was taken on
  channel TEXT NOT NULL,
  claimed_at REAL NOT NULL,
  PRIMARY KEY (residence, trigger)
);
INSERT INTO reply_claims (residence, trigger, channel, claimed_at)
  SELECT residence, trigger, channel, min(created_at) FROM (
    SELECT residence, trigger, channel, created_at FROM generations WHERE trigger IS NOT NULL
    UNION ALL SELECT residence, trigger, channel, created_at FROM budget_refusals WHERE trigger IS NOT NULL
  ) GROUP BY residence, trigger;
""",
    postgresql="""
CREATE TABLE reply_claims (
  residence TEXT NOT NULL,
  trigger TEXT NOT NULL,
  channel TEXT NOT NULL,
  claimed_at DOUBLE PRECISION NOT NULL,
  rowid BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE,
  PRIMARY KEY (residence, trigger)
);
INSERT INTO reply_claims (residence, trigger, channel, claimed_at)
  SELECT residence, trigger, min(channel), min(created_at) FROM (
    SELECT residence, trigger, channel, created_at FROM generations WHERE trigger IS NOT NULL
    UNION ALL SELECT residence, trigger, channel, created_at FROM budget_refusals WHERE trigger IS NOT NULL
  ) AS answered GROUP BY residence, trigger;
""",
)


# A file's name and type are kept as the room gave them, byte-exact: BLOBs of UTF-8 with surrogates passed
# through (`attachments._blob`), which SQLite's TEXT columns hold as they are but PostgreSQL's baseline
# declared TEXT, refusing every attachment there. No ledger on PostgreSQL can hold a row yet, so the
# conversion has nothing to convert; on SQLite there is nothing to do.
step(
    "m048_attachments_bytes",
    "-- SQLite keeps a BLOB in a TEXT column as it is",
    postgresql="""
ALTER TABLE attachments
  ALTER COLUMN name TYPE BYTEA USING convert_to(name, 'UTF8'),
  ALTER COLUMN media_type TYPE BYTEA USING convert_to(media_type, 'UTF8');
""",
)


# A moderator's /continue for a resident whose bot another `residents run` process drives
# (`residents.ledger.continue_requests`): asked by the commands bot's process, taken at most once by the
# bot's lease holder, answered there. Operational state like `leases`: no chain entry, `verify` reads none;
# on SQLite the table is made and stays empty.
step(
    "m049_continue_requests",
    """
CREATE TABLE continue_requests (
  id INTEGER PRIMARY KEY,
  generation TEXT NOT NULL,
  residence TEXT NOT NULL,
  channel TEXT NOT NULL,
  segments INTEGER NOT NULL,     -- the segments the asker saw: a second request meanwhile is declined
  asked_by INTEGER REFERENCES processes(id),
  asked_at REAL NOT NULL,
  deadline REAL NOT NULL,        -- no process takes it after this (the asker has told the moderator so)
  taken_by INTEGER REFERENCES processes(id),
  taken_at REAL,
  given_up_at REAL,              -- the asker stopped waiting before anyone took it: nobody ever will
  answer TEXT,                   -- the moderator's answer, written by the process that took it
  answered_at REAL
);
""",
    postgresql="""
CREATE TABLE continue_requests (
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  generation TEXT NOT NULL,
  residence TEXT NOT NULL,
  channel TEXT NOT NULL,
  segments BIGINT NOT NULL,
  asked_by BIGINT REFERENCES processes(id),
  asked_at DOUBLE PRECISION NOT NULL,
  deadline DOUBLE PRECISION NOT NULL,
  taken_by BIGINT REFERENCES processes(id),
  taken_at DOUBLE PRECISION,
  given_up_at DOUBLE PRECISION,
  answer TEXT,
  answered_at DOUBLE PRECISION
);
CREATE INDEX continue_requests_pending ON continue_requests(residence) WHERE taken_by IS NULL AND given_up_at IS NULL;
""",
)


class MigrationError(Exception):
    """A step this backend has no form of."""


def _apply_postgresql(conn: Session) -> list[str]:
    """PostgreSQL: every step not yet recorded, under a session-level advisory lock of the migrations' own
    (`postgres.MIGRATE_LOCK`: held across transactions, so a step that cannot run inside one stays covered)
    and in one transaction under the ledger's write lock, so two processes migrating at once apply each step
    once: the second waits, then finds them applied. A new database gets the baseline, recorded as the
    steps it stands for."""
    conn.execute("SELECT pg_advisory_lock($1)", (MIGRATE_LOCK,))
    try:
        return _apply_postgresql_locked(conn)
    finally:
        conn.execute("SELECT pg_advisory_unlock($1)", (MIGRATE_LOCK,))


def _apply_postgresql_locked(conn: Session) -> list[str]:
    conn.begin_write()
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL,"
            " rowid BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE)"
        )
        done = {r[0] for r in conn.execute("SELECT name FROM _migrations").fetchall()}
        names = [name for name, _ in MIGRATIONS]
        applied: list[str] = []
        if not done:
            conn.executescript(BASELINE)
            applied = names[: names.index(BASELINE_UPTO) + 1]
            conn.executemany(
                "INSERT INTO _migrations (name, applied_at) VALUES ($1, $2)", [(n, time.time()) for n in applied]
            )
            done.update(applied)
        for name in names:
            if name in done:
                continue
            sql = POSTGRESQL.get(name)
            if sql is None:
                raise MigrationError(f"migration {name} has no PostgreSQL form")
            if callable(sql):
                sql(conn)
            else:
                conn.executescript(sql)
            conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ($1, $2)", (name, time.time()))
            applied.append(name)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return applied


async def apply(db: Connection) -> list[str]:
    """Apply every step not yet recorded; returns the names applied now."""
    if db.dialect == "postgresql":
        applied = await db.run(_apply_postgresql)
        for name in applied:
            log.info("ledger migration applied: %s", name)
        return applied
    await db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    done = {r[0] for r in await db.execute_fetchall("SELECT name FROM _migrations")}
    applied = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        if await db.run(_apply_sqlite_step, name, sql):
            log.info("ledger migration applied: %s", name)
            applied.append(name)
    return applied


def _apply_sqlite_step(conn: Session, name: str, sql: str | Callable[[sqlite3.Connection], None]) -> bool:
    """One step in one `BEGIN IMMEDIATE` transaction (the file's write lock taken first), recorded before
    it runs, on the connection's thread: False when another connection applied it meanwhile (its record
    there once the lock was ours). Two processes migrating one file at once apply each step once."""
    if callable(sql):
        conn.begin_write()
        try:
            if conn.execute("SELECT 1 FROM _migrations WHERE name = $1", (name,)).fetchone() is not None:
                conn.execute("ROLLBACK")
                return False
            conn.execute("INSERT INTO _migrations VALUES ($1, $2)", (name, time.time()))
            sql(conn)  # type: ignore[arg-type]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return True
    # A script runs whole (`executescript` commits anything open first): its own BEGIN IMMEDIATE, its record
    # first, so a step another connection recorded meanwhile fails on `_migrations`' key before it runs.
    try:
        conn.executescript(
            f"BEGIN IMMEDIATE;\nINSERT INTO _migrations VALUES ('{name}', {time.time()});\n{sql}\nCOMMIT;"
        )
    except sqlite3.IntegrityError:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if conn.execute("SELECT 1 FROM _migrations WHERE name = $1", (name,)).fetchone() is not None:
            return False
        raise
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True


# ---------------------------------------------------------------------- the chain of records from before it


async def backfill(db: Connection) -> int:
    """Start the chain of a ledger that has records from before it: a `genesis` entry, then one entry per
    record as it stands now, in one transaction. Nothing on a fresh ledger or one already chained."""
    if await db.execute_fetchall("SELECT 1 FROM chain LIMIT 1"):
        return 0
    if not list(
        await db.execute_fetchall(
            "SELECT EXISTS (SELECT 1 FROM stumps) OR EXISTS (SELECT 1 FROM posts)"
            " OR EXISTS (SELECT 1 FROM generations WHERE status != 'pending')"
        )
    )[0][0]:
        return 0
    await db.run(_begin_write)
    try:
        if await db.execute_fetchall("SELECT 1 FROM chain LIMIT 1"):  # another process began it meanwhile
            await db.execute("ROLLBACK")
            return 0
        count = await db.run(_backfill)  # on the connection's thread, inside this transaction
        await db.execute("COMMIT")
    except BaseException:
        await db.execute("ROLLBACK")
        raise
    log.info("ledger chain begun: %d record(s) from before it backfilled after a genesis entry", count)
    return count


def _begin_write(conn: Session) -> None:
    conn.begin_write()


def _backfill(conn: sqlite3.Connection) -> int:
    """The genesis entry, then each record's entries as it stands now: the ones `verify` holds it against."""
    db = conn.cursor()
    of = {
        table: _by(rows.dicts(db, f"SELECT * FROM {table} ORDER BY rowid"), "generation_id")
        for table in _CHAINED_TABLES
    }
    blocks = _by(rows.dicts(db, "SELECT * FROM attempt_blocks ORDER BY attempt_id, pos"), "attempt_id")
    of["segments"] = _by(rows.dicts(db, "SELECT * FROM segments ORDER BY generation_id, idx"), "generation_id")
    gens = rows.dicts(db, "SELECT * FROM generations ORDER BY rowid")
    records = chain.records(gens, of, blocks, chain.touched(db, ("",))) + chain.refusal_records(db)
    items = [(k, r.id, p) for r in records for k, p in r.expected.items() if p is not None]
    conn.execute(*appending.append("genesis", None, {"backfill": len(items)}))
    conn.executemany(appending.APPEND, [appending.append(k, r, p)[1] for k, r, p in items])
    return len(items)


_CHAINED_TABLES = ("attempts", "stumps", "posts")


def _by(found: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in found:
        out[r[key]].append(r)
    return out
