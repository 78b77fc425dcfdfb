"""The fixtures azure-eventhub's live tests expect, pointed at the local emulator instead
of a namespace created in Azure (this project's code, replacing the sdist's
``tests/conftest.py``, which creates hubs with Azure Resource Manager; the fixtures that
open senders and receivers follow that file's, MIT licence, Microsoft).

``tests/test_azure_eventhub_tests.py`` copies this file as ``conftest.py`` beside the
tests and runs them in a pytest session of their own, with the environment below:

* ``LIVETEST_EMULATOR``: the session emulator's connection string (it checks SAS tokens).
* ``LIVETEST_HOST``: a host name of the reserved ``.test`` domain that stands for the
  namespace. Every client reaches it as it reaches Event Hubs, over TLS on port 5671
  (AMQP) or 443 (WebSockets): name resolution in the test process maps that host and
  those ports to a local relay (``LIVETEST_TLS_PORT``) that terminates TLS and forwards
  the bytes to the emulator, the way a hosts file and a port mapping would.
* ``LIVETEST_CA_BUNDLE``: certifi's CA bundle plus the test CA that signed the relay's
  certificate; ``certifi.where()`` names it, so the client's default TLS settings trust
  the relay (as a user behind a TLS-inspecting proxy adds its CA to that bundle), and
  ``SSL_CERT_FILE`` names it for contexts that load the default certificates.
* ``LIVETEST_HUBS`` and ``LIVETEST_HUBS_TAKEN``: fresh 2-partition hubs of the emulator,
  one per test (a counter file under a lock, shared by the xdist workers).

Azure Active Directory is stood in for by SAS tokens: ``get_credential()`` gives a token
credential whose tokens are SAS tokens signed with the emulator's key. What needs real
Azure (Azure Resource Manager, a storage account) is skipped with that reason.
"""
from __future__ import annotations

import os
import socket
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.eventhub import EventHubProducerClient, TransportType
from azure.eventhub._pyamqp import ReceiveClient
from azure.eventhub._pyamqp.authentication import SASTokenAuth

PARTITION_COUNT = 2
CONN_STR = "Endpoint=sb://{}/;SharedAccessKeyName={};SharedAccessKey={};EntityPath={}"
HOST = os.environ["LIVETEST_HOST"]
_FIELDS = dict(part.split("=", 1) for part in os.environ["LIVETEST_EMULATOR"].split(";") if "=" in part)
KEY_NAME, KEY = _FIELDS["SharedAccessKeyName"], _FIELDS["SharedAccessKey"]

uamqp_transport_params = [False]
uamqp_transport_ids = ["pyamqp"]
socket_transports = [TransportType.Amqp, TransportType.AmqpOverWebsocket]
socket_transport_ids = ["amqp", "ws"]


def _resolve_to_the_relay() -> None:
    """Name resolution of this process: the namespace's host, on the ports Event Hubs
    listens on, is the TLS relay on loopback; every other name resolves as usual."""
    relay = int(os.environ["LIVETEST_TLS_PORT"])
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == HOST and str(port) in ("5671", "443"):
            return real("127.0.0.1", relay, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


def _trust_the_relay() -> None:
    import certifi

    bundle = os.environ["LIVETEST_CA_BUNDLE"]
    certifi.where = lambda: bundle
    os.environ["SSL_CERT_FILE"] = bundle


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--sleep", action="store", default="True", help="sleep on reconnect test: True or False")


def pytest_configure(config: Any) -> None:
    _resolve_to_the_relay()
    _trust_the_relay()
    config.addinivalue_line("markers", "liveTest: mark test to be a live test only")
    config.addinivalue_line("markers", "no_amqpproxy: mark test to opt out of amqp proxy recording")


class SasTokenCredential:
    """A token credential (what ``DefaultAzureCredential`` is) handing out SAS tokens
    signed with the emulator's key, in place of Azure AD tokens."""

    def __init__(self, *, is_async: bool = False) -> None:
        self.is_async = is_async

    def _token(self) -> AccessToken:
        from azure.eventhub._client_base import EventHubSharedKeyCredential

        return EventHubSharedKeyCredential(KEY_NAME, KEY).get_token(f"sb://{HOST}/")

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        if not self.is_async:
            return self._token()

        async def token() -> AccessToken:
            return self._token()

        return token()

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> SasTokenCredential:
        return self

    async def __aexit__(self, *args: Any) -> None:
        return None


def get_devtools_credential(is_async: bool = False, **kwargs: Any) -> SasTokenCredential:
    return SasTokenCredential(is_async=is_async)


@pytest.fixture
def sleep(request: Any) -> bool:
    return request.config.getoption("--sleep").lower() in ("true", "yes", "1", "y")


@pytest.fixture(scope="session", params=uamqp_transport_params, ids=uamqp_transport_ids)
def uamqp_transport(request: Any) -> bool:
    return request.param


@pytest.fixture(scope="session", params=socket_transports, ids=socket_transport_ids)
def socket_transport(request: Any) -> Any:
    return request.param


@pytest.fixture(scope="session")
def timeout_factor(uamqp_transport: bool) -> int:
    return 1


@pytest.fixture(scope="session")
def storage_url() -> str:
    pytest.skip("needs an Azure storage account")


@pytest.fixture
def checkpoint_store(storage_url: str) -> Any:
    pytest.skip("needs an Azure storage account")


@pytest.fixture
def checkpoint_store_aio(storage_url: str) -> Any:
    pytest.skip("needs an Azure storage account")


@pytest.fixture
def resource_mgmt_client() -> Any:
    pytest.skip("needs Azure Resource Manager")


@pytest.fixture(scope="session")
def get_credential() -> Any:
    return get_devtools_credential


@pytest.fixture(scope="session")
def get_credential_async() -> Any:
    return partial(get_devtools_credential, is_async=True)


@pytest.fixture
def skip_amqp_proxy() -> bool:
    return True


@pytest.fixture
def client_args() -> dict[str, Any]:
    return {}


def _fresh_hub() -> str:
    from filelock import FileLock

    names = Path(os.environ["LIVETEST_HUBS"]).read_text().split()
    taken = Path(os.environ["LIVETEST_HUBS_TAKEN"])
    with FileLock(str(taken) + ".lock"):
        index = int(taken.read_text() or 0) if taken.exists() else 0
        taken.write_text(str(index + 1))
    if index >= len(names):
        raise RuntimeError("no fresh hub left: tests/test_azure_eventhub_tests.py reserves too few")
    return names[index]


@pytest.fixture
def live_eventhub() -> dict[str, Any]:
    hub = _fresh_hub()
    return {"resource_group": None, "hostname": HOST, "key_name": KEY_NAME, "access_key": KEY, "namespace": HOST,
            "event_hub": hub, "consumer_group": "$Default", "partition": "0",
            "connection_str": f"Endpoint=sb://{HOST}/;SharedAccessKeyName={KEY_NAME};SharedAccessKey={KEY}"
                              f";EntityPath={hub}"}


@pytest.fixture
def connection_str(live_eventhub: dict[str, Any]) -> str:
    return CONN_STR.format(live_eventhub["hostname"], live_eventhub["key_name"], live_eventhub["access_key"],
                           live_eventhub["event_hub"])


@pytest.fixture
def invalid_hostname(live_eventhub: dict[str, Any]) -> str:
    return CONN_STR.format("invalid123.servicebus.windows.net", live_eventhub["key_name"],
                           live_eventhub["access_key"], live_eventhub["event_hub"])


@pytest.fixture
def invalid_key(live_eventhub: dict[str, Any]) -> str:
    return CONN_STR.format(live_eventhub["hostname"], live_eventhub["key_name"], "invalid", live_eventhub["event_hub"])


@pytest.fixture
def invalid_policy(live_eventhub: dict[str, Any]) -> str:
    return CONN_STR.format(live_eventhub["hostname"], "invalid", live_eventhub["access_key"],
                           live_eventhub["event_hub"])


def _receivers(live_eventhub: dict[str, Any], client_args: dict[str, Any], timeout: int) -> list[Any]:
    receivers = []
    for p in [str(i) for i in range(PARTITION_COUNT)]:
        uri = "sb://{}/{}".format(live_eventhub["hostname"], live_eventhub["event_hub"])
        source = "amqps://{}/{}/ConsumerGroups/{}/Partitions/{}".format(
            live_eventhub["hostname"], live_eventhub["event_hub"], live_eventhub["consumer_group"], p)
        sas_auth = SASTokenAuth(uri, uri, live_eventhub["key_name"], live_eventhub["access_key"])
        receiver = ReceiveClient(live_eventhub["hostname"], source, auth=sas_auth, network_trace=False,
                                 timeout=timeout, link_credit=500, **client_args)
        receiver.open()
        receivers.append(receiver)
    return receivers


@pytest.fixture
def connstr_receivers(live_eventhub: dict[str, Any], uamqp_transport: bool, client_args: dict[str, Any]) -> Any:
    receivers = _receivers(live_eventhub, client_args, 0)
    yield live_eventhub["connection_str"], receivers
    for r in receivers:
        r.close()


@pytest.fixture
def auth_credentials(live_eventhub: dict[str, Any]) -> Any:
    return live_eventhub["hostname"], live_eventhub["event_hub"], get_devtools_credential


@pytest.fixture
def auth_credentials_async(live_eventhub: dict[str, Any]) -> Any:
    return live_eventhub["hostname"], live_eventhub["event_hub"], partial(get_devtools_credential, is_async=True)


@pytest.fixture
def auth_credential_receivers(live_eventhub: dict[str, Any], uamqp_transport: bool,
                              client_args: dict[str, Any]) -> Any:
    receivers = _receivers(live_eventhub, client_args, 30)
    yield live_eventhub["hostname"], live_eventhub["event_hub"], get_devtools_credential, receivers
    for r in receivers:
        r.close()


@pytest.fixture
def auth_credential_receivers_async(live_eventhub: dict[str, Any], uamqp_transport: bool,
                                    client_args: dict[str, Any]) -> Any:
    receivers = _receivers(live_eventhub, client_args, 30)
    yield (live_eventhub["hostname"], live_eventhub["event_hub"], partial(get_devtools_credential, is_async=True),
           receivers)
    for r in receivers:
        r.close()


def _senders(live_eventhub: dict[str, Any], uamqp_transport: bool, client_args: dict[str, Any]) -> Any:
    client = EventHubProducerClient(fully_qualified_namespace=live_eventhub["hostname"],
                                    eventhub_name=live_eventhub["event_hub"], credential=get_devtools_credential(),
                                    uamqp_transport=uamqp_transport, **client_args)
    return client, [client._create_producer(partition_id=p) for p in client.get_partition_ids()]


@pytest.fixture
def auth_credential_senders(live_eventhub: dict[str, Any], uamqp_transport: bool, client_args: dict[str, Any]) -> Any:
    client, senders = _senders(live_eventhub, uamqp_transport, client_args)
    yield live_eventhub["hostname"], live_eventhub["event_hub"], get_devtools_credential, senders
    for s in senders:
        s.close()
    client.close()


@pytest.fixture
def auth_credential_senders_async(live_eventhub: dict[str, Any], uamqp_transport: bool,
                                  client_args: dict[str, Any]) -> Any:
    client, senders = _senders(live_eventhub, uamqp_transport, client_args)
    yield (live_eventhub["hostname"], live_eventhub["event_hub"], partial(get_devtools_credential, is_async=True),
           senders)
    for s in senders:
        s.close()
    client.close()

