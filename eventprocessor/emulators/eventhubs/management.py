"""Requests on the ``$cbs`` and ``$management`` nodes: put-token, and the READ operations
behind ``get_eventhub_properties``, ``get_partition_ids`` and ``get_partition_properties``.

A reply goes out on the reply link (the receiver the client attached to the same node
in the same session) with ``correlation-id`` = the request's ``message-id`` and the
status in ``status-code`` and ``statusCode`` (the client reads the second).

Tokens. By default any ``put-token`` is accepted (202), like Microsoft's Docker
emulator. With a key set (``sas_key``), a token must be a SharedAccessSignature signed
with it, naming its key name and not expired, or it gets 401. Either way a token for a
hub that does not exist gets 404 "The messaging entity ... could not be found", as
from the service, which the client raises as ``AuthenticationError`` (a
``ConnectError``): a producer or a management call for an unknown hub fails when it
connects.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote_plus

from . import frames as F
from .attach import check_authorized, entity_path
from .codec import StringArray, Timestamp, decode, encode
from .errors import BrokerError
from .links import InboundLink, OutboundLink

if TYPE_CHECKING:  # pragma: no cover
    from .peer import ConnectionView

__all__ = ["answer", "check_sas_token"]

logger = logging.getLogger(__name__)


def answer(connection: ConnectionView, link: InboundLink, message: bytes) -> None:
    """Handle one request that arrived on a ``$cbs`` or ``$management`` link."""
    if link.kind == "cbs":
        _put_token(connection, link, message)
    else:
        _read(connection, link, message)


def check_sas_token(token: Any, *, key_name: str | None, key: str) -> str | None:
    """None if ``token`` is a SharedAccessSignature signed with ``key`` (and ``key_name``)
    that has not expired, else why not (never the token itself)."""
    if not isinstance(token, str) or not token.startswith("SharedAccessSignature "):
        return "only SharedAccessSignature tokens can be checked by this emulator"
    fields = {name: values[0] for name, values in parse_qs(token[len("SharedAccessSignature "):]).items()}
    try:
        resource, signature, expiry = fields["sr"], fields["sig"], int(fields["se"])
    except (KeyError, ValueError):
        return "the token lacks sr, sig or se"
    if key_name and fields.get("skn") != key_name:
        return "the token names another shared access key"
    if expiry < time.time():
        return "the token has expired"
    expected = base64.b64encode(hmac.new(key.encode("utf-8"), f"{quote_plus(resource)}\n{expiry}".encode(),
                                         hashlib.sha256).digest()).decode()
    if not hmac.compare_digest(expected, signature):
        return "the signature does not match the key"
    return None


def _message(properties: list[Any], application_properties: dict[str, Any], value: Any) -> bytes:
    """An encoded response message: properties, application properties, amqp-value body."""
    full = (properties + [None] * 13)[:13]
    return (F.section(0x73, full) + b"\x00\x53\x74" + encode(application_properties)
            + b"\x00\x53\x77" + encode(value))


def _request(message: bytes) -> tuple[list[Any], dict[Any, Any], Any]:
    properties: list[Any] = []
    application: dict[Any, Any] = {}
    body: Any = None
    for code, _start, value_start, _end in F.split_sections(message):
        if code in (0x73, 0x74, 0x77):
            value, _ = decode(message, value_start)
            if code == 0x73 and isinstance(value, list):
                properties = value
            elif code == 0x74 and isinstance(value, dict):
                application = value
            elif code == 0x77:
                body = value
    return properties, application, body


def _respond(link: InboundLink, properties: list[Any], status: int, description: str, value: Any) -> None:
    reply_link = next((other for other in link.session.links.values()
                       if isinstance(other, OutboundLink) and other.kind == link.kind and not other.closed), None)
    if reply_link is None:
        logger.info("a %s request arrived with no reply link on its session", link.kind)
        return
    message_id = properties[0] if properties else None
    reply_link.reply(_message(
        [None, None, None, None, None, message_id],
        {"status-code": status, "status-description": description, "statusCode": status,
         "statusDescription": description},
        value))


def _put_token(connection: ConnectionView, link: InboundLink, message: bytes) -> None:
    properties, application, body = _request(message)
    operation = application.get("operation")
    audience = application.get("name")
    if operation != "put-token":
        _respond(link, properties, 400, f"unsupported $cbs operation {operation!r}", None)
        return
    server = connection.server
    token = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    problem = None if server.sas_key is None else check_sas_token(token, key_name=server.sas_key_name,
                                                                  key=server.sas_key)
    if problem is not None:
        logger.info("put-token for %s refused: %s", audience, problem)
        _respond(link, properties, 401, f"InvalidSignature: {problem}", None)
        return
    path = entity_path(audience if isinstance(audience, str) else None)
    if path:
        try:
            connection.namespace.hub(path[0])
        except BrokerError as missing:
            _respond(link, properties, 404, missing.description, None)
            return
    if isinstance(audience, str):
        connection.authorized_audiences.append(audience)
    _respond(link, properties, 202, "Accepted", None)


def _read(connection: ConnectionView, link: InboundLink, message: bytes) -> None:
    properties, application, _body = _request(message)
    operation = application.get("operation")
    if operation != "READ":
        _respond(link, properties, 400, f"unsupported $management operation {operation!r}", None)
        return
    try:
        value = _read_value(connection, application)
    except BrokerError as refused:
        status = {"amqp:not-found": 404, "amqp:unauthorized-access": 401,
                  "com.microsoft:argument-out-of-range": 404}.get(refused.condition, 400)
        _respond(link, properties, status, refused.description, None)
        return
    _respond(link, properties, 200, "OK", value)


def _read_value(connection: ConnectionView, application: dict[Any, Any]) -> dict[Any, Any]:
    kind, name = application.get("type"), application.get("name")
    if not isinstance(name, str):
        raise BrokerError("amqp:invalid-field", "a READ request needs the application property 'name'")
    hub = connection.namespace.hub(name)
    check_authorized(connection, hub)
    if kind == "com.microsoft:eventhub":
        return {"name": hub.name, "type": kind, "created_at": Timestamp(hub.created_at),
                "partition_count": hub.partition_count, "partition_ids": StringArray(hub.partition_ids)}
    if kind == "com.microsoft:partition":
        partition = hub.partition(str(application.get("partition")))
        return {"name": hub.name, "type": kind, "partition": partition.partition_id,
                "begin_sequence_number": partition.begin_sequence_number,
                "last_enqueued_sequence_number": partition.last_sequence_number,
                "last_enqueued_offset": str(partition.last_offset),
                "last_enqueued_time_utc": Timestamp(partition.last_enqueued_time),
                "is_partition_empty": partition.is_empty}
    raise BrokerError("amqp:invalid-field", f"unsupported READ type {kind!r}")

