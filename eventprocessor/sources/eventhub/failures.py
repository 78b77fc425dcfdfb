"""How a failure of azure-eventhub becomes this SDK's error: the reason it is
classified under (``unreachable``, ``timeout``, ``not-found``, ``unauthorized``,
``refused``, ``server-busy``, ``disconnected``), a message that names the namespace and
the hub, and never a secret.

Each error is also the exception azure-eventhub raises for the same failure: an
:class:`~eventprocessor.errors.EventSourceError` of the class
``EventSourceError[ConnectError]`` is an ``azure.eventhub.exceptions.ConnectError``
too, so code written against the official client (``except ConnectError``,
``isinstance(error, EventHubError)`` in an ``on_error``) keeps working. The official
class is the one the client itself maps the underlying failure to
(:func:`official_type`).

Example::

    errors = ErrorContext("ns.servicebus.windows.net", "telemetry", secret=key)
    raise errors.classify(error, "reading the partition ids") from None
"""
from __future__ import annotations

import asyncio
import re
from typing import Any, TypeVar

from ...errors import EventSourceError

__all__ = ["ErrorContext", "taken_over", "official_type", "with_official_type", "official_class"]

# Markers of the errors Event Hubs returns when a receiver with a higher epoch took the
# partition (link stolen / epoch receiver conflict).
_TAKEN_OVER_MARKERS = ("link:stolen", "linkstolen", "higher epoch", "receiver with a higher", "ownerlevel",
                       "owner level")
_NOT_FOUND_MARKERS = ("not-found", "notfound", "could not be found", "status code: 404")
_UNAUTHORIZED_MARKERS = ("unauthorized", "status code: 401", "token authentication failed", "invalidsignature",
                         "authentication")
_REFUSED_MARKERS = ("argument-out-of-range", "argumentoutofrange", "invalid-field", "argument-error",
                    "not-allowed", "resource-limit-exceeded", "message-size-exceeded")
_BUSY_MARKERS = ("server-busy", "serverbusy", "is being throttled")
# Event Hubs says how long to wait in its text ("... Please wait 4 seconds and try again.");
# without it, the service's documented minimum (azure-eventhub waits the same).
_RETRY_AFTER = re.compile(r"wait\s+(\d+(?:\.\d+)?)\s*(?:seconds|second|secs|sec|s)\b", re.I)
_DEFAULT_RETRY_AFTER = 4.0
_UNREACHABLE_MARKERS = ("failed to initiate the connection", "connect call failed", "name or service not known",
                        "connection refused", "socketerror", "socket-error", "errno", "nodename nor servname",
                        "temporary failure in name resolution")
# Secrets that may appear in a library's error text: SAS signatures and whole tokens.
_SECRET_PATTERNS = ((re.compile(r"SharedAccessSignature\s+\S+", re.I), "SharedAccessSignature ***"),
                    (re.compile(r"\b(sig|SharedAccessKey|SharedAccessSignature)=[^;&\s]+", re.I), r"\1=***"))

_E = TypeVar("_E", bound=BaseException)

# The official exception of a failure that has no client exception behind it, by reason.
_OFFICIAL_BY_REASON = {"unreachable": "ConnectError", "timeout": "OperationTimeoutError", "not-found": "ConnectError",
                       "unauthorized": "AuthenticationError", "refused": "ConnectError", "server-busy": "ConnectError",
                       "disconnected": "ConnectionLostError"}


def official_type(reason: str, cause: BaseException | None = None) -> type[BaseException]:
    """azure-eventhub's exception class for a failure classified under ``reason``: the
    class the client raises for ``cause`` (an exception of the client, or of its AMQP
    layer, which the client maps the way it maps it for its own callers), else the one
    of the reason (``EventHubError`` when there is none)."""
    from azure.eventhub import exceptions as official

    if isinstance(cause, official.EventHubError):
        return type(cause)
    if isinstance(cause, FileNotFoundError):
        # A connection_verify path that does not exist: the official consumer's on_error gets it as is.
        return FileNotFoundError
    mapped = _client_mapping(cause)
    if mapped is not None:
        return mapped
    return getattr(official, _OFFICIAL_BY_REASON.get(reason, "EventHubError"))


def _client_mapping(cause: BaseException | None) -> type[BaseException] | None:
    """The class azure-eventhub's transport maps an exception of its AMQP layer to, or
    None for anything else (or when this azure-eventhub maps differently)."""
    try:
        from azure.eventhub._pyamqp.error import AMQPException
        from azure.eventhub._transport._pyamqp_transport import PyamqpTransport
    except ImportError:  # pragma: no cover - another azure-eventhub
        return None
    if not isinstance(cause, AMQPException):
        return None
    try:
        mapped = PyamqpTransport._create_eventhub_exception(cause, is_consumer=True)
    except Exception:  # pragma: no cover - another azure-eventhub
        return None
    return type(mapped) if isinstance(mapped, BaseException) else None


_CLASSES: dict[tuple[type, type], type] = {}


def official_class(ours: type[_E], official: type[BaseException]) -> type[_E]:
    """The class of errors that are both ``ours`` and azure-eventhub's ``official``
    (named ``Ours[Official]``), made once per pair."""
    if issubclass(ours, official):
        return ours
    made = _CLASSES.get((ours, official))
    if made is None:
        made = _CLASSES[ours, official] = type(f"{ours.__name__}[{official.__name__}]", (ours, official), {
            "__module__": ours.__module__,
            "__doc__": f"{ours.__name__} that is also azure-eventhub's {official.__name__}."})
    return made


def with_official_type(error: Any, official: type[BaseException]) -> Any:
    """``error`` (this SDK's) made an instance of azure-eventhub's ``official`` class too,
    in place; returned for convenience. ``official`` must add no instance layout of its
    own (every ``azure.eventhub.exceptions`` class; not ``OSError``'s)."""
    from azure.eventhub.exceptions import EventHubError

    if isinstance(error, official):
        return error
    error.__class__ = official_class(type(error), official)
    if isinstance(error, EventHubError):  # the attributes its __init__ sets
        for name, value in (("message", str(error)), ("error", None), ("details", None)):
            setattr(error, name, value)
    return error


class ErrorContext:
    """What a source error names: the namespace, the hub, and the secret to scrub."""

    def __init__(self, namespace: str, eventhub_name: str, secret: str | None) -> None:
        self.namespace = namespace
        self.eventhub_name = eventhub_name
        self.secret = secret

    def scrub(self, text: str) -> str:
        if self.secret:
            text = text.replace(self.secret, "***")
        for pattern, replacement in _SECRET_PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def error(self, reason: str, what: str, cause: BaseException | None = None, *,
              retry_after: float | None = None) -> EventSourceError:
        detail = ""
        if cause is not None:
            # The client's text, its lines joined (its AuthenticationError for a missing hub says
            # "could not be found" on the third line), never a secret.
            text = " ".join(line.strip() for line in str(cause).strip().splitlines() if line.strip())
            detail = f": {type(cause).__name__}" + (f": {self.scrub(text)[:400]}" if text else "")
        # Built as the official class directly: FileNotFoundError has a layout of its own.
        error_class = official_class(EventSourceError, official_type(reason, cause))
        return error_class(
            f"event hub {self.eventhub_name!r} in namespace {self.namespace!r}: {what}{detail}",
            fully_qualified_namespace=self.namespace, eventhub_name=self.eventhub_name, reason=reason,
            retry_after=retry_after)

    def classify(self, error: BaseException, doing: str, *, consumer_group: str | None = None,
                 partition_id: str | None = None) -> EventSourceError:
        """The :class:`EventSourceError` for a client exception raised while ``doing``."""
        text = f"{type(error).__name__} {error} {getattr(error, 'condition', '')}".lower()
        where = ""
        if consumer_group is not None:
            where = f" (consumer group {consumer_group!r}, partition {partition_id!r})"
        if isinstance(error, asyncio.TimeoutError):
            return self.error("timeout", f"{doing}{where} did not finish in time", None)
        if any(marker in text for marker in _BUSY_MARKERS):
            found = _RETRY_AFTER.search(f"{error} {getattr(error, 'description', '') or ''}")
            wait = float(found.group(1)) if found else _DEFAULT_RETRY_AFTER
            return self.error("server-busy", f"{doing}{where} was throttled by the hub (server busy); retry after "
                                             f"{wait:g} s", error, retry_after=wait)
        if any(marker in text for marker in _NOT_FOUND_MARKERS):
            thing = "the consumer group, the partition or the event hub" if consumer_group else "the event hub"
            return self.error("not-found", f"{doing}{where} failed: {thing} does not exist", error)
        if any(marker in text for marker in _UNAUTHORIZED_MARKERS) or type(error).__name__ in (
                "ClientAuthenticationError", "CredentialUnavailableError", "AuthenticationError"):
            return self.error("unauthorized", f"{doing}{where} failed: the credential was rejected", error)
        if any(marker in text for marker in _REFUSED_MARKERS):
            return self.error("refused", f"{doing}{where} was refused by the hub", error)
        if any(marker in text for marker in _UNREACHABLE_MARKERS) or isinstance(error, OSError):
            return self.error("unreachable", f"{doing}{where} failed: the hub cannot be reached", error)
        return self.error("disconnected", f"{doing}{where} failed", error)


def taken_over(error: BaseException) -> bool:
    text = f"{error} {getattr(error, 'condition', '')}".lower()
    return any(marker in text for marker in _TAKEN_OVER_MARKERS)

