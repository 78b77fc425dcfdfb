"""The stores the benchmark measures, each behind one per-partition interface
(:class:`StoreUnderTest`): ours through the ``CheckpointStore`` contract, the official Blob
store, and the bare-SDK floors. Every HTTP request is counted at the transport."""
from __future__ import annotations

import importlib
import logging
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from eventprocessor.stores.records import Checkpoint, Ownership
from harness.counting_transport import CountingTransport

__all__ = ["CONSUMER_GROUP", "EVENTHUB", "NAMESPACE", "OFFICIAL_STORE", "OWNER", "BareBlobWrites",
           "BareTableWrites", "BareWrites", "ContractStore", "OfficialBlobStore", "StoreUnderTest", "make"]

logger = logging.getLogger(__name__)

NAMESPACE = "bench.servicebus.windows.net"
EVENTHUB = "hub"
CONSUMER_GROUP = "$default"
OWNER = "bench-owner"
OFFICIAL_STORE = "azure-eventhub-checkpointstoreblob-aio"


class StoreUnderTest:
    """One store behind a uniform, per-partition interface the harness times.

    The adapter keeps the records it won so that re-claims and checkpoints use the
    etag / epoch the store handed back, the way a processor would.
    """

    name: str = "?"
    kind: str = "?"  # the --stores name
    fenced: bool = False
    checkpoint_only: bool = False  # a floor: it only writes checkpoints

    async def open(self) -> None:
        """Create what the store needs (container, table) before timing starts."""

    async def close(self) -> None:
        """Release the store's connections."""

    def request_counts(self) -> Counter | None:
        """Requests sent so far by HTTP method, or None when the store cannot be counted."""
        return None

    async def create_claim(self, partition_id: str) -> bool:
        raise NotImplementedError

    async def reclaim(self, partition_id: str) -> bool:
        raise NotImplementedError

    async def fence(self, partition_id: str) -> bool:
        """What a new owner does after its claim, before it checkpoints (fenced stores only)."""
        raise NotImplementedError

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        raise NotImplementedError

    async def list_ownership(self) -> int:
        raise NotImplementedError


class ContractStore(StoreUnderTest):
    """Any of our stores, through the ``CheckpointStore`` contract (records, epochs)."""

    fenced = True

    def __init__(
        self,
        name: str,
        store: Any,
        *,
        kind: str,
        request_counts: Callable[[], Counter | None],
        on_close: Callable[[], Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self._store = store
        self._request_counts = request_counts
        self._on_close = on_close
        self._owned: dict[str, Ownership] = {}

    async def open(self) -> None:
        # A listing makes stores that create their container/table lazily do it now,
        # outside the timed phases.
        await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)

    async def close(self) -> None:
        await self._store.close()
        if self._on_close is not None:
            await self._on_close()

    def request_counts(self) -> Counter | None:
        return self._request_counts()

    async def create_claim(self, partition_id: str) -> bool:
        # Epoch 2, as a claim over a released record: the timed fences are then those of
        # a steal or a handoff (three requests). A partition's very first claim (epoch 1)
        # fences with one create-if-absent, once per partition in its life.
        claim = Ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP, partition_id, OWNER, epoch=2)
        won = await self._store.claim_ownership([claim])
        for record in won:
            self._owned[record.partition_id] = record
        return bool(won)

    async def reclaim(self, partition_id: str) -> bool:
        won = await self._store.claim_ownership([self._owned[partition_id]])
        for record in won:
            self._owned[record.partition_id] = record
        return bool(won)

    async def fence(self, partition_id: str) -> bool:
        await self._store.fence_checkpoint(self._owned[partition_id])
        return True

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        record = self._owned[partition_id]
        await self._store.update_checkpoint(
            Checkpoint(NAMESPACE, EVENTHUB, CONSUMER_GROUP, partition_id, sequence_number, str(sequence_number)),
            owner_id=record.owner_id,
            epoch=record.epoch,
        )

    async def list_ownership(self) -> int:
        listing = await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)
        return len(listing.ownerships)


class OfficialBlobStore(StoreUnderTest):
    """``azure-eventhub-checkpointstoreblob-aio``: dict records, unfenced checkpoints.

    Its vendored client rejects ``UseDevelopmentStorage=true``, so it gets the explicit
    connection string; it does not create its container, so :meth:`open` does.
    """

    name = "official blob (unfenced)"
    kind = "official-blob"
    fenced = False

    def __init__(self, connection_string: str, container: str) -> None:
        from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

        self._connection_string = connection_string
        self._container = container
        self.transport = CountingTransport()
        self._store = BlobCheckpointStore.from_connection_string(
            connection_string, container, transport=self.transport
        )
        self._owned: dict[str, dict[str, Any]] = {}

    async def open(self) -> None:
        from azure.storage.blob.aio import ContainerClient

        async with ContainerClient.from_connection_string(self._connection_string, self._container) as client:
            await client.create_container()

    async def close(self) -> None:
        await self._store.close()

    def request_counts(self) -> Counter | None:
        return Counter(self.transport.requests)

    def _claim(self, partition_id: str, etag: str | None) -> dict[str, Any]:
        return {
            "fully_qualified_namespace": NAMESPACE,
            "eventhub_name": EVENTHUB,
            "consumer_group": CONSUMER_GROUP,
            "partition_id": partition_id,
            "owner_id": OWNER,
            "etag": etag,
        }

    async def create_claim(self, partition_id: str) -> bool:
        won = list(await self._store.claim_ownership([self._claim(partition_id, None)]))
        for record in won:
            self._owned[record["partition_id"]] = record
        return bool(won)

    async def reclaim(self, partition_id: str) -> bool:
        won = list(await self._store.claim_ownership([self._claim(partition_id, self._owned[partition_id]["etag"])]))
        for record in won:
            self._owned[record["partition_id"]] = record
        return bool(won)

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        await self._store.update_checkpoint(
            {
                "fully_qualified_namespace": NAMESPACE,
                "eventhub_name": EVENTHUB,
                "consumer_group": CONSUMER_GROUP,
                "partition_id": partition_id,
                "sequence_number": sequence_number,
                "offset": str(sequence_number),
            }
        )

    async def list_ownership(self) -> int:
        return len(list(await self._store.list_ownership(NAMESPACE, EVENTHUB, CONSUMER_GROUP)))


class BareWrites(StoreUnderTest):
    """A floor: the conditional write a fenced checkpoint cannot do without, If-Match the etag
    of the previous write, with the bare Azure SDK and nothing else (no verification, no
    write token, no record parsing). The same four fields our stores write."""

    fenced = False
    checkpoint_only = True

    def __init__(self, client: Any, transport: CountingTransport) -> None:
        self._client = client
        self.transport = transport
        self._etags: dict[str, str] = {}

    async def close(self) -> None:
        await self._client.close()

    def request_counts(self) -> Counter | None:
        return Counter(self.transport.requests)

    async def checkpoint(self, partition_id: str, sequence_number: int) -> None:
        etag = self._etags.get(partition_id)
        if etag is None:  # the untimed first write of each partition creates its record
            response = await self._create(partition_id, sequence_number)
        else:
            response = await self._replace(partition_id, sequence_number, etag)
        self._etags[partition_id] = response["etag"]

    async def _create(self, partition_id: str, sequence_number: int) -> Any:
        raise NotImplementedError

    async def _replace(self, partition_id: str, sequence_number: int, etag: str) -> Any:
        raise NotImplementedError


class BareBlobWrites(BareWrites):
    """The floor of a fenced Blob checkpoint: ``set_blob_metadata`` If-Match the etag of the
    previous write, with the azure-storage-blob SDK."""

    name = "floor: bare conditional Blob write"
    kind = "bare-blob"

    def __init__(self, connection_string: str, container: str) -> None:
        from azure.storage.blob.aio import ContainerClient

        transport = CountingTransport()
        super().__init__(ContainerClient.from_connection_string(connection_string, container, transport=transport),
                         transport)

    async def open(self) -> None:
        await self._client.create_container()

    def _blob(self, partition_id: str, sequence_number: int) -> tuple[Any, dict[str, str]]:
        metadata = {"sequencenumber": str(sequence_number), "offset": str(sequence_number), "ownerid": OWNER,
                    "epoch": "1"}
        return self._client.get_blob_client(f"{NAMESPACE}/{EVENTHUB}/{CONSUMER_GROUP}/checkpoint/{partition_id}"), \
            metadata

    async def _create(self, partition_id: str, sequence_number: int) -> Any:
        blob, metadata = self._blob(partition_id, sequence_number)
        return await blob.upload_blob(b"", metadata=metadata, overwrite=True)

    async def _replace(self, partition_id: str, sequence_number: int, etag: str) -> Any:
        from azure.core import MatchConditions

        blob, metadata = self._blob(partition_id, sequence_number)
        return await blob.set_blob_metadata(metadata, etag=etag, match_condition=MatchConditions.IfNotModified)


class BareTableWrites(BareWrites):
    """The floor of a fenced Table checkpoint: ``update_entity`` (replace) If-Match the etag
    of the previous write, with the azure-data-tables SDK."""

    name = "floor: bare conditional Table update"
    kind = "bare-table"

    def __init__(self, connection_string: str, table: str) -> None:
        from azure.data.tables.aio import TableClient

        transport = CountingTransport()
        super().__init__(TableClient.from_connection_string(connection_string, table, transport=transport), transport)

    async def open(self) -> None:
        await self._client.create_table()

    @staticmethod
    def _entity(partition_id: str, sequence_number: int) -> dict[str, Any]:
        from azure.data.tables import EdmType, EntityProperty

        return {"PartitionKey": f"{NAMESPACE} {EVENTHUB} {CONSUMER_GROUP} Checkpoint", "RowKey": partition_id,
                "sequencenumber": str(sequence_number), "offset": str(sequence_number), "ownerid": OWNER,
                "epoch": EntityProperty(1, EdmType.INT64)}

    async def _create(self, partition_id: str, sequence_number: int) -> Any:
        return await self._client.create_entity(self._entity(partition_id, sequence_number))

    async def _replace(self, partition_id: str, sequence_number: int, etag: str) -> Any:
        from azure.core import MatchConditions
        from azure.data.tables import UpdateMode

        return await self._client.update_entity(self._entity(partition_id, sequence_number), mode=UpdateMode.REPLACE,
                                                etag=etag, match_condition=MatchConditions.IfNotModified)


_OURS = {"ours-blob": ("ours blob (fenced)", "eventprocessor.stores.blob", "BlobCheckpointStore"),
         "ours-table": ("ours table (fenced)", "eventprocessor.stores.table", "TableCheckpointStore")}


def _ours(kind: str, connection_string: str, where: str) -> StoreUnderTest | None:
    """One of our Azure stores on ``where`` (a container or a table), its requests counted."""
    label, module, name = _OURS[kind]
    try:
        store_class = getattr(importlib.import_module(module), name)
    except ImportError as error:
        logger.warning("our %s is not available: %s", name, error)
        return None
    transport = CountingTransport()
    store = store_class.from_connection_string(connection_string, where, transport=transport)
    return ContractStore(label, store, kind=kind, request_counts=lambda: Counter(transport.requests))


def _memory() -> StoreUnderTest:
    from eventprocessor.stores import InMemoryCheckpointStore

    store = InMemoryCheckpointStore()
    return ContractStore(
        "ours in-memory (fenced)", store, kind="memory", request_counts=lambda: Counter(store.request_counts)
    )


def make(kind: str, connection_string: str | None, partitions: int) -> StoreUnderTest | None:
    suffix = f"{partitions}{uuid.uuid4().hex[:8]}"
    if kind == "memory":
        return _memory()
    assert connection_string is not None
    if kind == "ours-blob":
        return _ours(kind, connection_string, f"bench-ours-{suffix}")
    if kind == "official-blob":
        return OfficialBlobStore(connection_string, f"bench-official-{suffix}")
    if kind == "ours-table":
        return _ours(kind, connection_string, f"benchours{suffix}")
    if kind == "bare-blob":
        return BareBlobWrites(connection_string, f"bench-bare-{suffix}")
    if kind == "bare-table":
        return BareTableWrites(connection_string, f"benchbare{suffix}")
    raise ValueError(f"unknown store {kind!r}")
