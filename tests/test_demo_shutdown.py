"""The demo's shutdown: a page asking what each message is, while the demo stops, still gets its answer."""

from __future__ import annotations

import asyncio

import aiohttp

from residents.demo import run as demo_run


async def test_a_page_request_in_flight_at_shutdown_is_answered_from_an_open_ledger(tmp_path):
    demo = await demo_run.start(str(tmp_path / "demo.db"), port=0)
    asked, release = asyncio.Event(), asyncio.Event()
    answer = demo_run._annotator(demo.ledger)

    async def slow(ids: list[str]) -> dict:
        asked.set()
        await release.wait()  # the request is in flight while shutdown begins
        return await answer(ids)

    demo.room.set_annotator(slow)
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.get(f"{demo.room.url}/_room/annotations?ids=1,2"))
        await asyncio.wait_for(asked.wait(), 10)
        stopping = asyncio.create_task(demo_run.shutdown(demo))
        await asyncio.sleep(0.5)  # shutdown runs as far as it can before the request is done
        release.set()
        response = await asyncio.wait_for(request, 10)
        assert response.status == 200, await response.text()
        assert await response.json() == {}
        await asyncio.wait_for(stopping, 30)
