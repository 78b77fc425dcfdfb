"""Running a program that starts services, so that it stops them on every way out.

A program of this project that starts something (Azurite, an emulator, worker
processes, a Spark cluster) stops it when it ends, whether it ends normally, with an
error, on Ctrl-C or on SIGTERM (``kill``, a CI job cancelled, a container stopped).
Python's default SIGTERM ends the process at once, running no ``finally`` block, so
the services it started would be left running, reparented to init. :func:`run` makes
SIGTERM stop an asyncio program the way Ctrl-C does; :func:`sigterm_interrupts` does
the same for synchronous code.

Example (a sample's last lines)::

    if __name__ == "__main__":
        sys.exit(run_program(main()))   # 130 after Ctrl-C, 143 after SIGTERM, everything stopped
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

__all__ = ["Interrupted", "run", "run_program", "sigterm_interrupts"]

_T = TypeVar("_T")
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The program was stopped by a signal, after everything it started was stopped.
    ``exit_code`` is the shell's convention: 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


def run(main: Awaitable[_T]) -> _T:
    """``asyncio.run(main)``, where SIGINT and SIGTERM cancel ``main``: its ``finally``
    blocks and exit stacks run (stopping what it started), then :class:`Interrupted` is
    raised. A second signal cancels again, which hurries a slow clean-up along; the
    synchronous steps of an exit stack (stopping a child process) still run.

    Example::

        try:
            result = run(run_demo(config))
        except Interrupted as stopped:
            sys.exit(stopped.exit_code)
    """
    async def guarded() -> _T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        received: list[int] = []

        def stop(signum: int) -> None:
            received.append(signum)
            task.cancel()

        installed = []
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                try:
                    loop.add_signal_handler(signum, stop, signum)
                except (NotImplementedError, RuntimeError, ValueError):  # no signals here (Windows)
                    continue
                installed.append(signum)
        try:
            outcome = await main
        except asyncio.CancelledError:
            if received:
                raise Interrupted(received[0]) from None
            raise
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
        if received:  # main swallowed the cancellation
            raise Interrupted(received[0])
        return outcome

    return asyncio.run(guarded())


def run_program(main: Awaitable[Any]) -> int:
    """:func:`run` for a program's ``main()`` that returns its exit status: the status,
    or 128 + the signal number once everything it started has stopped."""
    try:
        return int(run(main) or 0)
    except Interrupted as stopped:
        return stopped.exit_code


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C does, so that
    ``finally`` blocks and context managers stop what the block started. Only in the
    main thread, and only where SIGTERM still has its default action."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
