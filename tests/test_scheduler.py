"""The request queue (pyshim.serve.scheduler): first come first started, a sequence each, up to `slots` at
once, exclusive jobs alone, aborts before and during a run."""

from __future__ import annotations

import asyncio

import pytest

from pyshim.serve.scheduler import AbortedError, Scheduler, current_seq


def test_one_sequence_runs_requests_one_at_a_time_in_order():
    log = []

    async def scene():
        s = Scheduler()

        def job(name):
            async def run(should_stop):
                log.append(("start", name, current_seq()))
                await asyncio.sleep(0.01)
                log.append(("end", name))
                return name
            return run

        return await asyncio.gather(*(s.run(job(n)) for n in "abc"))

    assert asyncio.run(scene()) == ["a", "b", "c"]
    assert log == [("start", "a", 0), ("end", "a"), ("start", "b", 0), ("end", "b"), ("start", "c", 0), ("end", "c")]


def test_slots_run_requests_at_once_each_in_its_own_sequence_and_exclusive_ones_alone():
    log = []

    async def scene():
        s = Scheduler(slots=2)
        gate = asyncio.Event()

        def job(name, wait=False):
            async def run(should_stop):
                log.append(("start", name, current_seq(), len(s.running)))
                if wait:
                    await gate.wait()
                await asyncio.sleep(0.01)
                log.append(("end", name))
            return run

        a = asyncio.ensure_future(s.run(job("a", wait=True)))
        b = asyncio.ensure_future(s.run(job("b", wait=True)))
        x = asyncio.ensure_future(s.run(job("x"), exclusive=True))     # waits for a and b, and holds c back
        c = asyncio.ensure_future(s.run(job("c")))
        await asyncio.sleep(0.05)
        started = [e[1] for e in log if e[0] == "start"]
        gate.set()
        await asyncio.gather(a, b, x, c)
        return started, s.stats()

    started, stats = asyncio.run(scene())
    assert started == ["a", "b"]                        # both at once; x and c waited
    starts = {e[1]: e for e in log if e[0] == "start"}
    assert starts["a"][2] == 0 and starts["b"][2] == 1 and starts["a"][3] == 1 and starts["b"][3] == 2
    order = [e[1] for e in log if e[0] == "start"]
    assert order == ["a", "b", "x", "c"] and starts["x"][3] == 1      # x alone, then c (first come, first started)
    assert log.index(starts["x"]) > max(log.index(("end", "a")), log.index(("end", "b")))
    assert log.index(starts["c"]) > log.index(("end", "x"))
    assert starts["x"][2] == 1 and starts["c"][2] == 1      # the last freed sequence goes first (a caller's cache)
    assert stats == {"running": 0, "queued": 0, "done": 4, "sequences": 2}


def test_aborts_before_the_start_and_while_running():
    async def scene():
        s = Scheduler()
        gate = asyncio.Event()
        stopped = []

        async def long(should_stop):
            while not should_stop():
                await asyncio.sleep(0.005)
            stopped.append(True)
            return "stopped"

        async def never(should_stop):
            raise AssertionError("an aborted request must not start")

        running = asyncio.ensure_future(s.run(long, request_id=1))
        queued = asyncio.ensure_future(s.run(never, request_id=2))
        await asyncio.sleep(0.02)
        assert s.abort(2) is True                       # queued: out at once, while 1 still runs
        with pytest.raises(AbortedError):
            await asyncio.wait_for(queued, 1.0)
        assert not running.done()
        assert s.abort(1) is True
        assert await asyncio.wait_for(running, 1.0) == "stopped"
        s.abort(3)                                      # an abort that arrives before its request
        with pytest.raises(AbortedError):
            await s.run(never, request_id=3)
        gate.set()
        return stopped

    assert asyncio.run(scene()) == [True]
