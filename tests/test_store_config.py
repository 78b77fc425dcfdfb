"""Connection strings, names and credentials of the Azure stores, and the rule that
secrets (account keys, SAS signatures, connection strings) never show up in reprs,
error messages or logs."""
from __future__ import annotations

import base64
import logging
import socket
import traceback
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from eventprocessor.errors import CheckpointStoreError, ConfigurationError, OwnershipLostError
from eventprocessor.stores import BlobCheckpointStore, TableCheckpointStore
from eventprocessor.stores.records import Checkpoint, Ownership

# Looks like a real key (valid base64, 64 bytes) and is easy to search for.
FAKE_KEY = base64.b64encode(b"topsecret-key-material-" + b"k" * 41).decode()
FAKE_SIG = "SIGtopsecretSIGNATUREvalue%3D"
FAKE_SAS = f"sv=2021-08-06&ss=bt&srt=sco&sp=rwdlacu&se=2099-01-01T00%3A00%3A00Z&sig={FAKE_SIG}"
NS, HUB, CG = "cfg.servicebus.windows.net", "hub", "$default"
FAKE_CS = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={FAKE_KEY};EndpointSuffix=core.windows.net"


def _no_secret(texts: Iterable[str], *secrets: str) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"secret leaked into: {text[:200]!r}"


# ---------------------------------------------------------------- connection strings


STORES = {"blob": BlobCheckpointStore, "table": TableCheckpointStore}


def parsed(conn_str: str, service: str) -> Any:
    """The store ``from_connection_string`` builds for ``service`` (nothing is sent)."""
    return STORES[service].from_connection_string(conn_str, "checkpoints")


@pytest.mark.parametrize("service, port", [("blob", 10000), ("table", 10002)])
def test_development_storage_means_azurite_on_default_ports(service: str, port: int) -> None:
    store = parsed("UseDevelopmentStorage=true", service)
    assert store.account_url == f"http://127.0.0.1:{port}/devstoreaccount1"
    assert "account='devstoreaccount1'" in repr(store)
    proxied = parsed("UseDevelopmentStorage=true;DevelopmentStorageProxyUri=http://10.1.2.3", service)
    assert proxied.account_url == f"http://10.1.2.3:{port}/devstoreaccount1"


def test_explicit_connection_strings() -> None:
    cs = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={FAKE_KEY};EndpointSuffix=core.windows.net"
    assert parsed(cs, "blob").account_url == "https://acct.blob.core.windows.net"
    assert parsed(cs, "table").account_url == "https://acct.table.core.windows.net"
    cs = f"AccountName=acct;AccountKey={FAKE_KEY};EndpointSuffix=core.chinacloudapi.cn"
    assert parsed(cs, "blob").account_url == "https://acct.blob.core.chinacloudapi.cn"
    cs = f"BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=?{FAKE_SAS}"
    store = parsed(cs, "blob")
    assert store.account_url == "https://acct.blob.core.windows.net"
    assert store.backend.client.credential.signature == FAKE_SAS
    # keys are case-insensitive, as in the Azure SDKs; trailing ';' is fine
    cs = f"accountname=acct;accountkey={FAKE_KEY};defaultendpointsprotocol=http;"
    assert parsed(cs, "table").account_url == "http://acct.table.core.windows.net"
    _no_secret([repr(store)], FAKE_SIG)


@pytest.mark.parametrize(
    "conn_str, problem",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("AccountName=acct;pasted-without-a-key", "segment 2"),
        (f"AccountName=acct;AccountKey={FAKE_KEY};AccountName=other", "given twice"),
        (f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=x;SharedAccessKey={FAKE_KEY}", "Event Hubs"),
        ("AccountName=acct;AccountKey=not base64 at all!", "AccountKey is not valid base64"),
        (f"AccountKey={FAKE_KEY}", "no AccountName"),
        ("AccountName=acct", "neither AccountKey nor SharedAccessSignature"),
        (f"AccountName=acct;AccountKey={FAKE_KEY};SharedAccessSignature={FAKE_SAS}", "both"),
        ("AccountName=acct;SharedAccessSignature=sv=2021&sp=r", "no 'sig='"),
        (f"AccountName=acct;AccountKey={FAKE_KEY};SVCEndpoint=ftp://x", "SVCEndpoint is not an http(s) URL"),
        (f"AccountName=acct;AccountKey={FAKE_KEY};DefaultEndpointsProtocol=gopher", "DefaultEndpointsProtocol"),
        (f"SVCEndpoint=https://acct.svc.core.windows.net?{FAKE_SAS};AccountName=a;AccountKey={FAKE_KEY}",
         "query string"),
        ("UseDevelopmentStorage=false", "UseDevelopmentStorage must be 'true'"),
    ],
)
@pytest.mark.parametrize("cls", [BlobCheckpointStore, TableCheckpointStore])
def test_malformed_connection_strings_name_the_problem_not_the_secret(cls: Any, conn_str: str, problem: str) -> None:
    service = "Blob" if cls is BlobCheckpointStore else "Table"
    conn_str, problem = conn_str.replace("SVC", service), problem.replace("SVC", service)
    with pytest.raises(ConfigurationError) as raised:
        cls.from_connection_string(conn_str, "checkpoints")
    message = str(raised.value)
    assert problem in message
    _no_secret([message, repr(raised.value)], FAKE_KEY, FAKE_SIG)


def test_connection_string_must_be_a_string() -> None:
    with pytest.raises(ConfigurationError, match="must be a str"):
        BlobCheckpointStore.from_connection_string(None, "checkpoints")  # type: ignore[arg-type]


# -------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["ab", "a" * 64, "Upper", "under_score", "-lead", "trail-", "dou--ble", "dot.s", ""])
def test_invalid_container_names(name: str) -> None:
    with pytest.raises(ConfigurationError, match="container"):
        BlobCheckpointStore("http://127.0.0.1:1/devstoreaccount1", name, credential=FAKE_KEY)


@pytest.mark.parametrize("name", ["abc", "checkpoints", "a-b-c", "0x1", "a" * 63])
def test_valid_container_names(name: str) -> None:
    assert BlobCheckpointStore("http://127.0.0.1:1/devstoreaccount1", name, credential=FAKE_KEY).container_name == name


@pytest.mark.parametrize("name", ["ab", "1abc", "has-hyphen", "tables", "Tables", "a" * 64, ""])
def test_invalid_table_names(name: str) -> None:
    with pytest.raises(ConfigurationError, match="table"):
        TableCheckpointStore("http://127.0.0.1:1/devstoreaccount1", name, credential=FAKE_KEY)


def test_bad_account_url_and_credential() -> None:
    with pytest.raises(ConfigurationError, match="account_url"):
        BlobCheckpointStore("not a url", "checkpoints")
    with pytest.raises(ConfigurationError, match="neither a SAS token") as raised:
        TableCheckpointStore("https://acct.table.core.windows.net", "checkpoints", credential="hunter2 secret!")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(ConfigurationError, match="unsupported credential type int"):
        BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints", credential=42)


@pytest.mark.parametrize("cls", [BlobCheckpointStore, TableCheckpointStore])
@pytest.mark.parametrize("field, value", [("consumer_group", "a/b"), ("eventhub_name", ""), ("partition_id", "1/2")])
async def test_unusable_names_fail_before_any_request(cls: Any, field: str, value: str) -> None:
    # Port 1 on loopback: any request would fail with a connection error, not this.
    store = cls("http://127.0.0.1:1/devstoreaccount1", "checkpoints", credential=FAKE_KEY)
    names = {"fully_qualified_namespace": NS, "eventhub_name": HUB, "consumer_group": CG, "partition_id": "0"}
    names[field] = value
    try:
        with pytest.raises(ConfigurationError, match=field):
            await store.claim_ownership([Ownership(owner_id="me", **names)])
        if field != "partition_id":
            with pytest.raises(ConfigurationError, match=field):
                await store.list_ownership(names["fully_qualified_namespace"], names["eventhub_name"],
                                           names["consumer_group"])
    finally:
        await store.close()


@pytest.mark.parametrize("value", ["a#b", "a?b", "two words", "tab\there"])
async def test_table_keys_reject_characters_the_service_refuses(value: str) -> None:
    store = TableCheckpointStore("http://127.0.0.1:1/devstoreaccount1", "checkpoints", credential=FAKE_KEY)
    try:
        with pytest.raises(ConfigurationError, match="consumer_group"):
            await store.list_ownership(NS, HUB, value)
    finally:
        await store.close()


# ------------------------------------------------------------------------ secrets


def test_reprs_never_show_credentials() -> None:
    url = f"https://acct.blob.core.windows.net/?{FAKE_SAS}"
    stores = [
        BlobCheckpointStore(url, "checkpoints"),
        BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints", credential=FAKE_SAS),
        BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints", credential=FAKE_KEY),
        BlobCheckpointStore.from_connection_string(f"AccountName=acct;AccountKey={FAKE_KEY}", "checkpoints"),
        TableCheckpointStore("https://acct.table.core.windows.net", "checkpoints", credential=FAKE_SAS),
        TableCheckpointStore.from_connection_string(f"AccountName=acct;AccountKey={FAKE_KEY}", "checkpoints"),
    ]
    texts = [repr(s) for s in stores] + [str(s) for s in stores]
    _no_secret(texts, FAKE_KEY, FAKE_SIG)
    assert "acct" in texts[0] and "checkpoints" in texts[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _everything(error: BaseException) -> list[str]:
    return [str(error), repr(error), "".join(traceback.format_exception(error))]


async def test_unreachable_store_errors_do_not_leak_the_sas(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"http://127.0.0.1:{_closed_port()}/devstoreaccount1?{FAKE_SAS}"
    async with BlobCheckpointStore(url, "checkpoints", retry_total=0) as store:
        with pytest.raises(CheckpointStoreError) as raised:
            await store.list_ownership(NS, HUB, CG)
    assert "checkpoints" in str(raised.value)
    _no_secret(_everything(raised.value) + [r.getMessage() for r in caplog.records], FAKE_SIG)

    table = TableCheckpointStore(f"http://127.0.0.1:{_closed_port()}/devstoreaccount1", "checkpoints",
                                 credential=FAKE_SAS, retry_total=0)
    async with table:
        with pytest.raises(CheckpointStoreError) as raised:
            await table.claim_ownership([Ownership(NS, HUB, CG, "0", "me")])
    _no_secret(_everything(raised.value) + [r.getMessage() for r in caplog.records], FAKE_SIG)


def _blob_sas(azurite: Any, *, write: bool) -> str:
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    permission = AccountSasPermissions(read=True, list=True, write=write, create=write, delete=write)
    return generate_account_sas("devstoreaccount1", azurite.account_key, ResourceTypes(service=True, container=True,
                                object=True), permission, expiry=datetime.now(timezone.utc) + timedelta(hours=1))


def _table_sas(azurite: Any) -> str:
    from azure.core.credentials import AzureNamedKeyCredential
    from azure.data.tables import AccountSasPermissions, ResourceTypes, generate_account_sas

    return generate_account_sas(AzureNamedKeyCredential("devstoreaccount1", azurite.account_key),
                                resource_types=ResourceTypes(service=True, container=True, object=True),
                                permission=AccountSasPermissions(read=True, write=True, delete=True, list=True,
                                                                 add=True, create=True, update=True),
                                expiry=datetime.now(timezone.utc) + timedelta(hours=1))


def _sig(sas: str) -> str:
    return next(part.split("=", 1)[1] for part in sas.split("&") if part.startswith("sig="))


async def _exercise(store: Any) -> None:
    pid = "0"
    [mine] = await store.claim_ownership([Ownership(NS, HUB, CG, pid, "me")])
    await store.update_checkpoint(Checkpoint(NS, HUB, CG, pid, 1, "10"), owner_id="me", epoch=0)
    assert [c.sequence_number for c in await store.list_checkpoints(NS, HUB, CG)] == [1]
    with pytest.raises(OwnershipLostError):
        await store.update_checkpoint(Checkpoint(NS, HUB, CG, pid, 2, "20"), owner_id="other", epoch=0)
    assert await store.release_ownership(mine)
    assert (await store.list_ownership(NS, HUB, CG)).ownerships[0].is_released


async def test_sas_and_key_never_reach_logs_or_errors(azurite: Any, caplog: pytest.LogCaptureFixture) -> None:
    from azure.storage.blob.aio import BlobServiceClient

    caplog.set_level(logging.DEBUG)
    blob_sas, table_sas = _blob_sas(azurite, write=True), _table_sas(azurite)
    read_only = _blob_sas(azurite, write=False)
    secrets = [azurite.account_key, _sig(blob_sas), _sig(table_sas), _sig(read_only), azurite.connection_string]
    errors: list[BaseException] = []
    container = f"sec-{uuid.uuid4().hex[:10]}"
    reprs: list[str] = []

    for store in (
        BlobCheckpointStore(azurite.blob_endpoint, container, credential=blob_sas),
        BlobCheckpointStore(f"{azurite.blob_endpoint}?{blob_sas}", container + "u"),
        BlobCheckpointStore(azurite.blob_endpoint, container + "k", credential=azurite.account_key),
        BlobCheckpointStore.from_connection_string(azurite.connection_string, container + "c"),
        TableCheckpointStore(azurite.table_endpoint, f"sec{uuid.uuid4().hex[:10]}", credential=table_sas),
        TableCheckpointStore.from_connection_string(azurite.connection_string, f"sec{uuid.uuid4().hex[:10]}"),
    ):
        async with store:
            reprs.append(repr(store))
            await _exercise(store)

    # A SAS that may not write: the claim fails (never counted as won) without the SAS in sight.
    async with BlobCheckpointStore(azurite.blob_endpoint, container, credential=read_only) as store:
        reprs.append(repr(store))
        with pytest.raises(CheckpointStoreError) as raised:
            await store.claim_ownership([Ownership(NS, HUB, CG, "5", "me")])
        assert raised.value.claimed == [] and set(raised.value.failures) == {"5"}
        errors.append(raised.value)
    # A wrong account key: 403 on first use.
    wrong = base64.b64encode(b"w" * 64).decode()
    secrets.append(wrong)
    async with BlobCheckpointStore(azurite.blob_endpoint, container, credential=wrong) as store:
        with pytest.raises(CheckpointStoreError) as raised:
            await store.list_ownership(NS, HUB, CG)
        errors.append(raised.value)
    async with TableCheckpointStore(azurite.table_endpoint, "secwrongkey", credential=wrong) as store:
        with pytest.raises(CheckpointStoreError) as raised:
            await store.list_checkpoints(NS, HUB, CG)
        errors.append(raised.value)

    texts = reprs + [t for e in errors for t in _everything(e)] + [r.getMessage() for r in caplog.records]
    _no_secret(texts, *secrets)
    assert any("stores." in r.name for r in caplog.records), "the stores did log"

    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    async with service:
        for name in (container, container + "u", container + "k", container + "c"):
            await service.delete_container(name)


async def test_token_credentials_must_be_async() -> None:
    from azure.identity import ClientSecretCredential
    from azure.identity.aio import ClientSecretCredential as AsyncClientSecretCredential

    sync = ClientSecretCredential("tenant", "client", "s3cr3t-client-secret")
    with pytest.raises(ConfigurationError, match="azure.identity.aio"):
        BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints", credential=sync)
    async with AsyncClientSecretCredential("tenant", "client", "s3cr3t-client-secret") as credential:
        for store in (BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints", credential=credential),
                      TableCheckpointStore("https://acct.table.core.windows.net", "checkpoints",
                                           credential=credential)):
            _no_secret([repr(store)], "s3cr3t")
            await store.close()


async def test_container_and_table_are_created_on_first_use(azurite: Any, caplog: pytest.LogCaptureFixture) -> None:
    from azure.data.tables.aio import TableServiceClient
    from azure.storage.blob.aio import BlobServiceClient

    caplog.set_level(logging.INFO, logger="eventprocessor.stores")
    container, table = f"first-{uuid.uuid4().hex[:10]}", f"first{uuid.uuid4().hex[:10]}"
    async with BlobCheckpointStore.from_connection_string(azurite.connection_string, container) as blob, \
            TableCheckpointStore.from_connection_string(azurite.connection_string, table) as tables:
        assert (await blob.list_ownership(NS, HUB, CG)).ownerships == ()
        assert (await tables.list_ownership(NS, HUB, CG)).ownerships == ()
        await blob.list_checkpoints(NS, HUB, CG)  # once only
    created = [r.getMessage() for r in caplog.records if "created" in r.getMessage()]
    assert len(created) == 2
    assert any(container in m for m in created) and any(table in m for m in created)
    async with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        await service.get_container_client(container).get_container_properties()
        await service.delete_container(container)
    async with TableServiceClient.from_connection_string(azurite.connection_string) as service:
        assert [t.name async for t in service.query_tables("TableName eq @t", parameters={"t": table})] == [table]
        await service.delete_table(table)


# ------------------------------------------------- the official stores' argument names


async def test_the_official_argument_names_and_every_credential_form_work_on_azurite(azurite: Any) -> None:
    """What azure-eventhub's samples and docs write (``container_name=``,
    ``blob_account_url=``, ``table_name=``, ``table_account_url=``, ``api_version=``,
    ``credential=`` next to a connection string) builds a working store, with each
    credential form the Azure SDKs take."""
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    key = azurite.account_key
    blob_sas, table_sas = _blob_sas(azurite, write=True), _table_sas(azurite)
    no_key = f"BlobEndpoint={azurite.blob_endpoint};TableEndpoint={azurite.table_endpoint};"
    suffix = uuid.uuid4().hex[:8]
    blobs = {
        "from_connection_string(container_name=)":
            BlobCheckpointStore.from_connection_string(azurite.connection_string, container_name=f"o1-{suffix}"),
        "official constructor keywords, account key string":
            BlobCheckpointStore(blob_account_url=azurite.blob_endpoint, container_name=f"o2-{suffix}", credential=key),
        "AzureNamedKeyCredential": BlobCheckpointStore(
            azurite.blob_endpoint, f"o3-{suffix}", credential=AzureNamedKeyCredential("devstoreaccount1", key)),
        "AzureSasCredential": BlobCheckpointStore(azurite.blob_endpoint, f"o4-{suffix}",
                                                  credential=AzureSasCredential(blob_sas)),
        "dict from a connection string": BlobCheckpointStore(
            azurite.blob_endpoint, f"o5-{suffix}", credential={"account_name": "devstoreaccount1", "account_key": key}),
        "connection string without a key, credential=": BlobCheckpointStore.from_connection_string(
            no_key, container_name=f"o6-{suffix}", credential=AzureNamedKeyCredential("devstoreaccount1", key)),
        "api_version=": BlobCheckpointStore.from_connection_string(
            azurite.connection_string, container_name=f"o7-{suffix}", api_version="2019-07-07"),
    }
    tables = {
        "from_connection_string(table_name=)":
            TableCheckpointStore.from_connection_string(azurite.connection_string, table_name=f"o1{suffix}"),
        "official constructor keywords, AzureSasCredential": TableCheckpointStore(
            table_account_url=azurite.table_endpoint, table_name=f"o2{suffix}",
            credential=AzureSasCredential(table_sas)),
        "connection string without a key, credential=": TableCheckpointStore.from_connection_string(
            no_key, table_name=f"o3{suffix}", credential=AzureNamedKeyCredential("devstoreaccount1", key)),
    }
    assert blobs["api_version="].backend.client.api_version == "2019-07-07"
    for what, store in {**blobs, **tables}.items():
        async with store:
            try:
                await _exercise(store)
            except Exception as error:  # pragma: no cover - says which form failed
                raise AssertionError(f"{what}: {error!r}") from error


@pytest.mark.parametrize("build, problem", [
    (lambda: BlobCheckpointStore.from_connection_string(FAKE_CS, "a-b", container_name="a-b"),
     "name and container_name name the same thing"),
    (lambda: BlobCheckpointStore.from_connection_string(FAKE_CS),
     "from_connection_string(conn_str, container_name=...)"),
    (lambda: TableCheckpointStore.from_connection_string(FAKE_CS, "ab1", table_name="ab1"),
     "name and table_name name the same thing"),
    (lambda: TableCheckpointStore.from_connection_string(FAKE_CS), "from_connection_string(conn_str, table_name=...)"),
    (lambda: BlobCheckpointStore("https://acct.blob.core.windows.net", "abc",
                                 blob_account_url="https://acct.blob.core.windows.net"),
     "account_url and blob_account_url name the same thing"),
    (lambda: BlobCheckpointStore(container_name="abc"), "needs the storage account's blob URL"),
    (lambda: TableCheckpointStore(table_name="abc", table_account_url="https://acct.table.core.windows.net",
                                  account_url="https://acct.table.core.windows.net"),
     "account_url and table_account_url name the same thing"),
    (lambda: TableCheckpointStore(table_name="abc"), "needs the storage account's table URL"),
    (lambda: BlobCheckpointStore("https://acct.blob.core.windows.net"), "container_name must be a non-empty string"),
    (lambda: BlobCheckpointStore.from_connection_string(FAKE_CS, "abc", api_version="1999-01-01"),
     "Unsupported API version '1999-01-01'"),
    (lambda: BlobCheckpointStore.from_connection_string(
        "BlobEndpoint=https://acct.blob.core.windows.net;", "abc"), "neither AccountKey nor SharedAccessSignature"),
])
def test_official_names_given_twice_or_not_at_all_are_clear_errors(build: Any, problem: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        build()
    assert problem in str(raised.value)
    _no_secret([str(raised.value)], FAKE_KEY)


async def test_a_token_credential_over_http_is_a_configuration_error_not_a_value_error() -> None:
    from azure.identity.aio import ClientSecretCredential

    async with ClientSecretCredential("tenant", "client", "s3cr3t-client-secret") as credential:
        with pytest.raises(ConfigurationError, match="only supported with HTTPS") as raised:
            BlobCheckpointStore(f"http://127.0.0.1:1/devstoreaccount1?{FAKE_SAS}", "abc", credential=credential)
        _no_secret(_everything(raised.value), FAKE_SIG, "s3cr3t")
        store = BlobCheckpointStore(blob_account_url="https://acct.blob.core.windows.net", container_name="abc",
                                    credential=credential)
        assert store.backend.client.credential is credential
        await store.close()


# ------------------------------------------------- the environment's proxy settings


def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch, home: Any) -> None:
    import os

    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(home))  # no ~/.netrc


@pytest.mark.parametrize("cls", [BlobCheckpointStore, TableCheckpointStore])
async def test_with_no_proxy_settings_a_checkpoint_makes_no_trip_to_a_worker_thread(
        cls: Any, azurite: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """aiohttp told to trust the environment (azure-core's default) reads the netrc file
    and the proxy variables again on every request, each in a worker thread: two thread
    trips per checkpoint, about half of its CPU (1.9 ms of client CPU per checkpoint,
    1.0 ms without). With no proxy variable and no netrc file there is nothing to read:
    the stores then leave the environment alone."""
    import asyncio

    _no_proxy_settings(monkeypatch, tmp_path)
    loop = asyncio.get_running_loop()
    trips: list[Any] = []
    original = loop.run_in_executor

    def counted(executor: Any, function: Any, *args: Any) -> Any:
        trips.append(function)
        return original(executor, function, *args)

    monkeypatch.setattr(loop, "run_in_executor", counted)
    name = f"env{uuid.uuid4().hex[:10]}"
    async with cls.from_connection_string(azurite.connection_string, name) as store:
        won = await store.claim_ownership([Ownership(NS, HUB, CG, "0", "me", epoch=1)])
        await store.fence_checkpoint(won[0])
        trips.clear()
        for sequence_number in range(5):
            await store.update_checkpoint(Checkpoint(NS, HUB, CG, "0", sequence_number=sequence_number,
                                                     offset=str(sequence_number)), owner_id="me", epoch=1)
    assert trips == []


@pytest.mark.parametrize("cls", [BlobCheckpointStore, TableCheckpointStore])
async def test_a_proxy_set_in_the_environment_is_used(cls: Any, azurite: Any, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Any) -> None:
    """The other side of the test above: a proxy named by the environment when the
    store is built is used (here one that is not there, so the call fails)."""
    _no_proxy_settings(monkeypatch, tmp_path)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_closed_port()}")
    async with cls.from_connection_string(azurite.connection_string, f"env{uuid.uuid4().hex[:10]}",
                                          retry_total=0, operation_timeout=5) as store:
        with pytest.raises(CheckpointStoreError, match="(?i)unreachable|connect|refused"):
            await store.list_ownership(NS, HUB, CG)
