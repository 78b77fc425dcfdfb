"""What the PostgreSQL sink and the PostgreSQL checkpoint store share: loading asyncpg
with a clear error, a DSN shown without its password, checked identifiers, a one-line
description of a failure, and what a failure means (the request may have taken effect;
trying again may help).

asyncpg reports server errors as PostgreSQL's SQLSTATE classes; a connection that breaks
shows as ``ConnectionDoesNotExistError``, ``InterfaceError`` or an ``OSError``; a
timeout as ``asyncio.TimeoutError``.
"""
from __future__ import annotations

import asyncio
import re
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigurationError

__all__ = ["require_asyncpg", "safe_dsn", "check_dsn", "quoted_name", "describe", "outcome_unknown",
           "transient", "SERIALIZATION_STATES"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SERIALIZATION_STATES = frozenset({"40001", "40P01"})
"""serialization_failure and deadlock_detected: the transaction can simply be run again."""

# Operator intervention (a shutdown, a restart, a server still starting), too many
# connections, a lock or statement timeout, a session ended for idling in a transaction.
_TRANSIENT_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "55P03", "57014", "25P03"})


def require_asyncpg(what: str) -> ModuleType:
    """``asyncpg``, or a ``ModuleNotFoundError`` naming the extra to install."""
    try:
        import asyncpg
    except ModuleNotFoundError as error:
        from ..extras import install_command

        raise ModuleNotFoundError(f"{what} needs the [postgres] extra (asyncpg is not installed): "
                                  f"{install_command(['postgres'])}", name=error.name) from error
    return asyncpg


def check_dsn(dsn: Any, what: str) -> str:
    """A ``postgresql://`` (or ``postgres://``) URI; a ``ConfigurationError`` that never
    shows the value otherwise (it may hold a password)."""
    if not isinstance(dsn, str) or not dsn:
        raise ConfigurationError(f"{what} needs dsn=, a PostgreSQL URI such as "
                                 "'postgresql://user@host:5432/database', got "
                                 f"{type(dsn).__name__ if not isinstance(dsn, str) else 'an empty string'}")
    scheme = dsn.split("://", 1)[0].lower() if "://" in dsn else ""
    if scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(f"{what}: dsn must be a URI starting with postgresql:// "
                                 "(such as 'postgresql://user@host:5432/database'); a key=value string is not "
                                 "accepted")
    return dsn


def safe_dsn(dsn: str) -> str:
    """The DSN without its password (and without query parameters, which may hold one)."""
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "postgresql://<unparsable DSN>"


def quoted_name(value: Any, what: str) -> str:
    """A plain SQL identifier (letters, digits, ``_``; at most 55 characters), quoted for use in SQL."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or len(value) > 55:
        raise ConfigurationError(f"{what} {value!r} is not a plain SQL identifier: use letters, digits and _ "
                                 "(not starting with a digit), at most 55 characters")
    return f'"{value}"'


def _sqlstate(error: BaseException) -> str:
    return str(getattr(error, "sqlstate", "") or "")


def describe(error: BaseException) -> str:
    """One line: the type, the SQLSTATE and the server's message (no DSN, no password)."""
    state = _sqlstate(error)
    message = " ".join(str(error).split()) or "no message"
    if isinstance(error, asyncio.TimeoutError):
        message = "no answer in time"
    return f"{type(error).__name__}{f' [{state}]' if state else ''}: {message[:300]}"


def outcome_unknown(error: BaseException) -> bool:
    """The connection broke or timed out while a request was in flight: the server may
    have carried it out. A server's error answer (any SQLSTATE but a connection class or
    a shutdown) means the statement did not take effect."""
    state = _sqlstate(error)
    if state:
        return state.startswith("08") or state in ("57P01", "57P02")
    return isinstance(error, (OSError, asyncio.TimeoutError, EOFError)) or type(error).__name__ in (
        "InterfaceError", "ConnectionDoesNotExistError", "InternalClientError")


def transient(error: BaseException) -> bool:
    """Worth trying again: the connection failed or broke, the server is restarting or busy,
    or the transaction lost a serialization conflict."""
    state = _sqlstate(error)
    if state:
        return state.startswith("08") or state in _TRANSIENT_STATES or state in SERIALIZATION_STATES
    return outcome_unknown(error)
