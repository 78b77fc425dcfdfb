"""How a failure of azure-eventhub becomes this SDK's error: the reason it is
classified under (``unreachable``, ``timeout``, ``not-found``, ``unauthorized``,
``refused``, ``server-busy``, ``disconnected``), a message that names the namespace and
the hub, and never a secret.

Example::

    errors = ErrorContext("ns.servicebus.windows.net", "telemetry", secret=key)
    raise errors.classify(error, "reading the partition ids") from None
"""
from __future__ import annotations

import asyncio
import re

from ...errors import EventSourceError

__all__ = ["ErrorContext", "taken_over"]

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

# Frames the lean receiver asks the client to read per call, and how long it keeps

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
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            detail = f": {type(cause).__name__}" + (f": {self.scrub(first)[:300]}" if first else "")
        return EventSourceError(
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

