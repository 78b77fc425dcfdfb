"""Shared fixtures: a session-wide Azurite and the CI rule that missing services fail."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from eventprocessor.emulator import Azurite, AzuriteUnavailable, start_azurite

IN_CI = bool(os.environ.get("CI"))


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: tests that need a service never pass silently in CI."""
    if IN_CI:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """One Azurite for the whole test session, on free loopback ports."""
    try:
        instance = start_azurite()
    except AzuriteUnavailable as error:
        unavailable(f"Azurite could not start: {error}")
        raise  # unreachable; keeps type checkers happy
    try:
        yield instance
    finally:
        instance.stop()
