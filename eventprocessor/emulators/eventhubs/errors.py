"""The error a request the service would refuse raises inside the emulator."""
from __future__ import annotations

__all__ = ["BrokerError"]


class BrokerError(Exception):
    """A request the service would refuse: ``condition`` is the AMQP error condition."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition
        self.description = description
