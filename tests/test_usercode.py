"""UserCode times every synchronous step of a handler, the first one included (it runs
inside ``UserCode.call`` itself), and passes results, errors and cancellation through."""
from __future__ import annotations

import asyncio

import pytest

from eventprocessor._delivery.usercode import UserCode
from eventprocessor.testing import run_virtual


def _user(blocks: list[tuple[str, float, float]]) -> UserCode:
    loop = asyncio.get_running_loop()
    return UserCode(monotonic=loop.time, on_block=lambda what, s, e: blocks.append((what, s, e)), threshold=1.0)


def test_a_handler_that_never_suspends_returns_its_value_and_its_block_is_reported():
    async def scenario():
        blocks: list[tuple[str, float, float]] = []

        async def handler(x: int) -> int:
            asyncio.get_running_loop().advance(2.0)  # holds the loop for 2 s of virtual time
            return x + 1

        quick: list[tuple[str, float, float]] = []

        async def fast(x: int) -> int:
            return x * 2

        assert await _user(blocks).call("h", handler, 41) == 42
        assert await _user(quick).call("f", fast, 21) == 42
        return blocks, quick

    blocks, quick = run_virtual(scenario())
    assert [(what, round(e - s, 3)) for what, s, e in blocks] == [("h", 2.0)]
    assert quick == []


def test_every_step_after_a_suspension_is_timed_and_values_are_sent_in():
    async def scenario():
        blocks: list[tuple[str, float, float]] = []
        loop = asyncio.get_running_loop()

        async def handler() -> str:
            first = await asyncio.sleep(0.5, result="a")  # first step ends here: quick
            loop.advance(3.0)  # second step holds the loop
            second = await asyncio.sleep(0.5, result="b")
            loop.advance(1.5)  # third step too
            return first + second

        result = await _user(blocks).call("handler", handler)
        return result, blocks

    result, blocks = run_virtual(scenario())
    assert result == "ab"
    assert [(what, round(e - s, 3)) for what, s, e in blocks] == [("handler", 3.0), ("handler", 1.5)]


def test_errors_of_the_first_and_of_later_steps_reach_the_caller_timed():
    async def scenario():
        blocks: list[tuple[str, float, float]] = []
        loop = asyncio.get_running_loop()

        async def fails_at_once() -> None:
            loop.advance(2.0)
            raise ValueError("first step")

        async def fails_later() -> None:
            await asyncio.sleep(0)
            raise KeyError("later step")

        with pytest.raises(ValueError, match="first step"):
            await _user(blocks).call("a", fails_at_once)
        with pytest.raises(KeyError, match="later step"):
            await _user(blocks).call("b", fails_later)
        return blocks

    blocks = run_virtual(scenario())
    assert [what for what, _s, _e in blocks] == ["a"]


def test_cancelling_a_handler_suspended_at_its_first_await_reaches_the_handler():
    async def scenario():
        seen: list[str] = []
        started = asyncio.Event()

        async def handler() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("finally")

        task = asyncio.ensure_future(_user([]).call("handler", handler))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    assert run_virtual(scenario()) == ["cancelled", "finally"]


def test_a_handler_suspended_at_its_first_await_can_catch_the_cancellation_and_return():
    async def scenario():
        started = asyncio.Event()

        async def handler() -> str:
            started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return "stopped cleanly"
            return "slept"

        task = asyncio.ensure_future(_user([]).call("handler", handler))
        await started.wait()
        task.cancel()
        return await task

    assert run_virtual(scenario()) == "stopped cleanly"
