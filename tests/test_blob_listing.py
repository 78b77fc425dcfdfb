"""The Blob store's lean listing (``eventprocessor.stores._blob_listing``) on Azurite:
for every kind of record, tricky names, metadata and several pages, it returns exactly
what azure-storage-blob's ``list_blobs`` returns, authenticates as the SDK does, and a
failing listing raises what the SDK raises."""
from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from azure.core.credentials import AzureSasCredential
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobProperties, ContainerSasPermissions, generate_container_sas
from azure.storage.blob.aio import ContainerClient

from eventprocessor.stores import BlobCheckpointStore
from eventprocessor.stores.backend import CHECKPOINT, MEMBER, OWNERSHIP, BackendFailure, Kind
from eventprocessor.stores.blob import BlobRecords
from eventprocessor.stores.codec import encode_name
from eventprocessor.stores.records import Checkpoint, Member, Ownership

NS = "Lean.Servicebus.windows.net"  # mixed case: blob names are lower-cased
HUB = "Orders-2.v1"
OWNERS = ["Owner A/b+x", "node-1.example", "UPPER_case"]  # encoded into member blob names
PARTITIONS = ["0", "1", "P.1-X", "a-b.c", "10"]


def _raw(blobs: list[Any]) -> list[tuple[str, str | None, datetime | None, dict[str, Any]]]:
    """What the store reads of each listed blob, from ``BlobProperties`` or ``ListedBlob``."""
    return [(b.name, b.etag, b.last_modified, dict(b.metadata)) for b in blobs]


@pytest.fixture
async def filled(azurite: Any) -> AsyncIterator[tuple[BlobCheckpointStore, str, str]]:
    """A container with ownership (one released: an empty ``ownerid``), checkpoints,
    members, log entries and a foreign blob, listed two blobs per page."""
    container = f"lean-{uuid.uuid4().hex[:10]}"
    cg = f"CG-{uuid.uuid4().hex[:6]}"
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    backend = store.backend
    assert isinstance(backend, BlobRecords)
    backend.page_size = 2
    claimed = await store.claim_ownership(
        [Ownership(NS, HUB, cg, pid, OWNERS[i % len(OWNERS)]) for i, pid in enumerate(PARTITIONS)])
    assert len(claimed) == len(PARTITIONS)
    assert await store.release_ownership(claimed[-1])
    for owned in claimed[:3]:
        assert await store.fence_checkpoint(owned) is None
        await store.update_checkpoint(Checkpoint(NS, HUB, cg, owned.partition_id, 42, "4200"),
                                      owner_id=owned.owner_id, epoch=owned.epoch)
    for index, owner in enumerate(OWNERS):
        await store.write_member(Member(NS, HUB, cg, owner, properties={"strategy": "balanced",
                                                                         "ordinal": str(index), "note": ""}))
    for entry in ("Batch-0001.json", "batch-0002.json", "Ünïcode entry"):
        assert await store.create_entry(NS, HUB, cg, "Commit Log", entry, entry.encode())
    async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
        await raw.upload_blob(backend.prefix(OWNERSHIP, (NS, HUB, cg)) + "sub/foreign", b"x",
                              metadata={"MixedCase": "Value", "empty": ""})
    try:
        yield store, container, cg
    finally:
        await store.close()
        async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
            await raw.delete_container()


async def _both(backend: BlobRecords, prefix: str) -> tuple[list[Any], list[Any], int]:
    """The blobs listed by the lean path and by the SDK's ``list_blobs``, two per page,
    and the pages (responses) of each, which must agree."""
    lean = backend.lean
    assert lean is not None
    dates: dict[str, list[datetime]] = {"lean": [], "sdk": []}

    def hook(which: str) -> Any:
        return lambda response: dates[which].append(parsedate_to_datetime(response.http_response.headers["Date"]))

    listed = await lean.list(prefix, hook=hook("lean"), page_size=2)
    sdk = [blob async for blob in backend.client.list_blobs(
        name_starts_with=prefix, include=["metadata"], raw_response_hook=hook("sdk"), results_per_page=2)]
    assert len(dates["lean"]) == len(dates["sdk"]), "as many pages"
    assert all(isinstance(blob, BlobProperties) for blob in sdk)
    assert not any(isinstance(blob, BlobProperties) for blob in listed)
    # The server's clock (ServerClock's source): every page's Date, no earlier than what it lists.
    assert abs(max(dates["lean"]) - max(dates["sdk"])) <= timedelta(seconds=5)
    assert all(blob.last_modified <= max(dates["lean"]) for blob in listed)
    return listed, sdk, len(dates["lean"])


async def test_lean_listing_returns_what_the_sdk_listing_returns(filled: Any) -> None:
    store, _container, cg = filled
    backend = store.backend
    scope = (NS, HUB, cg)
    entries = Kind("entry", encode_name("Commit Log"))
    cases = [  # (prefix, blobs under it)
        (backend.prefix(OWNERSHIP, scope).rstrip("/"), len(PARTITIONS) + len(OWNERS) + 1),  # a balancing tick
        (backend.prefix(CHECKPOINT, scope), 3),
        (backend.prefix(entries, scope), 3),
        (backend.prefix(MEMBER, scope), len(OWNERS)),
        ("", len(PARTITIONS) + len(OWNERS) + 1 + 3 + 3),  # the whole container
        ("no/such/prefix/", 0),
    ]
    for prefix, expected in cases:
        lean, sdk, pages = await _both(backend, prefix)
        assert _raw(lean) == _raw(sdk), prefix
        assert len(lean) == expected, prefix
        assert pages == max(1, math.ceil(expected / 2)), prefix
        for blob in lean:
            assert blob.last_modified is not None and blob.last_modified.tzinfo is not None
            assert blob.last_modified.utcoffset() == timedelta(0)

    assert backend.lean is not None
    listed = {blob.name: blob for blob in await backend.lean.list("")}
    names = set(listed)
    base = f"{NS}/{HUB}/{cg}/".lower()
    assert base + "ownership/p.1-x" in names  # upper-case input lower-cased
    assert base + "ownership-member/%4fwner%20%41%2fb%2bx" in names  # the codec's %xx owner ids
    assert base + "log/%43ommit%20%4cog/%c3%9cn%c3%afcode%20entry" in names
    assert listed[base + "ownership/10"].metadata["ownerid"] is None  # released: empty, as the SDK lists it
    assert listed[base + "ownership/sub/foreign"].metadata == {"MixedCase": "Value", "empty": None}
    assert listed[base + "ownership-member/%55%50%50%45%52_case"].metadata["note"] is None

    # The store's own listings agree record for record (their clocks are seconds apart).
    def records(result: Any) -> Any:
        return [(r.key, r.etag, r.last_modified, dict(r.fields), r.name) for r in result.records], result.foreign

    before = backend.request_counts.copy()
    lean_pair = await backend.list_ownership_and_members(scope)
    lean_checkpoints = await backend.list(CHECKPOINT, scope)
    lean_entries = await backend.list(entries, scope, encode_name("Batch"))
    lean_pages = backend.request_counts - before
    saved, backend.lean = backend.lean, None
    try:
        before = backend.request_counts.copy()
        sdk_pair = await backend.list_ownership_and_members(scope)
        sdk_checkpoints = await backend.list(CHECKPOINT, scope)
        sdk_entries = await backend.list(entries, scope, encode_name("Batch"))
        sdk_pages = backend.request_counts - before
    finally:
        backend.lean = saved
    assert lean_pages == sdk_pages == {"list_ownership": 5, "list_checkpoint": 2, "list_entry": 1}
    for lean_listing, sdk_listing in [*zip(lean_pair, sdk_pair, strict=True), (lean_checkpoints, sdk_checkpoints),
                                      (lean_entries, sdk_entries)]:
        assert records(lean_listing) == records(sdk_listing)
        assert lean_listing.server_time is not None and sdk_listing.server_time is not None
        assert abs(lean_listing.server_time - sdk_listing.server_time) <= timedelta(seconds=5)
        assert all(r.last_modified <= lean_listing.server_time for r in lean_listing.records)
    assert [r.key for r in lean_pair[1].records] == sorted(encode_name(owner) for owner in OWNERS)
    assert lean_pair[0].foreign and lean_pair[0].foreign == sdk_pair[0].foreign
    assert [r.key for r in lean_entries.records] == ["%42atch-0001.json"]

    # And the public store API reads the same through it.
    ownership = await store.list_ownership(NS, HUB, cg)
    assert sorted(o.partition_id for o in ownership.ownerships) == sorted(p.lower() for p in PARTITIONS)


async def test_lean_listing_authenticates_with_a_sas_as_the_sdk_does(filled: Any, azurite: Any) -> None:
    store, container, cg = filled
    sas = generate_container_sas("devstoreaccount1", container, account_key=azurite.account_key,
                                 permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    lean = store.backend.lean
    assert lean is not None
    expected = _raw(await lean.list(""))
    for sas_store in (BlobCheckpointStore(f"{azurite.blob_endpoint}?{sas}", container),
                      BlobCheckpointStore(azurite.blob_endpoint, container, credential=AzureSasCredential(sas)),
                      BlobCheckpointStore(azurite.blob_endpoint, container, credential=sas)):
        async with sas_store:
            backend = sas_store.backend
            assert isinstance(backend, BlobRecords) and backend.lean is not None
            assert _raw(await backend.lean.list("")) == expected


async def _failure(backend: BlobRecords, lean: bool) -> BackendFailure:
    saved = backend.lean
    if not lean:
        backend.lean = None
    try:
        with pytest.raises(BackendFailure) as caught:
            await backend.list(OWNERSHIP, (NS, HUB, "cg"))
    finally:
        backend.lean = saved
    return caught.value


async def test_lean_listing_fails_as_the_sdk_listing_does(azurite: Any) -> None:
    container = f"lean-gone-{uuid.uuid4().hex[:8]}"
    lean_store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    sdk_store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    wrong_key = BlobCheckpointStore(azurite.blob_endpoint, container,
                                    credential={"account_name": "devstoreaccount1", "account_key": "A" * 88})
    async with lean_store, sdk_store, wrong_key:
        await lean_store.list_ownership(NS, HUB, "cg")  # creates the container
        await sdk_store.list_ownership(NS, HUB, "cg")
        async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
            await raw.delete_container()
        lean = await _failure(lean_store.backend, lean=True)  # type: ignore[arg-type]
        sdk = await _failure(sdk_store.backend, lean=False)  # type: ignore[arg-type]
        for failure in (lean, sdk):
            cause = failure.__cause__
            assert isinstance(cause, ResourceNotFoundError) and cause.error_code == "ContainerNotFound"
            assert "does not exist" in str(failure) and not failure.maybe_written
        assert str(lean) == str(sdk)
        assert type(lean.__cause__) is type(sdk.__cause__)
        assert not (await lean_store.list_ownership(NS, HUB, "cg")).ownerships  # created again

        refused = [await _failure(wrong_key.backend, lean=flag) for flag in (True, False)]  # type: ignore[arg-type]
        for failure in refused:
            assert isinstance(failure.__cause__, HttpResponseError)
            assert failure.__cause__.status_code == 403
        assert type(refused[0].__cause__) is type(refused[1].__cause__)
        assert getattr(refused[0].__cause__, "error_code", None) == getattr(refused[1].__cause__, "error_code", None)
        assert str(refused[0]) == str(refused[1])
        async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
            await raw.delete_container()



async def test_a_listing_retried_after_a_transport_failure_still_reads_the_servers_clock(
        filled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """azure-storage-blob's response hook takes ``raw_response_hook`` off the request at its
    first attempt, and the retry policy runs outside it: a listing whose first attempt failed
    in the transport (a keep-alive connection the server closed) was retried without the
    hook, so the store saw no Date header, the tick failed ("returned no server time") and
    the next one listed every ownership record again (8-11 extra full listings in a 4096 x 32
    cold start on Azurite). The listing reads the clock from the answer it used."""
    from azure.core.exceptions import ServiceResponseError
    from azure.core.pipeline.transport import AioHttpTransport

    store, _container, cg = filled
    send = AioHttpTransport.send
    failures = {"left": 0}

    async def flaky(self: Any, request: Any, **kwargs: Any) -> Any:
        if failures["left"] and "comp=list" in request.url:
            failures["left"] -= 1
            raise ServiceResponseError("the server closed the connection (injected)")
        return await send(self, request, **kwargs)

    monkeypatch.setattr(AioHttpTransport, "send", flaky)
    backend = store.backend
    assert isinstance(backend, BlobRecords) and backend.lean is not None
    for failing in (False, True):
        failures["left"] = math.ceil(len(OWNERS) / 2) if failing else 0  # the first attempt of every page
        before = dict(backend.request_counts)
        listing = await backend.list(MEMBER, (NS, HUB, cg))
        assert failures["left"] == 0  # each failed once and was retried
        assert listing.server_time is not None, "no Date header read"
        assert abs(listing.server_time - datetime.now(timezone.utc)) < timedelta(minutes=5)
        assert len(listing.records) == len(OWNERS)
        pages = backend.request_counts["list_member"] - before.get("list_member", 0)
        assert pages == math.ceil(len(OWNERS) / 2)  # counted once per page, not per attempt
