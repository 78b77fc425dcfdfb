"""What the Blob and Table stores share: connection strings, credentials, names, retries,
error descriptions, the server's clock, argument checks, concurrent conditional claims
and the fenced checkpoint write loop (the storage calls themselves stay in each store).

Nothing here ever puts a key, a SAS token or a whole connection string into a message:
errors name the *part* that is wrong ("AccountKey is not valid base64"), URLs are
shown without their query string, and Azure exceptions are described by type, status
and error code only.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import inspect
import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Awaitable, Callable, Dict, Hashable, List, NoReturn, Optional, Sequence, Tuple, TypeVar
from urllib.parse import urlsplit, urlunsplit

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

from eventprocessor.errors import CheckpointStoreError, ClaimOwnershipError, ConfigurationError, OwnershipLostError
from eventprocessor.records import Checkpoint, Ownership

logger = logging.getLogger(__name__)

DEV_ACCOUNT_NAME = "devstoreaccount1"
# The emulator's fixed, publicly documented key (the same in every Azurite). Not a secret.
DEV_ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_DEV_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}

# Connect fast, fail fast: a balancing tick is seconds long, so a request that cannot
# connect in 5 s is better reported (and retried next tick) than waited for.
CONNECTION_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
RETRY_TOTAL = 3
RETRY_BACKOFF = 1.0

# What a checkpoint without an offset stores: the official processor reads the offset as
# a string and starts *after* it, and "-1" is Event Hubs' start-of-stream position, so it
# re-reads from the start instead of failing on "" (which its blob reader turns into
# "None"). A real offset is never "-1", so reading it back as ``None`` is exact.
NO_OFFSET = "-1"

# The answers to a conditional write that mean another writer got there first: 409 for
# create-if-absent on an existing record, 412 for a stale etag, 404 for a vanished one.
LOST_RACE = (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError)

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class StorageAccount:
    """Where a store's service lives and how to authenticate: the parsed connection string."""

    endpoint: str
    account_name: Optional[str]
    credential: Any  # AzureNamedKeyCredential, AzureSasCredential or None

    def __repr__(self) -> str:
        return f"StorageAccount(endpoint={safe_url(self.endpoint)!r}, account_name={self.account_name!r})"


def safe_url(url: str) -> str:
    """``url`` without query string, fragment or user info: what may be logged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def describe_error(error: BaseException) -> str:
    """Type, HTTP status and service error code of ``error``; never its message, which
    for some Azure errors quotes request details."""
    parts = [type(error).__name__]
    status = getattr(error, "status_code", None)
    if status is not None:
        parts.append(f"HTTP {status}")
    code = getattr(error, "error_code", None)
    if code:
        parts.append(str(getattr(code, "value", code)))
    return " ".join(parts)


def server_date(headers: Any) -> Optional[datetime]:
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
        self.latest: Optional[datetime] = None

    def hook(self, pipeline_response: Any) -> None:
        when = server_date(getattr(pipeline_response.http_response, "headers", None))
        if when is not None and (self.latest is None or when > self.latest):
            self.latest = when


# --------------------------------------------------------------------------- names


def check_name_part(value: Any, what: str, *, forbidden: str) -> str:
    """Validate one component of a blob name or table key."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {type(value).__name__}")
    bad = sorted({c for c in value if c in forbidden})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise ConfigurationError(f"{what} {value!r} contains characters this store cannot use: {shown}")
    if _CONTROL.search(value):
        raise ConfigurationError(f"{what} {value!r} contains control characters")
    return value


def check_scope(namespace: Any, eventhub: Any, consumer_group: Any, *, forbidden: str) -> Tuple[str, str, str]:
    """Validate the (namespace, event hub, consumer group) that every record key starts with."""
    return (
        check_name_part(namespace, "fully_qualified_namespace", forbidden=forbidden),
        check_name_part(eventhub, "eventhub_name", forbidden=forbidden),
        check_name_part(consumer_group, "consumer_group", forbidden=forbidden),
    )


_CONTAINER = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")


def check_container_name(name: Any) -> str:
    """Azure container rules: 3-63 characters, lower-case letters, digits and single
    hyphens, starting and ending with a letter or digit."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError("container_name must be a non-empty string")
    if not _CONTAINER.match(name):
        raise ConfigurationError(
            f"container name {name!r} is invalid: use 3-63 lower-case letters, digits and single "
            "hyphens, starting and ending with a letter or digit"
        )
    return name


_TABLE = re.compile(r"^[A-Za-z][A-Za-z0-9]{2,62}$")


def check_table_name(name: Any) -> str:
    """Azure table rules: 3-63 letters and digits, starting with a letter, not 'tables'."""
    if not isinstance(name, str) or not name:
        raise ConfigurationError("table_name must be a non-empty string")
    if not _TABLE.match(name) or name.lower() == "tables":
        raise ConfigurationError(
            f"table name {name!r} is invalid: use 3-63 letters and digits, starting with a letter "
            "(and not the reserved name 'tables')"
        )
    return name


# ------------------------------------------------------------------ connection strings


def _is_base64(value: str) -> bool:
    try:
        return bool(value) and len(base64.b64decode(value, validate=True)) > 0
    except (binascii.Error, ValueError):
        return False


def parse_connection_string(conn_str: Any, service: str) -> StorageAccount:
    """Parse an Azure Storage connection string for ``service`` ("blob" or "table").

    Accepts ``UseDevelopmentStorage=true`` (optionally with ``DevelopmentStorageProxyUri``)
    and explicit strings with ``AccountName``/``AccountKey`` or ``SharedAccessSignature``
    and either ``BlobEndpoint``/``TableEndpoint`` or ``DefaultEndpointsProtocol`` +
    ``EndpointSuffix``. Errors name the faulty part, never its value.
    """
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    if not isinstance(conn_str, str):
        raise ConfigurationError(f"connection string must be a str, got {type(conn_str).__name__}")
    if not conn_str.strip():
        raise ConfigurationError("connection string is empty")
    settings: Dict[str, str] = {}
    for index, segment in enumerate(s for s in conn_str.strip().split(";") if s.strip()):
        key, sep, value = segment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigurationError(
                f"connection string is malformed: segment {index + 1} is not of the form Key=Value"
            )
        folded = key.lower()
        if folded in settings:
            raise ConfigurationError(f"connection string is malformed: {key} is given twice")
        settings[folded] = value.strip()

    if {"endpoint", "sharedaccesskeyname", "sharedaccesskey", "entitypath"} & settings.keys():
        raise ConfigurationError(
            "this looks like an Event Hubs connection string (it has Endpoint/SharedAccessKeyName); "
            "the checkpoint store needs an Azure Storage account connection string"
        )

    if "usedevelopmentstorage" in settings:
        if settings["usedevelopmentstorage"].lower() != "true":
            raise ConfigurationError("UseDevelopmentStorage must be 'true' when given")
        proxy = settings.get("developmentstorageproxyuri", "http://127.0.0.1")
        parts = urlsplit(proxy)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError("DevelopmentStorageProxyUri must be an http(s) URL")
        endpoint = f"{parts.scheme}://{parts.hostname}:{_DEV_PORTS[service]}/{DEV_ACCOUNT_NAME}"
        return StorageAccount(endpoint, DEV_ACCOUNT_NAME, AzureNamedKeyCredential(DEV_ACCOUNT_NAME, DEV_ACCOUNT_KEY))

    account_name = settings.get("accountname") or None
    account_key = settings.get("accountkey")
    sas = settings.get("sharedaccesssignature")
    if account_key is not None and sas is not None:
        raise ConfigurationError("connection string has both AccountKey and SharedAccessSignature; give one")
    if account_key is not None:
        if not account_name:
            raise ConfigurationError("connection string has an AccountKey but no AccountName")
        if not _is_base64(account_key):
            raise ConfigurationError("connection string AccountKey is not valid base64")
        credential: Any = AzureNamedKeyCredential(account_name, account_key)
    elif sas is not None:
        if not sas.lstrip("?"):
            raise ConfigurationError("connection string SharedAccessSignature is empty")
        if "sig=" not in sas:
            raise ConfigurationError("connection string SharedAccessSignature has no 'sig=' field")
        credential = AzureSasCredential(sas.lstrip("?"))
    else:
        raise ConfigurationError(
            "connection string has neither AccountKey nor SharedAccessSignature; use one, or "
            "construct the store with an account URL and a credential"
        )

    endpoint_key = f"{service}endpoint"
    if settings.get(endpoint_key):
        endpoint = settings[endpoint_key].rstrip("/")
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"connection string {service.capitalize()}Endpoint is not an http(s) URL")
        if parts.query:
            raise ConfigurationError(
                f"connection string {service.capitalize()}Endpoint must not carry a query string; "
                "put a SAS token in SharedAccessSignature"
            )
    else:
        if not account_name:
            raise ConfigurationError(
                f"connection string has neither {service.capitalize()}Endpoint nor AccountName"
            )
        protocol = settings.get("defaultendpointsprotocol", "https").lower()
        if protocol not in ("http", "https"):
            raise ConfigurationError("connection string DefaultEndpointsProtocol must be http or https")
        suffix = settings.get("endpointsuffix", "core.windows.net").strip(".")
        if not suffix or "/" in suffix:
            raise ConfigurationError("connection string EndpointSuffix is not a host suffix")
        endpoint = f"{protocol}://{account_name}.{service}.{suffix}"
    return StorageAccount(endpoint, account_name or account_name_from_url(endpoint), credential)


def account_name_from_url(url: str) -> Optional[str]:
    """The account name of a service URL: the first path segment for emulator-style
    URLs (IP address or localhost), else the first DNS label."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host in ("localhost",) or re.match(r"^[0-9.]+$", host) or ":" in host:
        first = parts.path.strip("/").split("/")[0]
        return first or None
    return host.split(".")[0] or None


def check_account_url(url: Any) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("account_url must be a non-empty http(s) URL")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"account_url {safe_url(url)!r} is not an http(s) URL")
    return url.strip()


def resolve_credential(credential: Any, account_url: str, *, sas_as_string: bool) -> Any:
    """Turn the user's credential into what the Azure SDK client takes.

    * ``None``: anonymous, or a SAS token already in ``account_url``;
    * a ``str`` with ``sig=``: a SAS token;
    * another ``str`` that is base64: the account key (account name taken from the URL);
    * a dict ``{"account_name", "account_key"}``, ``AzureNamedKeyCredential``,
      ``AzureSasCredential`` or an (async) token credential: passed on.
    """
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    if credential is None or isinstance(credential, (AzureNamedKeyCredential, AzureSasCredential)):
        return credential
    if hasattr(credential, "get_token"):
        if not inspect.iscoroutinefunction(credential.get_token):
            raise ConfigurationError(
                f"{type(credential).__name__} is a synchronous credential; these stores are async, use the "
                "credential from azure.identity.aio"
            )
        return credential
    if isinstance(credential, dict):
        name, key = credential.get("account_name"), credential.get("account_key")
        if not isinstance(name, str) or not isinstance(key, str) or not name:
            raise ConfigurationError("credential dict needs string 'account_name' and 'account_key'")
        if not _is_base64(key):
            raise ConfigurationError("credential account_key is not valid base64")
        return AzureNamedKeyCredential(name, key)
    if isinstance(credential, str):
        token = credential.strip().lstrip("?")
        if "sig=" in token:
            return token if sas_as_string else AzureSasCredential(token)
        if _is_base64(token):
            name = account_name_from_url(account_url)
            if not name:
                raise ConfigurationError("cannot tell the account name from account_url for this account key")
            return AzureNamedKeyCredential(name, token)
        raise ConfigurationError(
            "credential string is neither a SAS token (no 'sig=' field) nor a base64 account key"
        )
    raise ConfigurationError(
        f"unsupported credential type {type(credential).__name__}: use a TokenCredential, a SAS token, "
        "an account key, AzureNamedKeyCredential or AzureSasCredential"
    )


def client_options(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Our defaults for timeouts, under the user's own keyword arguments."""
    options: Dict[str, Any] = {"connection_timeout": CONNECTION_TIMEOUT, "read_timeout": READ_TIMEOUT}
    options.update(kwargs)
    return options


def parse_int(value: Any) -> Optional[int]:
    """An int from metadata/entity values written by us or other SDKs; ``None`` if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    inner = getattr(value, "value", None)  # azure.data.tables.EntityProperty
    if inner is not None and not isinstance(value, str):
        return parse_int(inner)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    return None


class WarnOnce:
    """Warn about a bad record once per version; later sightings go to debug.

    The balancer lists every few seconds, so without this one foreign blob would fill
    the log.
    """

    def __init__(self, log: logging.Logger, limit: int = 10_000) -> None:
        self._log = log
        self._seen: set = set()
        self._limit = limit

    def __call__(self, key: Tuple[str, Optional[str]], message: str, *args: Any) -> None:
        if key in self._seen:
            self._log.debug(message, *args)
            return
        if len(self._seen) < self._limit:
            self._seen.add(key)
        self._log.warning(message, *args)


def first_failure(results: List[Any]) -> Optional[BaseException]:
    for item in results:
        if isinstance(item, BaseException) and not isinstance(item, Exception):
            return item
    return None


# ------------------------------------------------------------------ argument checks


def check_claim(claim: Any) -> None:
    """Refuse a claim no store could write, before any request is sent."""
    if not isinstance(claim, Ownership):
        raise ConfigurationError(f"claims must be Ownership records, got {type(claim).__name__}")
    if not isinstance(claim.owner_id, str):
        raise ConfigurationError("owner_id must be a string")
    if not isinstance(claim.epoch, int) or isinstance(claim.epoch, bool) or claim.epoch < 0:
        raise ConfigurationError(f"epoch of partition {claim.partition_id!r} must be a non-negative int")


def check_checkpoint(checkpoint: Any, owner_id: Any, epoch: Any) -> None:
    """Refuse a checkpoint or fence no store could write, before any request is sent."""
    if not isinstance(checkpoint, Checkpoint):
        raise ConfigurationError(f"expected a Checkpoint, got {type(checkpoint).__name__}")
    seq = checkpoint.sequence_number
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ConfigurationError(
            f"sequence_number of partition {checkpoint.partition_id!r} must be an int, got {type(seq).__name__}")
    if not isinstance(owner_id, str) or not owner_id:
        raise ConfigurationError("owner_id must be a non-empty string")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ConfigurationError("epoch must be a non-negative int")


# ------------------------------------------------------------------ claims

_Prepared = TypeVar("_Prepared")


async def claim_concurrently(
    claims: Sequence[Ownership],
    prepared: Sequence[_Prepared],
    claim_one: Callable[[Ownership, _Prepared], Awaitable[Optional[Ownership]]],
    where: str,
) -> List[Ownership]:
    """Run ``claim_one(claim, prepared)`` for every claim at once; return the ones won.

    ``claim_one`` returns ``None`` for a lost race and raises for anything else. The
    failures are raised together as one ``ClaimOwnershipError`` that carries the claims
    won in the same call, so the caller can still dispatch those; ``where`` names the
    container or table in its message. A cancellation or other ``BaseException`` of any
    claim is re-raised as it is.
    """
    results = await asyncio.gather(
        *(claim_one(c, p) for c, p in zip(claims, prepared)), return_exceptions=True)
    fatal = first_failure(results)
    if fatal is not None:
        raise fatal
    won: List[Ownership] = []
    failures: Dict[str, Exception] = {}
    for claim, result in zip(claims, results):
        if isinstance(result, Exception):
            failures[claim.partition_id] = result
        elif isinstance(result, Ownership):
            won.append(result)
    if failures:
        detail = ", ".join(f"{pid}: {error}" for pid, error in sorted(failures.items()))
        raise ClaimOwnershipError(
            f"{len(failures)} of {len(claims)} claims in {where} failed ({detail})",
            claimed=won,
            failures=failures,
        )
    return won


async def claim_conditionally(
    claim: Ownership,
    write: Callable[[], Awaitable[Tuple[Optional[str], Optional[datetime]]]],
    forget_if_gone: Callable[[BaseException], None],
    log: logging.Logger,
) -> Optional[Ownership]:
    """One claim: ``write()`` (create-if-absent or etag-conditional, the store's call)
    returns the new record's etag and last-modified time.

    A lost race (409/412, or 404 for a record that vanished) returns ``None``. A 404 on
    create means the container or table is gone: ``forget_if_gone`` lets the store
    re-create it, and the claim fails. Any other error fails the claim with
    ``CheckpointStoreError``: an unknown error is never success.
    """
    try:
        etag, last_modified = await write()
    except LOST_RACE as error:
        if isinstance(error, ResourceNotFoundError) and claim.etag is None:
            forget_if_gone(error)
            claim_failed(log, claim, error)
        log.debug(
            "processor %s lost the claim of partition %s (hub %s, consumer group %s): %s",
            claim.owner_id, claim.partition_id, claim.eventhub_name, claim.consumer_group, describe_error(error),
        )
        return None
    except Exception as error:  # HTTP or network errors after the retries: never success
        claim_failed(log, claim, error)
    log.debug(
        "processor %s claimed partition %s (hub %s, consumer group %s, epoch %s)",
        claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name, claim.consumer_group, claim.epoch,
    )
    return replace(claim, etag=etag, last_modified_time=last_modified)


def claim_failed(log: logging.Logger, claim: Ownership, error: BaseException) -> NoReturn:
    log.warning(
        "processor %s: claim of partition %s (hub %s, consumer group %s) failed: %s",
        claim.owner_id, claim.partition_id, claim.eventhub_name, claim.consumer_group, describe_error(error),
    )
    failure = CheckpointStoreError(f"claim of partition {claim.partition_id} failed: {describe_error(error)}")
    failure.__cause__ = error
    raise failure


# ------------------------------------------------------------------ fenced checkpoints

_Record = TypeVar("_Record")
_Key = TypeVar("_Key", bound=Hashable)


async def read_ownership_record(
    checkpoint: Checkpoint,
    owner_id: str,
    epoch: int,
    read: Callable[[], Awaitable[_Record]],
    forget_if_gone: Callable[[BaseException], None],
) -> _Record:
    """``read()`` the partition's ownership record for the fence: no record means the
    partition is not ours (``OwnershipLostError``), any other error is a
    ``CheckpointStoreError``."""
    try:
        return await read()
    except ResourceNotFoundError as error:
        forget_if_gone(error)
        raise OwnershipLostError(
            f"checkpoint of partition {checkpoint.partition_id} refused: {owner_id} (epoch {epoch}) does "
            "not own it, there is no ownership record", partition_id=checkpoint.partition_id,
        ) from error
    except AzureError as error:
        raise CheckpointStoreError(
            f"reading ownership of partition {checkpoint.partition_id} failed: {describe_error(error)}"
        ) from error


def require_owner(
    checkpoint: Checkpoint, owner_id: str, epoch: int, holder: Optional[str], held_epoch: Optional[int], shown_epoch: Any
) -> None:
    """Raise ``OwnershipLostError`` unless the record names ``(owner_id, epoch)``;
    ``shown_epoch`` is the stored epoch as the message quotes it."""
    if holder != owner_id or held_epoch != epoch:
        raise OwnershipLostError(
            f"checkpoint of partition {checkpoint.partition_id} refused: {owner_id} (epoch {epoch}) does not "
            f"own it, {holder or 'nobody'} does (epoch {shown_epoch})",
            partition_id=checkpoint.partition_id,
        )


async def read_checkpoint_record(checkpoint: Checkpoint, read: Callable[[], Awaitable[_Record]]) -> Optional[_Record]:
    """``read()`` the stored checkpoint; ``None`` when there is none yet."""
    try:
        return await read()
    except ResourceNotFoundError:
        return None
    except AzureError as error:
        raise CheckpointStoreError(
            f"reading checkpoint of partition {checkpoint.partition_id} failed: {describe_error(error)}"
        ) from error


def refuse_later_epoch(checkpoint: Checkpoint, owner_id: str, epoch: int, stored_epoch: Optional[int]) -> None:
    """A checkpoint written by a later epoch is never overwritten by an earlier one."""
    if stored_epoch is not None and stored_epoch > epoch:
        raise OwnershipLostError(
            f"checkpoint of partition {checkpoint.partition_id} refused: it was written by epoch "
            f"{stored_epoch}, later than {owner_id}'s epoch {epoch}", partition_id=checkpoint.partition_id,
        )



async def write_fenced(
    checkpoint: Checkpoint,
    owner_id: str,
    epoch: int,
    *,
    verify_owner: Callable[[], Awaitable[None]],
    read_etag: Callable[[], Awaitable[Optional[str]]],
    write: Callable[[Optional[str]], Awaitable[str]],
    etags: Dict[_Key, str],
    cache_key: _Key,
    log: logging.Logger,
) -> None:
    """The fenced checkpoint write, with the storage calls passed in.

    Per attempt: ``verify_owner()`` (raises ``OwnershipLostError`` unless
    ``(owner_id, epoch)`` holds the partition), then the checkpoint's etag from
    ``etags[cache_key]`` (the store's own last write) or from ``read_etag()`` (``None``:
    no checkpoint yet; raises ``OwnershipLostError`` for a later epoch's), then
    ``write(etag)``: create-if-absent for ``None``, else a write ``If-Match`` the etag,
    returning the new etag, which is cached. A lost race (409/412/404) drops the cached
    etag and tries once more, re-verifying and re-reading; a second one, or any other
    Azure error, raises ``CheckpointStoreError``.
    """
    for attempt in (1, 2):
        await verify_owner()
        etag = None if attempt == 2 else etags.get(cache_key)
        if etag is None:
            etag = await read_etag()
        try:
            new_etag = await write(etag)
        except LOST_RACE as error:
            etags.pop(cache_key, None)
            log.info(
                "processor %s: checkpoint of partition %s (hub %s, consumer group %s) changed under it "
                "(%s, attempt %d)", owner_id, checkpoint.partition_id, checkpoint.eventhub_name,
                checkpoint.consumer_group, describe_error(error), attempt,
            )
            continue
        except AzureError as error:
            etags.pop(cache_key, None)
            raise CheckpointStoreError(
                f"checkpoint of partition {checkpoint.partition_id} failed: {describe_error(error)}"
            ) from error
        etags[cache_key] = new_etag
        log.debug(
            "processor %s checkpointed partition %s (hub %s, consumer group %s) at sequence number %s",
            owner_id, checkpoint.partition_id, checkpoint.eventhub_name, checkpoint.consumer_group,
            checkpoint.sequence_number,
        )
        return
    raise CheckpointStoreError(
        f"checkpoint of partition {checkpoint.partition_id} by {owner_id} (epoch {epoch}) was changed by "
        "another writer twice while it owned the partition; not written"
    )
