"""What the Blob and Table stores share: for their backends, creating the container or
table once, counting requests, turning Azure SDK errors into record outcomes and
reading the service's clock from ``Date`` headers; for the stores, construction from a
connection string and a repr without secrets.
"""
from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)

from eventprocessor.errors import ConfigurationError

from ._account import (
    ClientTimeouts,
    account_name_from_url,
    check_account_url,
    describe_error,
    error_code,
    one_of,
    parse_connection_string,
    resolve_credential,
    safe_url,
)
from .backend import OWNERSHIP, BackendFailure, EtagMismatch, Kind, RecordBackend, RecordExists, RecordMissing
from .protocol import ProtocolStore

__all__ = ["AzureRecords", "AzureCheckpointStore", "ServerClock", "server_date"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Store = TypeVar("_Store", bound="AzureCheckpointStore")


def server_date(headers: Any) -> datetime | None:
    """The ``Date`` response header as an aware UTC datetime (``None`` if absent or bad)."""
    value = headers.get("Date") if headers is not None else None
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


class ServerClock:
    """Collects the ``Date`` header of every response of one (possibly paged) listing.

    Pass :meth:`hook` as ``raw_response_hook``; :attr:`latest` is the server's time when
    it sent the last page, so every record listed was written no later than it.
    """

    def __init__(self) -> None:
        self.latest: datetime | None = None

    def hook(self, pipeline_response: Any) -> None:
        when = server_date(getattr(pipeline_response.http_response, "headers", None))
        if when is not None and (self.latest is None or when > self.latest):
            self.latest = when


_Client = TypeVar("_Client")


class AzureRecords(RecordBackend, Generic[_Client]):
    """A backend on an Azure Storage service. Subclasses create their container or
    table in :meth:`_create_home` and send every request through :meth:`_send`.

    ``gone_codes`` are the service error codes that mean the container or table itself
    is missing: the next request creates it again.
    """

    gone_codes: frozenset[str] = frozenset()

    def __init__(self, home: str, home_name: str, client: _Client, account_name: str | None) -> None:
        super().__init__()
        self.where = f"{home} {home_name}"
        self.home_name = home_name
        self.account_name = account_name
        self.client = client
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._closed = False

    async def open(self) -> None:
        await self.client.__aenter__()  # type: ignore[attr-defined]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.client.close()  # type: ignore[attr-defined]

    @abc.abstractmethod
    async def _create_home(self) -> None:
        """Make sure the container or table exists (raises ``AzureError``)."""

    @abc.abstractmethod
    async def _list_one(self) -> None:
        """Read the first page (of one record at most) of the container or table."""

    async def check(self) -> None:
        # Creating the home passes on a 403 (a SAS scoped to the container may not check
        # it), so a listing follows: it needs what every tick needs.
        self.request_counts["check"] += 1
        await self._send("check", OWNERSHIP, self._list_one, count=False)

    async def _ensure_home(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            try:
                await self._create_home()
            except AzureError as error:
                if getattr(error, "status_code", None) != 403:
                    raise BackendFailure(f"cannot use it: {describe_error(error)}") from error
                # A SAS scoped to the container or table may use records but not check or
                # create their home; the first real request says so if it is missing.
                logger.debug("no permission to check or create %s; assuming it exists", self.where)
            self._ready = True

    async def _send(self, operation: str, kind: Kind, call: Callable[[], Awaitable[_T]], *, count: bool = True) -> _T:
        """Count (unless the call counts its own pages) and send one request; Azure
        errors become record outcomes:
        409 -> ``RecordExists``, 412 -> ``EtagMismatch``, 404 of a record ->
        ``RecordMissing``, anything else (and a missing container/table) ->
        ``BackendFailure``."""
        await self._ensure_home()
        if count:
            self.request_counts[f"{operation}_{kind.name}"] += 1
        try:
            return await call()
        except ResourceExistsError as error:
            raise RecordExists(describe_error(error)) from error
        except ResourceModifiedError as error:
            raise EtagMismatch(describe_error(error)) from error
        except ResourceNotFoundError as error:
            if error_code(error) not in self.gone_codes:
                raise RecordMissing(describe_error(error)) from error
            self._ready = False
            raise BackendFailure(f"{self.where} does not exist ({describe_error(error)})") from error
        except HttpResponseError as error:
            status = error.status_code or 0
            raise BackendFailure(describe_error(error), maybe_written=status >= 500) from error
        except AzureError as error:  # no answer: the request may have been processed
            raise BackendFailure(describe_error(error), maybe_written=True) from error


class AzureCheckpointStore(ProtocolStore):
    """What ``BlobCheckpointStore`` and ``TableCheckpointStore`` share besides the
    protocol: checking the account URL and name, resolving the credential, deriving the
    client's timeouts from ``operation_timeout``, ``from_connection_string`` and a repr
    without secrets. Subclasses say which service (``_service``, ``_home``) and build
    their backend in :meth:`_backend_for`."""

    _service = ""  # the connection string's endpoint: "blob" or "table"
    _home = ""  # what ``name`` names: "container" or "table"
    _name_keyword = ""  # the official stores' keyword for it: "container_name" or "table_name"
    _sas_as_string = False  # the Blob SDK takes a SAS token as a string

    def __init__(self, account_url: str, name: str, *, credential: Any, operation_timeout: float | None,
                 client_options: dict[str, Any]) -> None:
        self._account_url = check_account_url(account_url)
        self._home_name = self._check_name(name)
        self._account_name = account_name_from_url(self._account_url)
        resolved = resolve_credential(credential, self._account_url, sas_as_string=self._sas_as_string)
        timeouts = ClientTimeouts.for_operation(operation_timeout)
        try:
            backend = self._backend_for(resolved, timeouts.client_options(client_options))
        except ValueError as error:
            # The SDK client refuses an option (an unknown api_version, a token credential
            # over http). Its first line says which; the URL in it is shown without query.
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            reason = reason.replace(self._account_url, safe_url(self._account_url))
            raise ConfigurationError(f"{type(self).__name__} for {self._home} {self._home_name!r}: {reason}") from None
        super().__init__(backend, operation_timeout=timeouts.operation_timeout)

    @staticmethod
    @abc.abstractmethod
    def _check_name(name: Any) -> str:
        """The container or table name, validated (``ConfigurationError`` otherwise)."""

    @abc.abstractmethod
    def _backend_for(self, credential: Any, options: dict[str, Any]) -> RecordBackend:
        """The backend, with an SDK client built from ``credential`` and ``options``."""

    @classmethod
    def from_connection_string(cls: type[_Store], conn_str: str, name: str | None = None, *,
                               credential: Any = None, **kwargs: Any) -> _Store:
        """Create a store from an Azure Storage connection string; ``name`` is the
        container (Blob) or table (Table), also accepted under the official stores'
        keyword (``container_name=`` or ``table_name=``). ``credential``, when given, is
        used instead of the string's key or SAS (as in the Azure SDKs); other keyword
        arguments as for the constructor (``api_version=`` among them).

        ``UseDevelopmentStorage=true`` means Azurite on its default ports. A malformed
        string raises ``ConfigurationError`` naming the part that is wrong, never its
        value.

        Example::

            store = BlobCheckpointStore.from_connection_string("UseDevelopmentStorage=true", "checkpoints")
            store = BlobCheckpointStore.from_connection_string(conn_str, container_name="checkpoints")
        """
        home = one_of("name", name, cls._name_keyword, kwargs.pop(cls._name_keyword, None))
        if home is None:
            raise ConfigurationError(f"{cls.__name__}.from_connection_string needs the {cls._home} name: "
                                     f"from_connection_string(conn_str, {cls._name_keyword}=...)")
        account = parse_connection_string(conn_str, cls._service, credential_given=credential is not None)
        return cls(account.endpoint, home, credential=account.credential if credential is None else credential,
                   **kwargs)  # type: ignore[call-arg]

    @property
    def account_url(self) -> str:
        """The storage account's endpoint this store talks to, without its query string
        (a SAS given in the URL is never shown). Example::

            store = BlobCheckpointStore.from_connection_string("UseDevelopmentStorage=true", "checkpoints")
            assert store.account_url == "http://127.0.0.1:10000/devstoreaccount1"
        """
        return safe_url(self._account_url)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(account={self._account_name!r}, endpoint={safe_url(self._account_url)!r}, "
                f"{self._home}={self._home_name!r})")
