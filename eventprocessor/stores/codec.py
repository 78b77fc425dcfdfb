"""The record codec: what a record's fields may hold and how they read back.

Keys and field values are checked before any request, so that code that works on one
store works on all (:func:`check_scope`, :func:`check_text`, :func:`check_epoch`, ...);
owner ids, log names and entry names become keys through :func:`encode_name`; stored
fields read back as :class:`~eventprocessor.stores.records.Ownership` and
:class:`~eventprocessor.stores.records.Checkpoint` (:func:`parse_ownership`,
:func:`parse_checkpoint`), or as the reason they cannot, which the protocol reports once
per record version (:class:`WarnOnce`).
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from ..errors import ConfigurationError
from .backend import Scope, StoredRecord
from .records import MAX_EPOCH, MAX_SEQUENCE_NUMBER, Checkpoint, Ownership, StateRef

__all__ = ["encode_name", "decode_name", "check_name_part", "check_scope", "check_encoded", "check_text", "check_int",
           "check_epoch", "parse_int", "parse_ownership", "parse_checkpoint", "later_than", "WarnOnce",
           "WRITE_TOKEN", "NO_CHECKPOINT", "NO_OFFSET"]

WRITE_TOKEN = "writetoken"
"""The field holding a write's random token; the official SDK ignores it."""

NO_CHECKPOINT = -1
"""The sequence number of a placeholder: a fenced partition that has no checkpoint yet.
Event Hubs sequence numbers start at 0, so no real checkpoint has it."""

NO_OFFSET = "-1"
"""What a checkpoint without an offset (and a placeholder) stores. The official
processor reads the offset as a string and starts *after* it; ``"-1"`` is Event Hubs'
start of stream, so it re-reads from the start instead of failing on an empty value
(which its blob reader would turn into ``"None"``). Read back as ``offset=None``."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")
_MAX_TEXT = 1024
_MAX_KEY = 512


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def encode_name(name: str) -> str:
    """Encode an owner id, log name or entry name as a key every backend accepts.

    Lower-case letters, digits, ``-``, ``_`` and ``.`` (except a leading ``.``, so that
    ``.`` and ``..`` never become path segments) stay; every other character becomes
    ``%xx`` per UTF-8 byte, in lower-case hex. The result is lower-case (blob names of
    this layout are lower-cased), distinct names stay distinct (``"A"`` is ``"%41"``,
    ``"a"`` is ``"a"``), and a prefix of a name encodes to a prefix of its encoding.
    """
    parts = []
    for index, char in enumerate(name):
        if char in _SAFE and not (index == 0 and char == "."):
            parts.append(char)
        else:
            parts.extend(f"%{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(parts)


def decode_name(encoded: str) -> str:
    """The inverse of :func:`encode_name`; ``ValueError`` for a key it cannot have made."""
    name = unquote(encoded, errors="strict")
    if encode_name(name) != encoded:
        raise ValueError(f"{encoded!r} is not an encoded name")
    return name


def check_name_part(value: Any, what: str, *, forbidden: str) -> str:
    """Validate one component of a record key (namespace, hub, group, partition id)."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {type(value).__name__}")
    bad = sorted({c for c in value if c in forbidden})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise ConfigurationError(f"{what} {value!r} contains characters this store cannot use: {shown}")
    if _CONTROL.search(value):
        raise ConfigurationError(f"{what} {value!r} contains control characters")
    if len(value) > _MAX_KEY:
        raise ConfigurationError(f"{what} is {len(value)} characters long; at most {_MAX_KEY} are allowed")
    return value


def check_scope(namespace: Any, eventhub: Any, consumer_group: Any, *, forbidden: str) -> Scope:
    """Validate the (namespace, event hub, consumer group) every record key starts with."""
    return (
        check_name_part(namespace, "fully_qualified_namespace", forbidden=forbidden),
        check_name_part(eventhub, "eventhub_name", forbidden=forbidden),
        check_name_part(consumer_group, "consumer_group", forbidden=forbidden),
    )


def check_encoded(value: Any, what: str) -> str:
    """A name that goes through :func:`encode_name`; returns the encoding."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {type(value).__name__}")
    try:
        encoded = encode_name(value)
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} {value!r} is not valid Unicode text") from None
    if len(encoded) > _MAX_KEY:
        raise ConfigurationError(f"{what} is too long: {len(encoded)} characters encoded, at most {_MAX_KEY}")
    return encoded


def check_text(value: Any, what: str, *, allow_empty: bool = True) -> str:
    """A value stored in a record field: printable ASCII (blob metadata travels in HTTP
    headers), no surrounding spaces (HTTP trims them), at most 1024 characters. The
    in-memory and Table stores apply the same rule, so code that works on one works on all."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise ConfigurationError(f"{what} must not be empty")
    if not _PRINTABLE.match(value) or value != value.strip() or len(value) > _MAX_TEXT:
        raise ConfigurationError(
            f"{what} {value[:80]!r} cannot be stored: use at most {_MAX_TEXT} printable ASCII characters, "
            "without leading or trailing spaces")
    return value


def check_int(value: Any, what: str, low: int, high: int, partition_id: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(
            f"{what} of partition {partition_id!r} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ConfigurationError(
            f"{what} of partition {partition_id!r} is {value}: it must be between {low} and {high} "
            "(Event Hubs keeps it as a signed 64-bit integer)")
    return value


def check_epoch(value: Any, partition_id: Any) -> int:
    """0 to ``MAX_EPOCH - 1``: a record at ``MAX_EPOCH`` could never be claimed above."""
    return check_int(value, "epoch", 0, MAX_EPOCH - 1, partition_id)


def parse_int(value: Any) -> int | None:
    """An int from a field written by us or another SDK; ``None`` if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,30}\s*", value):
        return int(value)
    return None


def _ranged(fields: Mapping[str, Any], name: str, low: int, high: int) -> tuple[int, str | None]:
    value = fields.get(name)
    number = parse_int(value)
    if number is None:
        return 0, f"its {name} {str(value)[:40]!r} is not an integer"
    if not low <= number <= high:
        return 0, f"its {name} {number} is out of range ({low} to {high})"
    return number, None


def parse_ownership(record: StoredRecord, scope: Scope) -> Ownership | str:
    """The ownership record, or why it cannot be read."""
    fields = record.fields
    owner = fields.get("ownerid")
    if owner is None:
        return "it has no ownerid"
    if not isinstance(owner, str):
        return f"its ownerid is a {type(owner).__name__}, not a string"
    epoch, problem = _ranged({"epoch": fields.get("epoch", 0)}, "epoch", 0, MAX_EPOCH - 1)
    if problem:
        return problem
    requested = fields.get("requestedby", "")
    if not isinstance(requested, str):
        return f"its requestedby is a {type(requested).__name__}, not a string"
    return Ownership(*scope, record.key, owner, last_modified_time=record.last_modified, etag=record.etag,
                     epoch=epoch, requested_by=requested)


def parse_checkpoint(record: StoredRecord, scope: Scope) -> Checkpoint | str:
    """The checkpoint record (a placeholder has ``sequence_number == NO_CHECKPOINT``), or
    why it cannot be read."""
    fields = record.fields
    if "sequencenumber" not in fields:
        return "it has no sequencenumber"
    sequence_number, problem = _ranged(fields, "sequencenumber", NO_CHECKPOINT, MAX_SEQUENCE_NUMBER)
    if problem:
        return problem
    epoch: int | None = None
    if "epoch" in fields:
        epoch, problem = _ranged(fields, "epoch", 0, MAX_EPOCH - 1)
        if problem:
            return problem
    offset = fields.get("offset")
    owner = fields.get("ownerid")
    state: StateRef | None = None
    if fields.get("state"):
        try:
            state = StateRef.parse(str(fields["state"]))
        except ValueError as error:
            return f"its state reference is unreadable ({error})"
    return Checkpoint(
        *scope, record.key, sequence_number,
        offset=str(offset) if offset not in (None, "", NO_OFFSET) else None,
        owner_id=owner if isinstance(owner, str) and owner else None,
        epoch=epoch, state=state,
    )


def later_than(stored: Checkpoint, owner_id: str, epoch: int) -> bool:
    """Written by a later owner: a higher epoch, or the same epoch by someone else."""
    return stored.epoch is not None and (stored.epoch > epoch
                                         or (stored.epoch == epoch and stored.owner_id != owner_id))


class WarnOnce:
    """Warn about a bad record once per version; later sightings go to debug.

    The balancer lists every few seconds, so without this one foreign blob would fill
    the log.
    """

    def __init__(self, log: logging.Logger, limit: int = 10_000) -> None:
        self._log = log
        self._seen: set = set()
        self._limit = limit

    def __call__(self, key: tuple[str, str | None], message: str, *args: Any) -> None:
        if key in self._seen:
            self._log.debug(message, *args)
            return
        if len(self._seen) < self._limit:
            self._seen.add(key)
        self._log.warning(message, *args)
