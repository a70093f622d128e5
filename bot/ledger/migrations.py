"""Small named schema steps, applied once each, in order, and recorded in `_migrations`.

A step is never edited after it ships; a change is a new step, so any old ledger file upgrades.
"""
from __future__ import annotations

import logging
import time
import aiosqlite

log = logging.getLogger(__name__)

MIGRATIONS: list[tuple[str, str]] = []


def step(name: str, sql: str) -> None:
    MIGRATIONS.append((name, sql))


# Text columns are BLOBs of UTF-8 (surrogates passed through), so every emitted text is kept
# byte-exact, even a lone surrogate a provider's JSON escapes can carry.
step("m001_generations", """
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
""")

step("m002_attempts", """
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
""")

step("m003_segments", """
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
""")

step("m004_stumps", """
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
""")

step("m005_posts", """
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
""")

step("m006_attempt_stop_details", """
ALTER TABLE attempts ADD COLUMN stop_details TEXT;  -- the provider's JSON, e.g. a refusal's category
""")

step("m007_generation_seen_upto", """
ALTER TABLE generations ADD COLUMN seen_upto TEXT;  -- the newest room message the request was compiled from
""")

# A stump's `published` is a fact about delivery: the moment a text post of its generation gets a
# message id, the generation's standing output stump reached the room. The schema keeps it so, in
# the same statement as the delivery itself.
step("m008_published_on_delivery", """
CREATE TRIGGER posts_published AFTER UPDATE OF message_id ON posts
WHEN NEW.message_id IS NOT NULL AND NEW.kind IN ('partial', 'speech')
BEGIN
  UPDATE stumps SET published = 1
   WHERE generation_id = NEW.generation_id AND scope = 'output' AND replaced_by IS NULL AND published = 0;
END;
""")

# Every content block of every attempt, in order (`pos`), with the provider's index and declared
# type and its exact content; a text block's `text_offset` is where its text begins in the attempt's
# text (text blocks joined by a paragraph break). While an attempt streams, its chunks name their
# block, so recovery can rebuild the blocks from what reached disk. A stump of scope 'block' is the
# content of a non-text block an output stopped in.
step("m009_blocks", """
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
""")

step("m009_request_replacements", """
ALTER TABLE attempts ADD COLUMN request_replacements INTEGER NOT NULL DEFAULT 0;  -- lone surrogates sent as U+FFFD
""")

# Content goes to the room as valid Unicode (`bot.text.outbound`): the post keeps its exact text, and
# this says how many lone surrogates the room got as U+FFFD instead. NULL: recorded before the count.
step("m013_post_replacements", """
ALTER TABLE posts ADD COLUMN replacements INTEGER;
""")

# An on-request output nobody continued was recorded as continuation `disabled`; it is `not-requested`
# (the standing allows a moderator's /continue; none came).
step("m035_on_request_not_requested", """
UPDATE generations SET continuation_ended = 'not-requested'
 WHERE standing = 'on-request' AND continuation_ended = 'disabled';
""")


async def apply(db: aiosqlite.Connection) -> list[str]:
    """Apply every step not yet recorded; returns the names applied now."""
    await db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    done = {r[0] for r in await db.execute_fetchall("SELECT name FROM _migrations")}
    applied = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        await db.executescript(f"BEGIN;\n{sql}\nINSERT INTO _migrations VALUES ('{name}', {time.time()});\nCOMMIT;")
        log.info("ledger migration applied: %s", name)
        applied.append(name)
    return applied
