"""A record's whole history of chain entries, not only its latest: an edit followed by a fresh entry that
states it (an appended rewrite) is named as the first broken entry, and a witness's saved head says
whether the chain it saw still stands (`ledger verify --head N:SHA256`)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from test_chain import entry_of, replayed, run_verify, sql

from residents import cli
from residents.ledger import Ledger, access, appending, budgets, chain, rows
from residents.records import BudgetRefusal, Refusal


def appended(db: Path, change: str, params: tuple[Any, ...], kind: str, record: str) -> int:
    """`change` made with sqlite, then a fresh `kind` entry for `record` stating the record as it is now,
    appended through the ledger as it appends any entry: returns its seq."""
    sql(db, change, params)

    async def go() -> None:
        async with Ledger.open(db) as lg:
            con = lg.db
            if kind == "post":
                [row] = await con.execute_fetchall("SELECT * FROM posts WHERE id = $1", (record,))
                payload = chain.post_payload(rows.post(row))
            elif kind == "delivered":
                [(mid,)] = await con.execute_fetchall("SELECT message_id FROM posts WHERE id = $1", (record,))
                payload = chain.delivered_payload(record, mid)
            else:
                g = await lg.get_generation(record)
                assert g is not None
                payload = chain.generation_payload(g)
            await lg.transact([appending.append(kind, record, payload)])

    asyncio.run(go())
    return entry_of(db, kind, record)


def saved_head(db: Path) -> str:
    [(seq, digest)] = sql(db, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")
    return f"{seq}:{digest}"


def test_an_appended_rewrite_of_a_posts_content_is_named(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("ceiling",))
    [(pid,)] = sql(db, "SELECT id FROM posts WHERE kind = 'partial' ORDER BY seq LIMIT 1")
    first = entry_of(db, "post", pid)
    head = saved_head(db)
    seq = appended(db, "UPDATE posts SET content = CAST('something else' AS BLOB) WHERE id = ?", (pid,), "post", pid)
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0] == f"chain entry {seq} (post {pid}): post {pid} recorded again (first at entry {first})"
    # a witness who saved the head before the rewrite is not fooled: the head is there, what follows is not
    code, out = run_verify(capsys, "--db", str(db), "--head", head)
    assert code == 1 and out[0] == f"head {head}: in this chain, but entry {seq} is broken (named below)"


def test_an_appended_rewrite_of_a_generations_text_is_named(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("retry",))
    [(gid,)] = sql(db, "SELECT id FROM generations WHERE status = 'completed' LIMIT 1")
    first = entry_of(db, "generation", gid)
    seq = appended(
        db, "UPDATE generations SET text = CAST('other words' AS BLOB) WHERE id = ?", (gid,), "generation", gid
    )
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0] == (
        f"chain entry {seq} (generation {gid}): settled again, but not by a /continue of entry {first}:"
        " that settled it completed (end_turn), and only a cut output is continued"
    )


def test_a_second_settlement_of_a_cut_generation_that_is_not_a_continue_is_named(tmp_path, capsys):
    """Settled again from a cut output, but with no segment added and another text: no /continue writes it."""
    db = replayed(tmp_path, capsys, ("ceiling",))
    [(gid,)] = sql(db, "SELECT id FROM generations WHERE status = 'truncated' LIMIT 1")
    first = entry_of(db, "generation", gid)
    seq = appended(
        db,
        "UPDATE generations SET text = CAST(upper(CAST(text AS TEXT)) AS BLOB) WHERE id = ?",
        (gid,),
        "generation",
        gid,
    )
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0] == (
        f"chain entry {seq} (generation {gid}): settled again, but not by a /continue of entry {first}:"
        " no segment added, but its text_sha256 differs"
    )


def test_a_real_continue_settles_a_generation_again_and_verifies(tmp_path, capsys):
    """The ledger's own second settlement (a /continue on request) is a transition the table allows."""
    db = replayed(tmp_path, capsys, ("on-request",))
    again = sql(db, "SELECT record FROM chain WHERE kind = 'generation' GROUP BY record HAVING count(*) > 1")
    assert again, "the scenario continues no generation"
    assert run_verify(capsys, "--db", str(db))[0] == 0


def test_an_appended_rewrite_of_a_delivered_message_id_is_named(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("ceiling",))
    [(pid,)] = sql(db, "SELECT id FROM posts WHERE kind = 'receipt' LIMIT 1")
    first = entry_of(db, "delivered", pid)
    seq = appended(db, "UPDATE posts SET message_id = '999' WHERE id = ?", (pid,), "delivered", pid)
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0] == (
        f"chain entry {seq} (delivered {pid}): the post was already delivered at entry {first}:"
        " a post is delivered or refused once"
    )


def test_a_stump_access_change_not_by_its_resident_is_named(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("retry",))
    [(sid, residence)] = sql(db, "SELECT id, residence FROM stumps WHERE cause = 'retry-abandoned' LIMIT 1")

    async def choose(by: str) -> None:
        async with Ledger.open(db) as lg:
            await access.set_access(lg, sid, "private", by, None)

    asyncio.run(choose(residence))  # its resident's own choice: allowed
    assert run_verify(capsys, "--db", str(db))[0] == 0
    asyncio.run(choose("someone-else"))
    seq = entry_of(db, "stump-access", sid)
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0] == (
        f"chain entry {seq} (stump-access {sid}): access set by 'someone-else', not by the stump's resident {residence!r}"
    )


def test_a_post_is_delivered_or_refused_once_and_a_history_begins_with_its_record(tmp_path, capsys):
    """`refused` (a post set aside as undeliverable) follows a post once, in place of `delivered`; a
    history that begins with anything but the record's own first entry is broken there."""
    db = replayed(tmp_path, capsys, ("ceiling",))
    [(pid,)] = sql(db, "SELECT id FROM posts WHERE kind = 'receipt' LIMIT 1")
    sql(db, "UPDATE posts SET message_id = NULL WHERE id = ?", (pid,))  # as if never delivered ...
    [(delivered,)] = sql(db, "SELECT max(seq) FROM chain WHERE kind = 'delivered' AND record = ?", (pid,))

    async def append(kind: str, record: str, payload: dict[str, Any]) -> None:
        async with Ledger.open(db) as lg:
            await lg.transact([appending.append(kind, record, payload)])

    asyncio.run(append("refused", pid, {"id": pid, "why": "undeliverable"}))
    refused = entry_of(db, "refused", pid)
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out[0] == (
        f"chain entry {delivered} (delivered {pid}): the record it attests is no longer delivered"
    )
    assert out[1] == (
        f"chain entry {refused} (refused {pid}): the post was already delivered at entry {delivered}:"
        " a post is delivered or refused once"
    )
    asyncio.run(append("delivered", "p-never-posted", {"id": "p-never-posted", "message_id": "1"}))
    code, out = run_verify(capsys, "--db", str(db))
    seq = entry_of(db, "delivered", "p-never-posted")
    assert f"chain entry {seq} (delivered p-never-posted): the record it attests is no longer delivered" in out


def test_a_refused_post_after_its_post_entry_verifies(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("ceiling",))

    async def go() -> None:
        async with Ledger.open(db) as lg:
            g = await lg.latest_generation("cairn")
            assert g is not None
            post = rows.post(
                {"id": "p-refused0000", "generation_id": None, "seq": 99, "kind": "notice",
                 "content": b"-# a notice", "channel": g.channel, "reason": "declined-continue"}
            )  # fmt: skip
            await lg.add_posts([post])
            await lg.mark_refused(post, Refusal(403, 50013, "403 Forbidden (error code: 50013): Missing Permissions"))

    asyncio.run(go())
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 0, out
    # the refusal's status, as its entry states it, is the ledger's: a changed column is named
    sql(db, "UPDATE posts SET refused_status = 404 WHERE id = 'p-refused0000'")
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1 and out == [
        "chain entry 17 (refused p-refused0000): the ledger no longer matches it: status (entry 403, ledger 404)"
    ]


def test_a_saved_head_present_absent_or_rewritten(tmp_path, capsys):
    db = replayed(tmp_path, capsys, ("ceiling",))
    [(seq, digest)] = sql(db, "SELECT seq, hash FROM chain WHERE seq = 3")
    [(last,)] = sql(db, "SELECT max(seq) FROM chain")
    code, out = run_verify(capsys, "--db", str(db), "--head", f"{seq}:{digest}")
    assert code == 0 and out[-1] == (
        f"head {seq}:{digest}: in this chain, and the {last - seq} entries after it are consistent with it"
    )
    code, out = run_verify(capsys, "--db", str(db), "--head", f"{last + 5}:{digest}")
    assert code == 1 and out == [
        f"head {last + 5}:{digest}: not in this chain (it has {last} entries): the chain was cut or replaced"
    ]
    other = "0" * 63 + "1"
    code, out = run_verify(capsys, "--db", str(db), "--head", f"{seq}:{other}")
    assert code == 1 and out == [
        f"head {seq}:{other}: entry {seq} of this chain hashes to {digest}: the chain was rewritten at or before it"
    ]


@pytest.mark.parametrize("given", ["12", "x:" + "a" * 64, "0:" + "a" * 64, "3:" + "A" * 64, "3:abc", "3:" + "g" * 64])
def test_a_malformed_head_is_a_clear_usage_error(tmp_path, capsys, given):
    db = replayed(tmp_path, capsys, ("ceiling",))
    assert cli.main(["ledger", "verify", "--db", str(db), "--head", given]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"residents: --head {given}: not a head; give N:SHA256, N an entry's number and SHA256 its hash"
        " (64 lowercase hex digits)"
    ]


def test_head_gives_the_latest_entry(tmp_path, capsys):
    import sqlite3

    db = replayed(tmp_path, capsys, ("ceiling",))
    con = sqlite3.connect(db)
    try:
        assert chain.head(con) == tuple(sql(db, "SELECT seq, hash FROM chain ORDER BY seq DESC LIMIT 1")[0])
        con.execute("CREATE TEMP TABLE chain (seq INTEGER, hash TEXT)")  # an empty chain shadows it
        assert chain.head(con) is None
    finally:
        con.close()


def test_an_appended_rewrite_of_a_budget_refusal_is_named(tmp_path, capsys):
    """A refused reply's row edited, then an entry stating it as edited appended: its second entry is named
    (a budget refusal is written once), as it is for every other record."""
    db = tmp_path / "ledger.db"
    was = BudgetRefusal("br-1", "cairn", "c-1", "m-1", None, "residence", "output", 10, 12, "2026-12-05", None)

    async def refuse() -> None:
        async with Ledger.open(db) as lg:
            await budgets.refuse(lg, was, [])

    asyncio.run(refuse())
    assert run_verify(capsys, "--db", str(db))[0] == 0
    first = entry_of(db, "budget-refusal", "br-1")
    sql(db, "UPDATE budget_refusals SET spent = 3 WHERE id = 'br-1'")

    async def restate() -> None:
        async with Ledger.open(db) as lg:
            payload = chain.budget_refusal_payload(dataclasses.replace(was, spent=3))
            await lg.transact([appending.append("budget-refusal", "br-1", payload)])

    asyncio.run(restate())
    code, out = run_verify(capsys, "--db", str(db))
    seq = entry_of(db, "budget-refusal", "br-1")
    assert (code, out[0]) == (
        1,
        f"chain entry {seq} (budget-refusal br-1): budget_refusal br-1 recorded again (first at entry {first})",
    )


@pytest.mark.parametrize(
    "tamper",
    ["forged entry", "change deleted", "access edited"],
)
def test_a_stumps_access_is_the_residents_latest_choice_in_ledger_and_chain(tmp_path, capsys, tamper):
    """A stump's access is its resident's choice: an entry claiming a choice the ledger has no row of, a
    choice's row deleted (its stump put back to the default), and the stump's access edited away from its
    latest choice are each named."""
    db = replayed(tmp_path, capsys, ("ceiling",))
    [(sid, res, gid)] = sql(db, "SELECT id, residence, generation_id FROM stumps ORDER BY id LIMIT 1")

    async def choose() -> None:
        async with Ledger.open(db) as lg:
            if tamper == "forged entry":  # the entry alone, as a rewrite of the chain would append it
                payload = chain.stump_access_payload(sid, "private", res, gid)
                await lg.transact([appending.append("stump-access", sid, payload)])
            else:
                await access.set_access(lg, sid, "private", res, gid)

    asyncio.run(choose())
    seq = entry_of(db, "stump-access", sid)
    if tamper == "change deleted":
        sql(db, "DELETE FROM stump_access_changes WHERE stump_id = ?", (sid,))
        sql(db, "UPDATE stumps SET access = 'moderators' WHERE id = ?", (sid,))
    elif tamper == "access edited":
        sql(db, "UPDATE stumps SET access = 'moderators' WHERE id = ?", (sid,))
    code, out = run_verify(capsys, "--db", str(db))
    assert code == 1, out
    if tamper == "access edited":
        assert any(
            f"stump {sid} (generation {gid}): access 'moderators', but its latest change set 'private'" == line
            for line in out
        ), out
    else:
        assert out[0] == f"chain entry {seq} (stump-access {sid}): the record it attests is not in the ledger", out
