"""/continue across processes: carried from the commands bot's process to the one driving the resident's bot.

On a shared PostgreSQL ledger (`residents.ledger.leases`) the moderators' commands run on one bot, in one
process, while a continuation must post as the resident's own bot, which may run in another. The asking
side (`Forwarder.ask`) records a request (`residents.ledger.continue_requests`) and waits for its answer;
every process hears requests (`heard`, on the lease listener's connection) and looks for ones it missed at
each renewal (`sweep`), and the one whose lease covers the bot in the generation's channel takes it and runs
the same continuation as a local /continue (`buttons.continue_in`), writing back the same answer.

The wait is bounded twice. Nobody taking the request within `TAKE_WAIT` (the holder died, its bot is moving)
withdraws it in the row's own lock, so the moderator is told nothing ran and nothing will. Once taken, the
asker waits for the answer while the taker is alive, up to `ANSWER_WAIT` (inside Discord's 15 minutes for a
deferred interaction); past that, it says the request was taken and points at the ledger, which knows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import discord

from .. import truth
from ..ledger import continue_requests as requests
from ..ledger.connection import Connection
from ..records import Generation
from ..resident import Resident
from .buttons import CONTINUE_DELIVERY_WAIT, continue_channel, continue_in
from .checks import FAILED

log = logging.getLogger(__name__)

# How long an asked continuation may wait to be taken: the local path's bound, and a second for the hop.
TAKE_WAIT = CONTINUE_DELIVERY_WAIT + 1.0
# How long a taken one's answer is waited for, while its taker runs: the continuation's provider call and
# its delivery, inside the 15 minutes Discord keeps a deferred interaction open.
ANSWER_WAIT = 600.0
POLL = 0.25  # how often the row is read while waiting: a take is not told, and a notice may be missed


class Forwarder:
    """This process's side of carried /continue requests: asking for residents driven elsewhere, and taking
    and answering those for residents driven here."""

    def __init__(
        self,
        conn: Connection,
        process: int,
        registry: Mapping[str, Resident],
        bots: Mapping[str, discord.Client],
        covers: Callable[[str, str], Awaitable[bool]],
    ) -> None:
        self.conn = conn  # the leases' session: requests never wait behind the ledger's commits
        self.process = process
        self.registry = registry
        self.bots = bots  # the bots this process drives now, by residence
        self.covers = covers  # whether this process's lease covers posting as a residence in a channel now
        self.take_wait = TAKE_WAIT
        self.answer_wait = ANSWER_WAIT
        self._answered: dict[int, asyncio.Event] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self._looking: set[int] = set()  # requests being looked at here now

    def channels(self) -> dict[str, Callable[[str], None]]:
        """What the lease listener also hears for this: requests asked, and answers written."""
        return {requests.ASKED: self.heard, requests.ANSWERED: self._told_answered}

    # The asking side.

    async def ask(self, g: Generation) -> str:
        """Carry a /continue of `g` to the process driving its resident's bot; the moderator's answer."""
        rid = await self.conn.run(
            requests.ask, g.id, g.residence, g.channel, len(g.segments), self.process, self.take_wait
        )
        told = self._answered.setdefault(rid, asyncio.Event())
        try:
            began = time.monotonic()
            now = await self._wait(rid, told, began + self.take_wait, until_taken=True)
            if now.taken_by is None:
                if await self.conn.run(requests.give_up, rid):
                    log.info("/continue %s (request %d): no process took it; withdrawn", g.id, rid)
                    return truth.continue_not_taken(g.residence, g.id, self.take_wait)
                now = await self.conn.run(requests.state, rid)  # taken as the wait ended: wait for its answer
            if now.answer is None:
                now = await self._wait(rid, told, began + self.answer_wait, until_taken=False)
            if now.answer is not None:
                return now.answer
            why = (
                "stopped before answering"
                if now.taker_alive is False
                else f"gave no answer within {self.answer_wait:g} s"
            )
            return truth.continue_not_answered(g.residence, g.id, why)
        finally:
            self._answered.pop(rid, None)

    async def _wait(self, rid: int, told: asyncio.Event, deadline: float, until_taken: bool) -> requests.State:
        """The request's state once answered (or taken, `until_taken`), its taker stopped, or `deadline` passed."""
        while True:
            told.clear()
            now = await self.conn.run(requests.state, rid)
            if now.answer is not None or (until_taken and now.taken_by is not None) or now.taker_alive is False:
                return now
            left = deadline - time.monotonic()
            if left <= 0:
                return now
            try:
                await asyncio.wait_for(told.wait(), timeout=min(POLL, left))
            except TimeoutError:
                pass

    def _told_answered(self, payload: str) -> None:
        told = self._answered.get(int(payload)) if payload.isdigit() else None
        if told is not None:
            told.set()

    # The driving side.

    def heard(self, payload: str) -> None:
        """A request was asked: looked at here (taken only if this process drives its resident's bot)."""
        if payload.isdigit():
            self._serve_soon(int(payload))

    async def sweep(self) -> None:
        """Look at every request still to take for a resident driven here (a notice missed, a bot just taken)."""
        if self.bots:
            for rid in await self.conn.run(requests.pending, sorted(self.bots)):
                self._serve_soon(rid)

    def _serve_soon(self, rid: int) -> None:
        if rid in self._looking:
            return  # heard and swept at once: looked at once
        self._looking.add(rid)
        task = asyncio.create_task(self._serve(rid), name=f"continue-request:{rid}")
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)
        task.add_done_callback(lambda _: self._looking.discard(rid))

    async def _serve(self, rid: int) -> None:
        try:
            now = await self.conn.run(requests.pending_one, rid)
            if now is None:
                log.info("/continue request %d is no longer to take (taken, withdrawn or past its deadline)", rid)
                return
            if now.residence not in self.bots or not await self.covers(now.residence, now.channel):
                return  # another process's to take
            got = await self.conn.run(requests.take, rid, self.process)
            if got is None:
                log.info("/continue request %d was taken elsewhere or withdrawn before this process took it", rid)
                return
            try:
                answer = await self._continue(got)
            except Exception:  # answered, as a failed slash command is; the traceback goes to the log once
                log.error("/continue %s (request %d) failed here", got.generation, rid, exc_info=True)
                answer = FAILED
            await self.conn.run(requests.answer, rid, self.process, answer)
        except Exception as e:  # the ledger's server: the asker, finding no answer, says so and points at the ledger
            log.warning("/continue request %d could not be looked at or answered: %s", rid, e)

    async def _continue(self, asked: requests.Request) -> str:
        owner, bot = self.registry.get(asked.residence), self.bots.get(asked.residence)
        g = await owner.ledger.get_generation(asked.generation) if owner is not None else None
        if owner is None or bot is None or g is None:
            return f"No generation {asked.generation} of a resident here."
        found = continue_channel(owner, bot, g)
        if isinstance(found, str):
            return found
        answer = await continue_in(owner, found, g, offered=asked.segments)
        log.info("/continue %s carried here (request %d): %s", g.id, asked.id, answer)
        return answer

    async def close(self) -> None:
        for task in list(self._serving):
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)
