"""Why a balancing tick took longer than its interval: the cause an overrun warning names."""
from __future__ import annotations

__all__ = ["overrun_cause", "renewals_note"]


def overrun_cause(*, started: float, duration: float, stall: tuple[float, float] | None,
                  slowest: tuple[str, float, BaseException | None] | None, in_store: float,
                  store_timeout: float) -> str:
    """The cause of a tick that began at ``started`` and took ``duration`` seconds: a
    handler that blocked the event loop meanwhile (``stall``: its start and end), one
    store call that took half the tick or more (``slowest``: operation, seconds, error),
    the tick's own store calls taking half of it in all (``in_store``: their seconds,
    summed), else this machine's CPU."""
    if stall is not None and stall[1] > started:
        return (f"the event loop was blocked for {stall[1] - stall[0]:.1f} s during it by a handler (see the "
                "warning about it)")
    if slowest is not None and slowest[1] >= duration / 2:
        operation, seconds, error = slowest
        return (f"it waited on the checkpoint store: {operation} took {seconds:.1f} s"
                + (f" and failed ({error!r})" if error is not None else "")
                + f" (store_timeout {store_timeout:g} s); the store is slow or unreachable")
    if in_store >= duration / 2:
        operation, seconds, _error = slowest if slowest is not None else ("a call", 0.0, None)
        return (f"it waited on the checkpoint store for most of it: its listings, claims and fences (the "
                f"slowest, {operation}, took {seconds:.1f} s); the store is slow, or its calls queue behind "
                "other processors'")
    return ("no store call in it took long: this machine's CPU cannot keep up with this many partitions "
            "and processors per process; raise the interval or run fewer processors per process")


def renewals_note(overdue: list[str]) -> str:
    """What an overrun warning says of the leases: ``overdue`` are the partitions whose
    per-partition renewal is late (none when a heartbeat keeps them)."""
    if overdue:
        return f"the renewals of partitions {overdue} are overdue"
    return "leases are renewed apart from ticks and none is overdue"
