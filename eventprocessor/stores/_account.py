"""How the Blob and Table stores reach their storage account: connection strings,
credentials, account URLs, container and table names, client timeouts, and descriptions
of errors and URLs that are safe to show.

Nothing here ever puts a key, a SAS token or a whole connection string into a message:
errors name the *part* that is wrong ("AccountKey is not valid base64"), URLs are
shown without their query string, and Azure exceptions are described by type, status,
error code and the first line of the service's own message with anything that looks
like a credential removed, followed by the likely cause and its fix when there is a
known one (an Azurite that refuses the API version, a refused key, a missing container).
"""
from __future__ import annotations

import base64
import binascii
import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from eventprocessor.errors import ConfigurationError

DEV_ACCOUNT_NAME = "devstoreaccount1"
# The emulator's fixed, publicly documented key (the same in every Azurite). Not a secret.
DEV_ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_DEV_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}


@dataclass(frozen=True)
class StorageAccount:
    """Where a store's service lives and how to authenticate: the parsed connection string."""

    endpoint: str
    account_name: str | None
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
    """What went wrong, for a message: type, HTTP status, the service's error code, the
    service's own message (its first line, with anything that could be a credential
    removed) and, for the failures a user can fix, the likely cause and the fix.

    Example::

        describe_error(error)
        # 'HttpResponseError HTTP 403 AuthorizationFailure: "Server failed to authenticate the request. ..."
        #  (likely cause: the account key or SAS token was refused ...)'
    """
    parts = [type(error).__name__]
    status = getattr(error, "status_code", None)
    if status is not None:
        parts.append(f"HTTP {status}")
    code = error_code(error)
    if code:
        parts.append(code)
    text = " ".join(parts)
    said = service_message(error)
    if said:
        text += f': "{said}"'
    cause = likely_cause(error)
    if cause:
        text += f" (likely cause: {cause})"
    return text


def error_code(error: BaseException) -> str:
    """The service's error code of an Azure error (``""`` when it has none)."""
    code = getattr(error, "error_code", None)
    return str(getattr(code, "value", code) or "")


_MAX_SAID = 400
# What could be a credential in a service's message: a SAS signature, a long base64
# run (a key, a token, a MAC), the string-to-sign some services quote.
_SECRET_LOOKING = [
    (re.compile(r"(?i)\bsig=[^&\s'\"]*"), "sig=<removed>"),
    (re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}"), "<removed>"),
    (re.compile(r"(?i)(string to sign|string-to-sign|stringtosign)\b.*"), r"\1 <removed>"),
]


def service_message(error: BaseException) -> str:
    """The first line of the message the service (or the transport) gave ``error``: the
    part that explains it ("The API version ... is not supported by Azurite ..."), without
    the request id, the time or anything that looks like a credential."""
    message = getattr(error, "message", None)
    if not isinstance(message, str) or not message.strip():
        message = str(error)
    first = message.strip().splitlines()[0].strip() if message.strip() else ""
    for pattern, replacement in _SECRET_LOOKING:
        first = pattern.sub(replacement, first)
    if len(first) > _MAX_SAID:
        first = first[:_MAX_SAID - 3].rstrip() + "..."
    return first


_REFUSED_CREDENTIAL = frozenset({"AuthenticationFailed", "AuthorizationFailure", "InvalidAuthenticationInfo"})
_NOT_PERMITTED = frozenset({
    "AuthorizationPermissionMismatch", "AuthorizationResourceTypeMismatch", "AuthorizationServiceMismatch",
    "AuthorizationProtocolMismatch", "AuthorizationSourceIPMismatch", "InsufficientAccountPermissions",
    "KeyBasedAuthenticationNotPermitted",
})
_HOME_MISSING = frozenset({"ContainerNotFound", "TableNotFound"})


def likely_cause(error: BaseException) -> str | None:
    """The likely cause of a storage failure a user can fix, and the fix; None otherwise.

    Example::

        likely_cause(error)   # for Azurite started without --skipApiVersionCheck:
        # 'Azurite refuses the storage API version of the installed azure-storage SDK: start it
        #  with --skipApiVersionCheck (`eventprocessor azurite` does), or use a newer Azurite'
    """
    code = error_code(error)
    status = getattr(error, "status_code", None)
    said = service_message(error).lower()
    if code in ("InvalidHeaderValue", "InvalidApiVersion", "UnsupportedHeader") and \
            ("api version" in said or "x-ms-version" in said or "skipapiversioncheck" in said):
        return ("Azurite refuses the storage API version of the installed azure-storage SDK: start it with "
                "--skipApiVersionCheck (`eventprocessor azurite` does), or use a newer Azurite")
    if code in _REFUSED_CREDENTIAL:
        return ("the account key or SAS token was refused: check that it belongs to this account and, for a SAS, "
                "that it has not expired (a clock far off makes a valid one look expired)")
    if code in _NOT_PERMITTED:
        return ("the credential is valid but not allowed to do this: give the identity the \"Storage Blob Data "
                "Contributor\" (or \"Storage Table Data Contributor\") role, or use a SAS that may read, list, "
                "create, write and delete")
    if code in _HOME_MISSING:
        what = "table" if code == "TableNotFound" else "container"
        return (f"the {what} does not exist and the credential may not create it: create the {what}, or use a "
                f"credential that may")
    if status is None and type(error).__name__ in ("ServiceRequestError", "ServiceRequestTimeoutError"):
        return "nothing answers at the account URL: start the storage service (Azurite: `eventprocessor azurite`) " \
               "or fix the URL"
    return None


# --------------------------------------------------------------------------- names


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


def _settings(conn_str: Any) -> dict[str, str]:
    """The ``Key=Value`` segments of a connection string, by lower-cased key."""
    if not isinstance(conn_str, str):
        raise ConfigurationError(f"connection string must be a str, got {type(conn_str).__name__}")
    if not conn_str.strip():
        raise ConfigurationError("connection string is empty")
    settings: dict[str, str] = {}
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
    return settings


def _development_storage(settings: Mapping[str, str], service: str) -> StorageAccount:
    """``UseDevelopmentStorage=true``: the emulator's well-known account on its default ports."""
    from azure.core.credentials import AzureNamedKeyCredential

    if settings["usedevelopmentstorage"].lower() != "true":
        raise ConfigurationError("UseDevelopmentStorage must be 'true' when given")
    proxy = settings.get("developmentstorageproxyuri", "http://127.0.0.1")
    parts = urlsplit(proxy)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError("DevelopmentStorageProxyUri must be an http(s) URL")
    endpoint = f"{parts.scheme}://{parts.hostname}:{_DEV_PORTS[service]}/{DEV_ACCOUNT_NAME}"
    return StorageAccount(endpoint, DEV_ACCOUNT_NAME, AzureNamedKeyCredential(DEV_ACCOUNT_NAME, DEV_ACCOUNT_KEY))


def _credential(settings: Mapping[str, str], account_name: str | None, credential_given: bool) -> Any:
    """The account key or SAS the string carries (None when the caller has its own)."""
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

    account_key = settings.get("accountkey")
    sas = settings.get("sharedaccesssignature")
    if account_key is not None and sas is not None:
        raise ConfigurationError("connection string has both AccountKey and SharedAccessSignature; give one")
    if account_key is not None:
        if not account_name:
            raise ConfigurationError("connection string has an AccountKey but no AccountName")
        if not _is_base64(account_key):
            raise ConfigurationError("connection string AccountKey is not valid base64")
        return AzureNamedKeyCredential(account_name, account_key)
    if sas is not None:
        if not sas.lstrip("?"):
            raise ConfigurationError("connection string SharedAccessSignature is empty")
        if "sig=" not in sas:
            raise ConfigurationError("connection string SharedAccessSignature has no 'sig=' field")
        return AzureSasCredential(sas.lstrip("?"))
    if credential_given:
        return None
    raise ConfigurationError(
        "connection string has neither AccountKey nor SharedAccessSignature; use one, or "
        "construct the store with an account URL and a credential"
    )


def _endpoint(settings: Mapping[str, str], service: str, account_name: str | None) -> str:
    """The service's endpoint: ``BlobEndpoint``/``TableEndpoint``, else built from the
    account name, ``DefaultEndpointsProtocol`` and ``EndpointSuffix``."""
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
        return endpoint
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
    return f"{protocol}://{account_name}.{service}.{suffix}"


def parse_connection_string(conn_str: Any, service: str, *, credential_given: bool = False) -> StorageAccount:
    """Parse an Azure Storage connection string for ``service`` ("blob" or "table").

    Accepts ``UseDevelopmentStorage=true`` (optionally with ``DevelopmentStorageProxyUri``)
    and explicit strings with ``AccountName``/``AccountKey`` or ``SharedAccessSignature``
    and either ``BlobEndpoint``/``TableEndpoint`` or ``DefaultEndpointsProtocol`` +
    ``EndpointSuffix``. With ``credential_given`` (the caller has its own credential, as
    the Azure SDKs allow) a string with neither key nor SAS is fine; its credential is
    then ``None``. Errors name the faulty part, never its value.
    """
    settings = _settings(conn_str)
    if "usedevelopmentstorage" in settings:
        return _development_storage(settings, service)
    account_name = settings.get("accountname") or None
    credential = _credential(settings, account_name, credential_given)
    endpoint = _endpoint(settings, service, account_name)
    return StorageAccount(endpoint, account_name or account_name_from_url(endpoint), credential)


def one_of(ours: str, our_value: Any, official: str, official_value: Any) -> Any:
    """The value of an argument that has our name and the official SDK's name: given
    under one of them, not both (``None`` when neither)."""
    if our_value is not None and official_value is not None:
        raise ConfigurationError(f"{ours} and {official} name the same thing; give one of them, not both")
    return our_value if our_value is not None else official_value


def account_name_from_url(url: str) -> str | None:
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


# --------------------------------------------------------------------------- timeouts

DEFAULT_OPERATION_TIMEOUT = 10.0
"""Seconds one store call may take, retries included, unless the user says otherwise."""

RETRY_TOTAL = 2
RETRY_BACKOFF = 0.5


@dataclass(frozen=True)
class ClientTimeouts:
    """The transport settings that keep one store call inside ``operation_timeout``.

    A black-holed endpoint (accepts the connection, never answers) costs one
    ``read_timeout`` per attempt; an unreachable one costs one ``connection_timeout``.
    With ``RETRY_TOTAL`` retries ``RETRY_BACKOFF`` apart, the attempts would add up to
    a little more than ``operation_timeout``; the store cuts the call at
    ``operation_timeout`` whatever the transport does (see ``eventprocessor.stores.calls``).
    """

    operation_timeout: float | None
    connection_timeout: float
    read_timeout: float

    @classmethod
    def for_operation(cls, operation_timeout: Any) -> ClientTimeouts:
        """Derive the transport timeouts from ``operation_timeout`` (seconds, or ``None``
        for no overall deadline; the transport timeouts then derive from the default)."""
        if operation_timeout is not None and (
            isinstance(operation_timeout, bool) or not isinstance(operation_timeout, (int, float))
            or not math.isfinite(operation_timeout) or operation_timeout <= 0
        ):
            raise ConfigurationError(
                f"operation_timeout must be a positive number of seconds or None, got {operation_timeout!r}")
        basis = float(operation_timeout if operation_timeout is not None else DEFAULT_OPERATION_TIMEOUT)
        return cls(
            operation_timeout=None if operation_timeout is None else float(operation_timeout),
            connection_timeout=min(5.0, basis / 4),
            read_timeout=basis / 2,
        )

    def client_options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """These timeouts under the user's own keyword arguments (which win), and the
        environment's proxy settings left alone when it has none (see
        :func:`environment_names_a_proxy`)."""
        options: dict[str, Any] = {"connection_timeout": self.connection_timeout, "read_timeout": self.read_timeout}
        if "transport" not in kwargs and not environment_names_a_proxy():
            options["use_env_settings"] = False
        options.update(kwargs)
        return options


def environment_names_a_proxy() -> bool:
    """Whether the environment names a proxy (``HTTPS_PROXY``, ``http_proxy``... or the
    system's settings) or has a netrc file: what aiohttp reads when told to trust the
    environment, as azure-core tells it by default. It reads them again on every
    request, each in a worker thread: two thread trips per store request, about half
    of the client CPU of a checkpoint. The stores ask once, when they are built; with
    nothing to read they tell azure-core not to (``use_env_settings=False``), and
    with a proxy they keep its default. Pass ``use_env_settings`` to decide yourself.
    """
    import os
    import urllib.request
    from pathlib import Path

    if urllib.request.getproxies():
        return True
    netrc = os.environ.get("NETRC")
    if netrc:
        return True
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no home directory: no netrc file either
        return False
    return (home / ".netrc").exists() or (home / "_netrc").exists()
