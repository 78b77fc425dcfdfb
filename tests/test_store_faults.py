"""The Azure stores under real network faults: Azurite behind the loopback fault proxy
(``eventprocessor/emulators/fault_proxy.py``). Lost responses of writes that landed, a black-holed
endpoint, resets and latency; every test is bounded in time (generous bounds: these
are real sockets on a shared machine)."""
from __future__ import annotations

import base64
import logging
import time
import traceback
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from eventprocessor.emulators.fault_proxy import FaultProxy
from eventprocessor.errors import CheckpointStoreError, ClaimOwnershipError, OwnershipLostError, StoreTimeoutError
from eventprocessor.stores import BlobCheckpointStore, TableCheckpointStore
from eventprocessor.stores.records import Checkpoint, Ownership

NS, HUB, CG = "faults.servicebus.windows.net", "hub", "$default"


@dataclass
class Setup:
    name: str
    proxy: FaultProxy
    make: Callable[..., Any]  # a store client through the proxy
    where: str  # the container or table name every error must name
    # what the protocol's write of a record looks like on the wire
    create_method: str
    replace_method: str


@pytest.fixture(params=["blob", "table"])
async def setup(request: pytest.FixtureRequest, azurite: Any) -> AsyncIterator[Setup]:
    port = azurite.blob_port if request.param == "blob" else azurite.table_port
    async with FaultProxy("127.0.0.1", port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/devstoreaccount1"
        if request.param == "blob":
            name = f"faults-{uuid.uuid4().hex[:10]}"
            yield Setup("blob", proxy,
                        lambda **kw: BlobCheckpointStore(url, name, credential=azurite.account_key, **kw),
                        name, create_method="PUT", replace_method="PUT")
        else:
            name = f"faults{uuid.uuid4().hex[:10]}"
            yield Setup("table", proxy, lambda **kw: TableCheckpointStore(url, name, credential=azurite.account_key,
                                                                          **kw),
                        name, create_method="POST", replace_method="PUT")


def _claim(pid: str = "0", owner: str = "me", **kw: Any) -> Ownership:
    return Ownership(NS, HUB, CG, pid, owner, **kw)


async def test_a_claim_whose_response_is_lost_is_still_won(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    """The first write's response is dropped after Azurite processed it; the transport
    retries (409 on create, 412 on the etag) or gives up (a Table create is a POST): the
    store re-reads, finds its own write token, and reports the claim won."""
    caplog.set_level(logging.INFO, logger="eventprocessor.stores")
    async with setup.make() as store:
        await store.list_ownership(NS, HUB, CG)  # creates the container / table
        setup.proxy.drop_response(1, method=setup.create_method)
        seen = len(setup.proxy.requests)
        [created] = await store.claim_ownership([_claim(epoch=1)])
        assert setup.proxy.dropped, "a response really was lost"
        read = "HEAD" if setup.name == "blob" else "GET"
        # Blob: the PUT, the transport's retry (409), our re-read. Table: the POST (not retried), our re-read.
        expected = ["PUT", "PUT", read] if setup.create_method == "PUT" else ["POST", read]
        assert [m for m, _t in setup.proxy.requests[seen:]] == expected
        listed = (await store.list_ownership(NS, HUB, CG)).ownerships
        assert [(o.owner_id, o.etag) for o in listed] == [("me", created.etag)]

        setup.proxy.drop_response(1, method=setup.replace_method)
        seen = len(setup.proxy.requests)
        [renewed] = await store.claim_ownership([created])
        assert len(setup.proxy.dropped) == 2
        assert [m for m, _t in setup.proxy.requests[seen:]] == ["PUT", "PUT", read], "the retry got 412, then re-read"
        listed = (await store.list_ownership(NS, HUB, CG)).ownerships
        assert [(o.owner_id, o.etag) for o in listed] == [("me", renewed.etag)]
    assert any("write token" in r.getMessage() or "write's token" in r.getMessage() or "its token" in r.getMessage()
               for r in caplog.records), "the recognised write is logged"


async def test_a_checkpoint_whose_response_is_lost_is_written_once(setup: Setup) -> None:
    async with setup.make() as store:
        [won] = await store.claim_ownership([_claim(epoch=1)])
        await store.fence_checkpoint(won)
        setup.proxy.drop_response(1, method=setup.replace_method)
        await store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", 7, "700"), owner_id="me", epoch=1)
        assert setup.proxy.dropped
        before = Counter(store.request_counts)
        await store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", 8, "800"), owner_id="me", epoch=1)
        assert Counter(store.request_counts) - before == Counter(replace_checkpoint=1), \
            "the landed write's etag is kept"
        assert [c.sequence_number for c in await store.list_checkpoints(NS, HUB, CG)] == [8]


async def test_a_black_holed_store_fails_within_the_operation_timeout(setup: Setup) -> None:
    bound = 1.5
    async with setup.make(operation_timeout=bound) as store:
        [won] = await store.claim_ownership([_claim(epoch=1)])
        setup.proxy.black_hole()
        calls = [
            lambda: store.list_ownership(NS, HUB, CG),
            lambda: store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", 1, "1"), owner_id="me", epoch=1),
            lambda: store.fence_checkpoint(won),
            lambda: store.list_checkpoints(NS, HUB, CG),
        ]
        for call in calls:
            start = time.monotonic()
            with pytest.raises(StoreTimeoutError) as raised:
                await call()
            elapsed = time.monotonic() - start
            assert bound - 0.1 <= elapsed < bound + 3, f"took {elapsed:.1f} s against a bound of {bound} s"
            message = str(raised.value)
            assert setup.where in message and "operation_timeout" in message
            assert isinstance(raised.value, CheckpointStoreError) and not isinstance(raised.value, OwnershipLostError)
            rendered = "".join(traceback.format_exception(raised.value))
            assert "Eby8vdM02xNOcqFlq" not in rendered and "AccountKey" not in rendered

        # A batch of claims: each claim has the deadline, the batch reports every failure.
        start = time.monotonic()
        with pytest.raises(ClaimOwnershipError) as raised_claims:
            await store.claim_ownership([replace(won, epoch=2), _claim("1")])
        assert time.monotonic() - start < bound + 3
        assert raised_claims.value.claimed == []
        assert all(isinstance(e, StoreTimeoutError) for e in raised_claims.value.failures.values())


async def test_the_default_bound_is_ten_seconds_not_minutes(azurite: Any) -> None:
    """With default settings a call against a black hole ends within ten seconds (the
    Azure SDK's own default would wait 123 s)."""
    async with FaultProxy("127.0.0.1", azurite.blob_port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/devstoreaccount1"
        async with BlobCheckpointStore(url, f"faults-{uuid.uuid4().hex[:10]}", credential=azurite.account_key) as store:
            assert store.operation_timeout == 10.0
            await store.list_ownership(NS, HUB, CG)
            proxy.black_hole()
            start = time.monotonic()
            with pytest.raises(StoreTimeoutError):
                await store.list_ownership(NS, HUB, CG)
            assert 9.9 <= time.monotonic() - start < 13


async def test_a_reset_connection_fails_fast_and_is_not_ownership_lost(setup: Setup) -> None:
    async with setup.make(operation_timeout=8.0) as store:
        [won] = await store.claim_ownership([_claim(epoch=1)])
        await store.fence_checkpoint(won)
        setup.proxy.reset()
        start = time.monotonic()
        with pytest.raises(CheckpointStoreError) as raised:
            await store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", 1, "1"), owner_id="me", epoch=1)
        assert not isinstance(raised.value, (OwnershipLostError, StoreTimeoutError))
        assert setup.where in str(raised.value)
        assert time.monotonic() - start < 8, "retried a few times, quickly, then failed"
        setup.proxy.pass_through()
        await store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", 2, "2"), owner_id="me", epoch=1)
        assert [c.sequence_number for c in await store.list_checkpoints(NS, HUB, CG)] == [2]


async def test_latency_below_the_bound_only_slows_calls_down(setup: Setup) -> None:
    async with setup.make(operation_timeout=5.0) as store:
        await store.list_ownership(NS, HUB, CG)
        setup.proxy.add_latency(0.3)
        start = time.monotonic()
        [won] = await store.claim_ownership([_claim(epoch=1)])
        await store.fence_checkpoint(won)
        await store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", 3, "3"), owner_id="me", epoch=1)
        assert time.monotonic() - start >= 3 * 0.3, "claim, fence (one create) and checkpoint each waited"
        assert [c.sequence_number for c in await store.list_checkpoints(NS, HUB, CG)] == [3]


@pytest.mark.parametrize("value", [0, -1, float("inf"), "10", True])
def test_operation_timeout_must_be_a_positive_number(value: Any) -> None:
    from eventprocessor.errors import ConfigurationError

    for cls in (BlobCheckpointStore, TableCheckpointStore):
        with pytest.raises(ConfigurationError, match="operation_timeout"):
            cls("http://127.0.0.1:1/devstoreaccount1", "checkpoints", credential=base64.b64encode(b"k" * 64).decode(),
                operation_timeout=value)


async def test_no_deadline_when_asked(setup: Setup) -> None:
    async with setup.make(operation_timeout=None) as store:
        assert store.operation_timeout is None
        assert (await store.list_ownership(NS, HUB, CG)).ownerships == ()
