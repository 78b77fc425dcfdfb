"""Attaching links: what a link address names (``$cbs``, ``$management``, a hub, a
partition to send to, a partition to receive from), the receiver's starting position
and owner level, and the service's refusal (a null terminus, then a detach with the
error) for an address it does not serve.

Addresses (``amqps://host:port/...`` or a bare path):

* ``$cbs``, ``$management``: the request and reply halves of put-token and READ;
* ``<hub>`` or ``<hub>/Partitions/<id>``: senders;
* ``<hub>/ConsumerGroups/<group>/Partitions/<id>``: receivers, with a selector filter
  for the starting position (none: the start) and ``com.microsoft:epoch`` as the owner
  level.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from . import frames as F
from .broker import EventHub
from .codec import AMQPDecodeError, Described, Symbol
from .errors import BrokerError
from .links import InboundLink, OutboundLink, Session
from .positions import parse_selector

if TYPE_CHECKING:  # pragma: no cover
    from .peer import ConnectionView

__all__ = ["attach", "entity_path", "check_authorized", "SENDER_CREDIT"]

logger = logging.getLogger(__name__)

SENDER_CREDIT = 1000
_EPOCH = "com.microsoft:epoch"
_RUNTIME_METRIC = "com.microsoft:enable-receiver-runtime-metric"
_SELECTOR = "apache.org:selector-filter:string"
_SELECTOR_CODE = 0x0000468C00000004


def entity_path(address: str | None) -> list[str]:
    """The path segments of a link address (``amqps://host:port/hub/...`` or a bare path)."""
    if not address:
        return []
    if "://" in address:
        address = urlparse(address).path
    return [segment for segment in address.strip("/").split("/") if segment]


def attach(connection: ConnectionView, session: Session, frame: F.Performative) -> None:
    """Answer the client's attach on ``session``: attach our end, or refuse."""
    fields, raw = frame.fields, frame.raw
    name, remote_handle, role = fields[0], fields[1], fields[2]
    if not isinstance(name, str) or not isinstance(remote_handle, int) or not isinstance(role, bool):
        raise AMQPDecodeError("attach needs a name, a handle and a role")
    if remote_handle in session.links:
        raise AMQPDecodeError(f"handle {remote_handle} is already attached")
    handle = session.next_handle
    session.next_handle += 1
    source = fields[5].value if isinstance(fields[5], Described) else None
    target = fields[6].value if isinstance(fields[6], Described) else None
    try:
        if role:  # the client receives: we send
            _attach_outbound(connection, session, frame, handle, source)
        else:  # the client sends: we receive
            inbound = _inbound(connection, session, name, remote_handle, handle, target[0] if target else None)
            session.links[remote_handle] = inbound
            connection.write(F.attach_frame(
                session.channel, name=name, handle=handle, role=True, snd_settle_mode=fields[3] or 0,
                rcv_settle_mode=0, source=F.Raw(raw[5]), target=F.Raw(raw[6]),
                initial_delivery_count=None, max_message_size=connection.namespace.max_message_size))
            inbound.credit = SENDER_CREDIT
            session.send_link_flow(inbound)
    except BrokerError as refused:
        logger.info("attach of %s to %s refused: %s", name, source[0] if role and source else
                    (target[0] if target else None), refused.description)
        session.refuse(fields, raw, role, handle, F.error(refused.condition, refused.description))


def _attach_outbound(connection: ConnectionView, session: Session, frame: F.Performative, handle: int,
                     source: list[Any] | None) -> None:
    fields, raw = frame.fields, frame.raw
    name = fields[0]
    properties = fields[13] if isinstance(fields[13], dict) else {}
    desired = fields[12] if isinstance(fields[12], list) else ([fields[12]] if fields[12] else [])
    link = _outbound(connection, session, name, fields[1], handle, source, properties, desired)
    if link.partition is not None:
        # The owner-level rules run before the attach is answered, so a refused receiver
        # gets the service's refusal: a null source, then the error.
        link.partition.add_receiver(link.consumer_group, link)
    session.links[fields[1]] = link
    offered = [_RUNTIME_METRIC] if link.runtime_metric else None
    connection.write(F.attach_frame(
        session.channel, name=name, handle=handle, role=False, snd_settle_mode=1,
        rcv_settle_mode=fields[4] or 0, source=F.Raw(raw[5]), target=F.Raw(raw[6]),
        initial_delivery_count=0, max_message_size=connection.namespace.max_message_size,
        offered_capabilities=offered,
        properties={Symbol(_EPOCH): link.owner_level} if link.owner_level is not None else None))
    if link.partition is not None:
        logger.debug("receiver %s attached to %s/%s partition %s at sequence %d (owner level %s)",
                     name, link.partition.hub.name, link.consumer_group, link.partition.partition_id,
                     link.cursor, link.owner_level)


def _outbound(connection: ConnectionView, session: Session, name: str, remote_handle: int, handle: int,
              source: list[Any] | None, properties: dict[Any, Any], desired: list[Any]) -> OutboundLink:
    address = source[0] if source else None
    path = entity_path(address)
    if path in (["$cbs"], ["$management"]):
        return OutboundLink(session, name, remote_handle, handle, address, path[0][1:])
    # <hub>/ConsumerGroups/<group>/Partitions/<id>
    if len(path) != 5 or path[1].lower() != "consumergroups" or path[3].lower() != "partitions":
        raise BrokerError("amqp:not-found", f"The messaging entity '{address}' could not be found: a receiver "
                                            "address is <hub>/ConsumerGroups/<group>/Partitions/<id>.")
    namespace = connection.namespace
    hub = namespace.hub(path[0])
    hub.check_consumer_group(path[2])
    partition = hub.partition(path[4])
    namespace.check_busy()
    check_authorized(connection, hub)
    link = OutboundLink(session, name, remote_handle, handle, address, "partition")
    link.consumer_group = path[2]
    level = properties.get(_EPOCH, properties.get(Symbol(_EPOCH)))
    if level is not None and not isinstance(level, int):
        raise BrokerError("amqp:invalid-field", f"{_EPOCH} must be a long, got {type(level).__name__}")
    link.owner_level = level
    link.runtime_metric = _RUNTIME_METRIC in desired
    link.cursor = partition.resolve(parse_selector(_selector(source)))
    link.partition = partition
    return link


def _selector(source: list[Any] | None) -> str | None:
    """The selector filter's expression of a receiver's source, or None (no filter)."""
    filters = source[7] if source and len(source) > 7 and isinstance(source[7], dict) else {}
    expression = None
    for key, value in filters.items():
        described = value if isinstance(value, Described) else None
        if key == _SELECTOR or (described is not None and described.descriptor in (_SELECTOR, _SELECTOR_CODE)):
            expression = described.value if described is not None else value
    if expression is not None and not isinstance(expression, str):
        raise BrokerError("amqp:invalid-field", "the selector filter must be a string")
    return expression


def _inbound(connection: ConnectionView, session: Session, name: str, remote_handle: int, handle: int,
             address: str | None) -> InboundLink:
    path = entity_path(address)
    if path in (["$cbs"], ["$management"]):
        return InboundLink(session, name, remote_handle, handle, address, path[0][1:])
    if len(path) == 1:
        hub = connection.namespace.hub(path[0])
        check_authorized(connection, hub)
        return InboundLink(session, name, remote_handle, handle, address, "hub", hub)
    if len(path) == 3 and path[1].lower() == "partitions":
        hub = connection.namespace.hub(path[0])
        partition = hub.partition(path[2])
        check_authorized(connection, hub)
        return InboundLink(session, name, remote_handle, handle, address, "hub", hub, partition)
    raise BrokerError("amqp:not-found", f"The messaging entity '{address}' could not be found: a sender address "
                                        "is <hub> or <hub>/Partitions/<id>.")


def check_authorized(connection: ConnectionView, hub: EventHub) -> None:
    """With token checking on, a hub is reached only after a valid token was put for it
    (or for the whole namespace) on this connection."""
    if connection.server.sas_key is None:
        return
    wanted = hub.name.casefold()
    for audience in connection.authorized_audiences:
        path = entity_path(audience)
        if not path or path[0].casefold() == wanted:
            return
    raise BrokerError("amqp:unauthorized-access",
                      f"Unauthorized access to '{hub.name}': no valid token was put for it on this connection.")
