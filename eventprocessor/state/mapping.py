"""PartitionState: a claim's state, as the handler sees it (``context.state``).

A mutable mapping of string keys to JSON values. It knows what changed since the last
commit (so a checkpoint writes only the change) and what changed in the batch being
handled (so a batch whose handler raises is rolled back before it is delivered again).

Values are kept as their JSON text too: a value that is not JSON, or too large, is
refused at once with a clear error, and reading a list or a dict returns a fresh copy,
so a value changes only when it is assigned (``state[k] = new``), never behind the
log's back.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from typing import Any

from ..errors import ConfigurationError

__all__ = ["PartitionState", "MAX_VALUE_BYTES", "encode", "decode"]

MAX_VALUE_BYTES = 8 * 1024 * 1024
"""The largest value (as JSON, UTF-8) one key may hold: 8 MiB. Changes are split over as
many store entries as they need, but a single value this large is a design smell."""

_MISSING = object()
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def encode(value: Any) -> str:
    return _ENCODER.encode(value)


def decode(text: str) -> Any:
    return json.loads(text)


class PartitionState(MutableMapping[str, Any]):
    """The state of one partition, private to the claim that holds it.

    Example::

        async def process_events(self, events, context):
            for event in events:
                key = event.partition_key or "-"
                context.state[key] = context.state.get(key, 0) + 1
            await context.update_checkpoint()      # the counts and the position, together
    """

    __slots__ = ("_values", "_text", "_dirty", "_undo", "_max_value_bytes")

    def __init__(self, texts: dict[str, str] | None = None, *, max_value_bytes: int = MAX_VALUE_BYTES) -> None:
        self._text: dict[str, str] = dict(texts or {})
        self._values: dict[str, Any] = {key: decode(text) for key, text in self._text.items()}
        self._dirty: dict[str, str | None] = {}  # key -> JSON text, or None (deleted), since the last commit
        self._undo: dict[str, tuple[Any, Any, Any]] | None = None  # the batch in progress
        self._max_value_bytes = max_value_bytes

    def __repr__(self) -> str:
        return f"PartitionState({len(self._values)} keys, {len(self._dirty)} uncommitted)"

    # ----------------------------------------------------------------- the mapping
    def __getitem__(self, key: str) -> Any:
        value = self._values[key]
        if isinstance(value, (dict, list)):
            return decode(self._text[key])  # a copy: assign to change it
        return value

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise ConfigurationError(f"state keys are strings, got {type(key).__name__} {key!r}")
        try:
            text = encode(value)
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"the value for state key {key!r} is not JSON ({error}); state holds "
                                     "str, int, float, bool, None, and lists and dicts of them") from None
        if len(text) > self._max_value_bytes // 4 and len(text.encode("utf-8")) > self._max_value_bytes:
            raise ConfigurationError(f"the value for state key {key!r} is {len(text.encode('utf-8')):,} bytes as "
                                     f"JSON; a key holds at most {self._max_value_bytes:,}: split it over keys")
        self._remember(key)
        self._values[key] = value if not isinstance(value, (dict, list)) else decode(text)
        self._text[key] = text
        self._dirty[key] = text

    def __delitem__(self, key: str) -> None:
        if key not in self._values:
            raise KeyError(key)
        self._remember(key)
        del self._values[key]
        del self._text[key]
        self._dirty[key] = None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    # ----------------------------------------------------------------- batches
    def _remember(self, key: str) -> None:
        undo = self._undo
        if undo is not None and key not in undo:
            undo[key] = (self._values.get(key, _MISSING), self._text.get(key, _MISSING),
                         self._dirty.get(key, _MISSING))

    def begin_batch(self) -> None:
        """A batch is about to be handed to the handler."""
        self._undo = {}

    def keep_batch_so_far(self) -> None:
        """The changes of the batch so far were committed: a rollback stops here."""
        if self._undo is not None:
            self._undo = {}

    def end_batch(self) -> None:
        """The handler returned: its changes stay."""
        self._undo = None

    def roll_back_batch(self) -> int:
        """The handler raised: undo what it changed in this batch. Returns the keys undone."""
        undo, self._undo = self._undo or {}, None
        for key, (value, text, dirty) in undo.items():
            if value is _MISSING:
                self._values.pop(key, None)
                self._text.pop(key, None)
            else:
                self._values[key] = value
                self._text[key] = text
            if dirty is _MISSING:
                self._dirty.pop(key, None)
            else:
                self._dirty[key] = dirty
        return len(undo)

    # ----------------------------------------------------------------- commits
    @property
    def changed(self) -> bool:
        return bool(self._dirty)

    def changes(self) -> dict[str, str | None]:
        """What changed since the last commit: key -> JSON text, or None (deleted)."""
        return dict(self._dirty)

    def committed(self, changes: dict[str, str | None]) -> None:
        """``changes`` were written with a checkpoint: they are no longer pending
        (unless the key changed again meanwhile)."""
        for key, text in changes.items():
            if self._dirty.get(key, _MISSING) == text:
                del self._dirty[key]

    def copy(self) -> PartitionState:
        """A committed copy (no pending changes, no batch): a warm replica hands this to
        the claim that takes its partition, and keeps following on its own. Shallow: a
        value is never changed in place (lists and dicts are copied on read)."""
        clone = PartitionState(max_value_bytes=self._max_value_bytes)
        clone._values, clone._text = dict(self._values), dict(self._text)
        return clone

    def texts(self) -> dict[str, str]:
        """Every key's JSON text (for a snapshot)."""
        return dict(self._text)

    def apply(self, changes: dict[str, str | None]) -> None:
        """Apply committed changes read from the log (a warm replica catching up)."""
        for key, text in changes.items():
            if text is None:
                self._values.pop(key, None)
                self._text.pop(key, None)
            else:
                self._values[key] = decode(text)
                self._text[key] = text
