"""``eventprocessor status``: the status of a group, read from its store, checked against the store.

* Unit: every partition state (owned, expired, released, unclaimed, unreadable, a pending
  handoff), members with and without heartbeat records, the summary line and lag, built
  from the in-memory store and ``InMemoryEventSource`` on an injected clock.
* Faults: a store or a hub that fails or never answers (bounded, one line, no secret).
* The command as a user runs it: ``--help`` (also without extras), missing extras, bad
  options, an unreachable or silent store, an unreachable event hub.
* Azurite: a live group of three worker processes (``tests/status_worker.py``) on the
  Blob store; ``status --json``, the table and ``--watch`` are checked row by row against
  the store's own records. The Table store, and the Blob store by account URL with an
  account key and with a SAS token, on hand-written records (with expired ones).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from eventprocessor.cli import main
from eventprocessor.cli.status import (
    EVENTHUB_CONNECTION_STRING_ENV,
    STORE_ACCOUNT_KEY_ENV,
    STORE_CONNECTION_STRING_ENV,
    STORE_SAS_TOKEN_ENV,
    build_status,
    read_status,
    render,
)
from eventprocessor.cli.user_errors import CommandError
from eventprocessor.errors import CheckpointStoreError, EventSourceError
from eventprocessor.sources import InMemoryEventSource, PartitionProperties
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import (
    Checkpoint,
    Member,
    MemberListing,
    Ownership,
    OwnershipListing,
    UnreadableOwnership,
)
from tests.test_cli import assert_one_line_error, run_cli

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "status_worker.py"
NS, HUB, GROUP = "status-test.local", "telemetry", "$default"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
SECRET = "c2VjcmV0LXRoYXQtbXVzdC1uZXZlci1zaG93"  # base64, so it parses as a key


# --------------------------------------------------------------------------- unit


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def _group_with_every_state():
    """Six partitions: owned (checkpointed), owned with a handoff request, expired,
    released, unclaimed, owned (checkpointed); members a (heartbeat), b (no heartbeat),
    c (standby, heartbeat), ghost (heartbeat expired)."""
    clock = Clock()
    store = InMemoryCheckpointStore(clock=clock)
    source = InMemoryEventSource(6, eventhub_name=HUB, fully_qualified_namespace=NS)
    for pid, count in {"0": 10, "1": 3, "2": 4, "5": 5}.items():
        await source.send_batch([f"e{i}" for i in range(count)], partition_id=pid)

    def record(pid: str, owner: str, epoch: int, **extra) -> Ownership:
        return Ownership(NS, HUB, GROUP, pid, owner, epoch=epoch, **extra)

    await store.claim_ownership([record("2", "old", 2)])
    await store.write_member(Member(NS, HUB, GROUP, "ghost", properties={"strategy": "balanced"}))
    clock.now = T0 + timedelta(seconds=90)
    won = await store.claim_ownership([record("0", "a", 3), record("1", "b", 1, requested_by="c"),
                                       record("3", "b", 4), record("5", "a", 1)])
    released = next(r for r in won if r.partition_id == "3")
    assert await store.release_ownership(released)
    await store.update_checkpoint(Checkpoint(NS, HUB, GROUP, "0", 4, offset="4"), owner_id="a", epoch=3)
    await store.update_checkpoint(Checkpoint(NS, HUB, GROUP, "5", 2, offset="2"), owner_id="a", epoch=1)
    await store.write_member(Member(NS, HUB, GROUP, "a", properties={"strategy": "greedy", "handoff": "1"}))
    await store.write_member(Member(NS, HUB, GROUP, "c", properties={"strategy": "greedy", "handoff": "1",
                                                                      "ordinal": "2"}))
    clock.now = T0 + timedelta(seconds=95)
    return store, source


async def test_every_partition_state_member_and_the_summary_from_the_records():
    store, source = await _group_with_every_state()
    status = await read_status(store, NS, HUB, GROUP, source=source, expiration=60)
    rows = {row.partition_id: row for row in status.partitions}
    assert [row.partition_id for row in status.partitions] == ["0", "1", "2", "3", "4", "5"]
    assert {pid: row.state for pid, row in rows.items()} == {
        "0": "owned", "1": "owned", "2": "expired", "3": "released", "4": "unclaimed", "5": "owned"}
    assert (rows["0"].owner_id, rows["0"].epoch, rows["0"].lease_age) == ("a", 3, 5.0)
    assert (rows["2"].owner_id, rows["2"].epoch, rows["2"].lease_age) == ("old", 2, 95.0)
    assert rows["1"].requested_by == "c" and rows["0"].requested_by == ""
    assert rows["3"].owner_id is None and rows["3"].epoch == 4  # a release keeps the epoch
    assert rows["4"].owner_id is None and rows["4"].epoch is None
    assert (rows["0"].checkpoint_sequence_number, rows["0"].checkpoint_offset, rows["0"].checkpoint_owner_id,
            rows["0"].checkpoint_epoch) == (4, "4", "a", 3)
    # Lag: after the checkpoint, or the whole partition when there is none.
    assert {pid: (row.last_enqueued_sequence_number, row.lag, row.lag_from) for pid, row in rows.items()} == {
        "0": (9, 5, "checkpoint"), "1": (2, 3, "start"), "2": (3, 4, "start"), "3": (-1, 0, "start"),
        "4": (-1, 0, "start"), "5": (4, 2, "checkpoint")}

    members = {m.owner_id: m for m in status.members}
    assert {k: (m.state, m.owned, m.expired) for k, m in members.items()} == {
        "a": ("live", 2, 0), "b": ("live", 1, 0), "c": ("live", 0, 0), "ghost": ("gone", 0, 0),
        "old": ("gone", 0, 1)}
    assert members["a"].heartbeat_age == 5.0 and members["ghost"].heartbeat_age == 95.0
    assert members["b"].heartbeat_age is None  # owns a record, keeps no heartbeat
    assert members["c"].properties["ordinal"] == "2"

    summary = status.summary
    assert (summary.partitions, summary.owned, summary.unowned, summary.expired, summary.unreadable,
            summary.handoffs_pending) == (6, 3, 2, 1, 0, 1)
    assert (summary.live_members, summary.imbalance, summary.most_owned, summary.fewest_owned) == (3, 2, 2, 0)
    assert (summary.lag, summary.lag_known, summary.partitions_from) == (14, 6, "eventhub")
    assert summary.line() == ("6 partitions: 3 owned, 2 unowned, 1 expired, 1 handoff pending · 3 live members, "
                              "imbalance 2 (most 2, fewest 0) · lag 14 events")
    assert status.lag_note is None and status.members_note is None and status.records_note is None


def table_rows(text: str, first_column: str) -> dict[str, list[str]]:
    """The rows of the table whose header starts with ``first_column``, by first cell
    (cells are separated by two spaces or more)."""
    rows: dict[str, list[str]] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    return rows


async def test_the_table_and_json_show_what_was_read():
    store, source = await _group_with_every_state()
    status = await read_status(store, NS, HUB, GROUP, source=source, expiration=60)
    console = Console(record=True, width=250)
    console.print(render(status))
    text = console.export_text()
    rows = table_rows(text, "partition")
    assert rows["0"] == ["0", "a", "owned", "3", "5s", "4", "4", "9", "5"]
    assert rows["1"] == ["1", "b", "owned, handoff to c", "1", "5s", "-", "-", "2", "3 from start"]
    assert rows["2"] == ["2", "old", "expired", "2", "1m35s", "-", "-", "3", "4 from start"]
    assert rows["3"][:4] == ["3", "-", "released", "4"] and rows["4"][:4] == ["4", "-", "unclaimed", "-"]
    members = table_rows(text, "member")
    assert members["ghost"] == ["ghost", "gone", "0", "0", "1m35s", "balanced", "-", "-"]
    assert members["c"] == ["c", "live", "0", "0", "5s", "greedy", "1", "2"]
    assert members["old"] == ["old", "gone", "0", "1", "-", "-", "-", "-"]
    assert text.splitlines()[-1] == status.summary.line()

    # Without the hub nor checkpoint times, the columns nobody could fill are left out.
    console = Console(record=True, width=250)
    console.print(render(await read_status(store, NS, HUB, GROUP)))
    text = console.export_text()
    assert table_rows(text, "partition")["0"] == ["0", "a", "owned", "3", "5s", "4", "4"]
    assert "last enqueued" not in text and "checkpointed" not in text

    document = json.loads(json.dumps(status.to_json()))
    assert document["summary_line"] == status.summary.line()
    assert document["summary"]["expired"] == 1 and document["summary"]["lag"] == 14
    assert document["server_time"] == (T0 + timedelta(seconds=95)).isoformat()
    by_id = {row["partition_id"]: row for row in document["partitions"]}
    assert by_id["1"]["requested_by"] == "c" and by_id["0"]["lag"] == 5
    assert {m["owner_id"]: m["properties"] for m in document["members"]}["a"] == {"strategy": "greedy",
                                                                                  "handoff": "1"}


def test_a_record_kept_by_its_owners_heartbeat_is_owned_however_old():
    """A processor whose member record keeps its partitions (``lease=member``) does not
    rewrite them: status judges them as the processors do, from the later heartbeat."""
    now = T0
    old = now - timedelta(seconds=600)
    listing = OwnershipListing(ownerships=(Ownership(NS, HUB, GROUP, "0", "a", last_modified_time=old, epoch=1),
                                           Ownership(NS, HUB, GROUP, "1", "b", last_modified_time=old, epoch=1)),
                               server_time=now)
    members = MemberListing(members=(Member(NS, HUB, GROUP, "a", now - timedelta(seconds=5), properties={
        "lease": "member"}), Member(NS, HUB, GROUP, "b", now - timedelta(seconds=5))), server_time=now)
    status = build_status(fully_qualified_namespace=NS, eventhub_name=HUB, consumer_group=GROUP, store="s",
                          expiration=60, ownership=listing, checkpoints=[], members=members)
    assert [(row.state, row.lease_age) for row in status.partitions] == [("owned", 5.0), ("expired", 600.0)]


def test_unreadable_records_checkpoint_times_and_retention():
    now = T0
    listing = OwnershipListing(
        ownerships=(Ownership(NS, HUB, GROUP, "0", "a", last_modified_time=now - timedelta(seconds=3), epoch=1),),
        server_time=now,
        unreadable=(UnreadableOwnership("1", '"etag"', now - timedelta(seconds=70), "epoch is not an integer"),))
    checkpoints = [Checkpoint(NS, HUB, GROUP, "0", 5, offset="50", last_modified_time=now - timedelta(seconds=8))]
    properties = {"0": PartitionProperties("0", beginning_sequence_number=10, last_enqueued_sequence_number=20,
                                           last_enqueued_offset="200", last_enqueued_time_utc=now, is_empty=False)}
    status = build_status(fully_qualified_namespace=NS, eventhub_name=HUB, consumer_group=GROUP, store="s",
                          expiration=60, ownership=listing, checkpoints=checkpoints, properties=properties)
    first, second = status.partitions
    assert first.checkpoint_age == 8.0 and first.checkpoint_time == now - timedelta(seconds=8)
    # Events 6..9 are past retention: 10..20 remain to be processed.
    assert (first.lag, first.lag_from) == (11, "checkpoint")
    assert (second.state, second.note, second.lease_age, second.owner_id) == (
        "unreadable", "epoch is not an integer", 70.0, None)
    assert status.summary.unreadable == 1 and status.summary.partitions_from == "store"
    assert status.summary.line().startswith("2 partitions (seen in the store): 1 owned, 0 unowned, 0 expired, "
                                            "1 unreadable")
    assert status.summary.lag == 11 and "(1 of 2 partitions known)" in status.summary.line()


class _NoProperties(InMemoryEventSource):
    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        raise NotImplementedError


class _Silent(InMemoryEventSource):
    async def get_partition_ids(self) -> list[str]:
        await asyncio.Event().wait()
        return []


class _Leaky(InMemoryEventSource):
    async def get_partition_ids(self) -> list[str]:
        raise RuntimeError(f"connection refused; SharedAccessKey={SECRET}")


class _Refused(InMemoryEventSource):
    async def get_partition_ids(self) -> list[str]:
        raise EventSourceError("the event hub refused the credential", fully_qualified_namespace=NS,
                               eventhub_name=HUB)


@pytest.mark.parametrize("source, note", [
    (_NoProperties, "lag: unknown (_NoProperties does not report partition properties)"),
    (_Silent, f"lag: unknown (the event hub {NS}/{HUB} did not answer within 1 s)"),
    (_Leaky, f"lag: unknown (the event hub {NS}/{HUB}: RuntimeError (run with -v for details))"),
    (_Refused, f"lag: unknown (the event hub {NS}/{HUB}: the event hub refused the credential)"),
])
async def test_an_event_hub_that_fails_makes_only_the_lag_unknown_and_says_why(source, note):
    store, _source = await _group_with_every_state()
    failing = source(6, eventhub_name=HUB, fully_qualified_namespace=NS)
    # 1 s, not 0.2: the in-memory store's read shares the deadline, and under the full
    # suite on 2 cores it missed 0.2 s twice (CI, 2026-11-29)
    status = await read_status(store, NS, HUB, GROUP, source=failing, expiration=60, timeout=1.0)
    assert status.lag_note == note
    assert SECRET not in json.dumps(status.to_json())
    assert status.summary.lag is None and status.summary.line().endswith("lag unknown")
    assert [row.state for row in status.partitions][:3] == ["owned", "owned", "expired"]


class _SilentStore(InMemoryCheckpointStore):
    async def list_ownership(self, *scope):
        await asyncio.Event().wait()


class _FailingStore(InMemoryCheckpointStore):
    async def list_checkpoints(self, *scope):
        raise CheckpointStoreError("listing checkpoints failed: ServiceRequestError")


class _NoMembers(InMemoryCheckpointStore):
    async def list_members(self, *scope):
        raise NotImplementedError


async def test_a_store_that_fails_or_never_answers_is_one_error():
    with pytest.raises(CommandError, match=r"^cannot read the checkpoint store .*: the checkpoint store did not "
                                           r"answer within 0.2 s$"):
        await read_status(_SilentStore(), NS, HUB, GROUP, source=_Silent(2), timeout=0.2)
    with pytest.raises(CommandError, match="listing checkpoints failed: ServiceRequestError"):
        await read_status(_FailingStore(), NS, HUB, GROUP)
    status = await read_status(_NoMembers(), NS, HUB, GROUP, lag_note="lag: unknown (no source)")
    assert status.members_note.startswith("members: not kept by this store")
    assert status.lag_note == "lag: unknown (no source)" and status.partitions == ()
    assert status.records_note == (f"no records of consumer group '$default' of {NS}/{HUB} in this store: check "
                                   "--namespace, --eventhub, --consumer-group and the container or table")
    assert status.summary.line() == "0 partitions (seen in the store): 0 owned, 0 unowned, 0 expired · " \
                                    "0 live members · lag unknown"


# --------------------------------------------------------------------------- the command


def test_help_documents_the_command_even_without_extras():
    for extras in (True, False):
        out = run_cli("status", "--help", extras=extras)
        assert out.returncode == 0, out.stderr
        for needle in ("--namespace", "--eventhub", "--consumer-group", "--store [blob|table]", "--container",
                       "--table", "--account-url", "--credential [default|key|sas|none]", "--expiration",
                       "--json", "--watch", "--timeout", STORE_CONNECTION_STRING_ENV, STORE_ACCOUNT_KEY_ENV,
                       STORE_SAS_TOKEN_ENV, EVENTHUB_CONNECTION_STRING_ENV, "lag", "imbalance"):
            assert needle in out.stdout, needle


SCOPE = ["--namespace", NS, "--eventhub", HUB]


@pytest.mark.parametrize("args, needles", [
    (["--container", "ckpts"], ["--store blob", f"pip install -e '{ROOT}[blob]'"]),
    (["--store", "table", "--table", "t1"], ["--store table", f"pip install -e '{ROOT}[table]'"]),
])
def test_a_missing_extra_is_one_line_with_the_install_command(args, needles):
    out = run_cli("status", *SCOPE, *args, extras=False,
                  env={STORE_CONNECTION_STRING_ENV: "UseDevelopmentStorage=true"})
    assert_one_line_error(out, *needles)


@pytest.mark.parametrize("args, env, needles", [
    ([*SCOPE, "--container", "ckpts"], {}, ["which store?", STORE_CONNECTION_STRING_ENV]),
    (["--eventhub", HUB, "--container", "ckpts"], {STORE_CONNECTION_STRING_ENV: "UseDevelopmentStorage=true"},
     ["which group?", "--namespace"]),
    ([*SCOPE], {STORE_CONNECTION_STRING_ENV: "UseDevelopmentStorage=true"}, ["--store blob needs --container"]),
    ([*SCOPE, "--container", "ckpts", "--account-url", "http://127.0.0.1:1/devstoreaccount1"],
     {STORE_CONNECTION_STRING_ENV: "UseDevelopmentStorage=true"}, ["not both"]),
    ([*SCOPE, "--container", "ckpts", "--account-url", "http://127.0.0.1:1/devstoreaccount1", "--credential", "key"],
     {}, ["--credential key needs the account key", STORE_ACCOUNT_KEY_ENV]),
    ([*SCOPE, "--container", "Bad_Name"], {STORE_CONNECTION_STRING_ENV: "UseDevelopmentStorage=true"},
     ["container name 'Bad_Name' is invalid"]),
    ([*SCOPE, "--container", "ckpts"],
     {STORE_CONNECTION_STRING_ENV: f"AccountName=devstoreaccount1;AccountKey={SECRET}!;BlobEndpoint=http://127.0.0.1:1/x"},
     ["AccountKey is not valid base64"]),
    ([*SCOPE, "--container", "ckpts", "--account-url", "http://127.0.0.1:1/devstoreaccount1", "--credential", "key"],
     {STORE_ACCOUNT_KEY_ENV: f"{SECRET}!"}, ["account key", "base64"]),
    ([*SCOPE, "--container", "ckpts"], {STORE_CONNECTION_STRING_ENV: "UseDevelopmentStorage=true",
                                      EVENTHUB_CONNECTION_STRING_ENV: f"Endpoint=nothing;SharedAccessKey={SECRET}"},
     ["Event Hubs", "malformed"]),
])
def test_bad_options_are_one_line_and_never_show_a_secret(args, env, needles):
    # In process (each fails before any I/O); the variables not given are unset.
    unset = {name: None for name in (STORE_CONNECTION_STRING_ENV, STORE_ACCOUNT_KEY_ENV, STORE_SAS_TOKEN_ENV,
                                     EVENTHUB_CONNECTION_STRING_ENV)}
    result = CliRunner().invoke(main, ["status", *args], env={**unset, **env})
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert SECRET not in result.stdout + result.stderr, lines[0]


def _silent_listener() -> socket.socket:
    """A loopback port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dev_connection_string(blob_url: str) -> str:
    from eventprocessor.emulators.azurite import DEV_ACCOUNT_KEY

    return (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={DEV_ACCOUNT_KEY};"
            f"BlobEndpoint={blob_url}")


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_an_unreachable_store_ends_in_one_line_within_the_timeout(kind):
    pytest.importorskip("azure.storage.blob")
    listener = _silent_listener() if kind == "silent" else None
    port = listener.getsockname()[1] if listener else _closed_port()
    try:
        started = time.monotonic()
        out = run_cli("status", *SCOPE, "--container", "ckpts", "--timeout", "3",
                      env={STORE_CONNECTION_STRING_ENV: _dev_connection_string(f"http://127.0.0.1:{port}/devstoreaccount1")})
        elapsed = time.monotonic() - started
    finally:
        if listener:
            listener.close()
    print(f"{kind} store: failed after {elapsed:.1f} s (--timeout 3)")
    line = assert_one_line_error(out, "cannot read the checkpoint store", f"127.0.0.1:{port}")
    assert ("did not answer within 3 s" if kind == "silent" else "could not connect") in line, line
    assert "AccountKey" not in line and "Eby8vdM02" not in line
    # A generous bound (interpreter start, imports, a busy machine): the point is that it
    # does not wait for the SDK's default timeouts of minutes.
    assert elapsed < 3 + 20, elapsed


# --------------------------------------------------------------------------- Azurite


def _status_json(*args: str, env: dict[str, str]) -> dict:
    out = run_cli("status", *args, "--json", env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def _store_view(store) -> tuple:
    listing = await store.list_ownership(NS, HUB, GROUP)
    checkpoints = {c.partition_id: c for c in await store.list_checkpoints(NS, HUB, GROUP)}
    return listing, checkpoints


def _spawn(owner: str, container: str, connection_string: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, STORE_CONNECTION_STRING_ENV: connection_string, "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, str(WORKER), "--container", container, "--owner-id", owner,
                                 "--namespace", NS, "--eventhub", HUB, "--partitions", "6", "--events", "5",
                                 "--expiry", "30"], stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


@pytest.mark.azurite
async def test_status_of_a_live_group_matches_the_store_row_by_row(azurite, tmp_path):
    from eventprocessor.stores.blob import BlobCheckpointStore

    container = f"status-{uuid.uuid4().hex[:10]}"
    env = {STORE_CONNECTION_STRING_ENV: azurite.connection_string, "COLUMNS": "250"}
    scope = [*SCOPE, "--container", container]
    workers = {f"worker-{i}": _spawn(f"worker-{i}", container, azurite.connection_string, tmp_path / f"w{i}.log")
               for i in range(1, 4)}
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    try:
        # Settled: every partition owned by a worker, 2 each, every checkpoint at the end
        # of its partition (partition p holds 5 + p events).
        deadline = time.monotonic() + 40
        while True:
            listing, checkpoints = await _store_view(store)
            owners = [r.owner_id for r in listing.ownerships]
            if (len(owners) == 6 and sorted(owners.count(w) for w in workers) == [2, 2, 2]
                    and all(checkpoints.get(str(p)) and checkpoints[str(p)].sequence_number == 4 + p
                            for p in range(6))):
                break
            dead = [w for w, p in workers.items() if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, (
                dead, owners, {k: c.sequence_number for k, c in checkpoints.items()},
                [(tmp_path / f"w{i}.log").read_text()[-1500:] for i in range(1, 4)])
            await asyncio.sleep(0.3)
        print(f"live group settled after {time.monotonic() - deadline + 40:.1f} s")
        mark = time.monotonic()

        document = _status_json(*scope, env=env)
        after, checkpoints = await _store_view(store)
        records = {r.partition_id: r for r in after.ownerships}
        rows = {row["partition_id"]: row for row in document["partitions"]}
        assert sorted(rows, key=int) == [str(p) for p in range(6)]
        for pid, row in rows.items():
            record, checkpoint = records[pid], checkpoints[pid]
            assert (row["state"], row["owner_id"], row["epoch"]) == ("owned", record.owner_id, record.epoch), pid
            assert 0 <= row["lease_age"] <= 30, row
            assert (row["checkpoint_sequence_number"], row["checkpoint_offset"], row["checkpoint_owner_id"],
                    row["checkpoint_epoch"]) == (checkpoint.sequence_number, checkpoint.offset,
                                                 checkpoint.owner_id, checkpoint.epoch), pid
            assert row["lag"] is None
        members = {m["owner_id"]: m for m in document["members"]}
        assert {k: (m["state"], m["owned"]) for k, m in members.items()} == {w: ("live", 2) for w in workers}
        try:
            listed = await store.list_members(NS, HUB, GROUP)
        except NotImplementedError:
            assert document["members_note"].startswith("members: not kept by this store")
        else:  # a store that keeps heartbeats: each member's comes from its record
            assert {m.owner_id for m in listed.members} == set(members)
            assert all(m["heartbeat_age"] is not None for m in members.values())
        summary = document["summary"]
        assert (summary["partitions"], summary["owned"], summary["unowned"], summary["expired"],
                summary["live_members"], summary["imbalance"]) == (6, 6, 0, 0, 3, 0)
        assert document["lag_note"].startswith("lag: unknown (no Event Hubs connection given")
        assert document["store"] == repr(store) and azurite.account_key not in json.dumps(document)

        # The table under --watch (piped: one view per refresh, bounded by --watch-count): a line
        # per partition with its owner and epoch, the notes, the summary.
        out = run_cli("status", *scope, "--watch", "--watch-count", "2", "--watch-interval", "0.5", env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        views = re.split(r"refresh \d at \d\d:\d\d:\d\d", out.stdout)[1:]
        assert len(views) == 2, out.stdout
        for view in views:
            rows = table_rows(view, "partition")
            assert {pid: cells[:4] for pid, cells in rows.items()} == {
                pid: [pid, record.owner_id, "owned", str(record.epoch)] for pid, record in records.items()}, view
            assert {pid: cells[5:7] for pid, cells in rows.items()} == {
                pid: [str(c.sequence_number), c.offset] for pid, c in checkpoints.items()}, view
            members = table_rows(view, "member")
            assert {m: cells[1:3] for m, cells in members.items()} == {w: ["live", "2"] for w in workers}
            assert document["summary_line"] in view and "lag: unknown (no Event Hubs connection given" in view
        out = run_cli("status", *scope, "--watch", "--json", "--watch-count", "2", "--watch-interval", "0.5", env=env,
                      timeout=60)
        assert out.returncode == 0, out.stderr
        views = [json.loads(line) for line in out.stdout.splitlines()]
        print(f"three status commands took {time.monotonic() - mark:.1f} s")
        assert len(views) == 2 and all(v["summary"]["owned"] == 6 and v["refresh_error"] is None for v in views)
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=10)
        await store.close()


async def _hand_written_group(store) -> None:
    """p0 owned by x (checkpointed at 7), p1 owned by y, p2 released: written now, so
    with --expiration 1 they are expired a couple of seconds later."""
    won = await store.claim_ownership([Ownership(NS, HUB, GROUP, "0", "x", epoch=5),
                                       Ownership(NS, HUB, GROUP, "1", "y", epoch=2),
                                       Ownership(NS, HUB, GROUP, "2", "z", epoch=1)])
    assert len(won) == 3
    assert await store.release_ownership(next(r for r in won if r.partition_id == "2"))
    await store.update_checkpoint(Checkpoint(NS, HUB, GROUP, "0", 7, offset="70"), owner_id="x", epoch=5)


def _check_hand_written(document: dict, *, expired: bool) -> None:
    rows = {row["partition_id"]: row for row in document["partitions"]}
    live = "expired" if expired else "owned"
    assert {pid: (r["state"], r["owner_id"], r["epoch"]) for pid, r in rows.items()} == {
        "0": (live, "x", 5), "1": (live, "y", 2), "2": ("released", None, 1)}
    assert (rows["0"]["checkpoint_sequence_number"], rows["0"]["checkpoint_offset"]) == (7, "70")
    summary = document["summary"]
    assert (summary["owned"], summary["expired"], summary["unowned"]) == ((0, 2, 1) if expired else (2, 0, 1))
    assert summary["live_members"] == (0 if expired else 2)


@pytest.mark.azurite
async def test_the_table_store_and_expired_records(azurite):
    from eventprocessor.stores.table import TableCheckpointStore

    table = f"status{uuid.uuid4().hex[:10]}"
    async with TableCheckpointStore.from_connection_string(azurite.connection_string, table) as store:
        await _hand_written_group(store)
    env = {STORE_CONNECTION_STRING_ENV: azurite.connection_string}
    scope = [*SCOPE, "--store", "table", "--table", table]
    _check_hand_written(_status_json(*scope, env=env), expired=False)
    await asyncio.sleep(2.5)  # the store's timestamps have 1 s resolution
    _check_hand_written(_status_json(*scope, "--expiration", "1", env=env), expired=True)


@pytest.mark.azurite
async def test_the_blob_store_by_account_url_with_a_key_and_with_a_sas_token(azurite):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from eventprocessor.stores.blob import BlobCheckpointStore

    container = f"status-{uuid.uuid4().hex[:10]}"
    async with BlobCheckpointStore.from_connection_string(azurite.connection_string, container) as store:
        await _hand_written_group(store)
    scope = [*SCOPE, "--container", container, "--account-url", azurite.blob_endpoint]
    _check_hand_written(_status_json(*scope, "--credential", "key", env={
        STORE_CONNECTION_STRING_ENV: "", STORE_ACCOUNT_KEY_ENV: azurite.account_key}), expired=False)
    sas = generate_container_sas("devstoreaccount1", container, account_key=azurite.account_key,
                                 permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(minutes=10))
    _check_hand_written(_status_json(*scope, "--credential", "sas", env={
        STORE_CONNECTION_STRING_ENV: "", STORE_SAS_TOKEN_ENV: sas}), expired=False)
    # A wrong key: one line saying the credential was refused, and not the key.
    out = run_cli("status", *scope, "--credential", "key",
                  env={STORE_CONNECTION_STRING_ENV: "", STORE_ACCOUNT_KEY_ENV: SECRET}, timeout=60)
    assert_one_line_error(out, "the credential was refused")
    assert SECRET not in out.stderr + out.stdout


@pytest.mark.azurite
def test_an_unreachable_event_hub_leaves_the_status_and_says_why_in_one_line(azurite):
    pytest.importorskip("azure.eventhub")
    port = _closed_port()
    hub_connection = (f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey={SECRET};"
                      f"EntityPath={HUB};UseDevelopmentEmulator=true")
    env = {STORE_CONNECTION_STRING_ENV: azurite.connection_string, EVENTHUB_CONNECTION_STRING_ENV: hub_connection}
    started = time.monotonic()
    out = run_cli("status", "--container", f"status-{uuid.uuid4().hex[:10]}", "--timeout", "3", env=env, timeout=60)
    elapsed = time.monotonic() - started
    print(f"unreachable hub: status answered after {elapsed:.1f} s (--timeout 3)")
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stdout.splitlines() if line.startswith("lag: unknown")]
    # This EventHubSource times out; one that classifies the failure says so instead.
    assert len(notes) == 1 and notes[0].startswith(f"lag: unknown (the event hub 127.0.0.1:{port}/{HUB}"), out.stdout
    assert "no records of consumer group '$default'" in out.stdout  # a new container: nothing written yet
    assert SECRET not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert elapsed < 3 + 20, elapsed
