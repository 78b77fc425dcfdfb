"""A lean List Blobs for :class:`~eventprocessor.stores.blob.BlobRecords`.

``ContainerClient.list_blobs`` spends most of a listing's client CPU turning the
service's XML into generated models and ``BlobProperties`` (about 0.25 s for 1,024
ownership blobs). The store reads four things of each blob: its name, etag,
last-modified time and metadata. :class:`LeanListing` sends the same request
(``GET {container}?restype=container&comp=list&prefix=...&include=metadata[&marker=...]``)
through the container client's own pipeline, so authentication (key, SAS, token),
``x-ms-version``, retries, transport timeouts, ``raw_response_hook`` and the secondary
host work as for the SDK's listing, and reads those four from the XML the pipeline has
already parsed.

Contract, the same as the SDK's listing for what the store reads:

* ``name``: the blob name (percent-decoded when the service marks it ``Encoded``);
* ``etag``: as the service sent it (bare in a listing);
* ``last_modified``: an aware datetime in UTC (``None`` if absent);
* ``metadata``: the ``Metadata`` element's children as ``{tag: text}``, tags as sent,
  an empty value as ``None`` (one difference: the SDK drops a key spelled exactly
  ``Encrypted``, the name of its model's attribute; this one keeps it);
* every page is followed until ``NextMarker`` is empty; one request per page;
* an answer other than 200 raises what the SDK raises: ``map_error`` for 401/404/409/304,
  else ``HttpResponseError``, both passed through the SDK's storage error processing
  (``ResourceNotFoundError`` with ``error_code`` ``ContainerNotFound``, and so on).

Checked with azure-storage-blob 12.31.1 and azure-core 1.41.0. Two private pieces of
azure-storage-blob are used: ``ContainerClient._pipeline`` (the pipeline its generated
client runs, also used by its batch calls) and
``azure.storage.blob._shared.response_handlers.process_storage_error`` (what its pager
calls on an error). The rest is public: ``ContainerClient.url`` (with a SAS given as a
string), ``ContainerClient.api_version``, ``azure.core.rest.HttpRequest`` and the XML that
azure-core's ``ContentDecodePolicy`` leaves in the response context (what the SDK's own
generated code deserializes). :func:`lean_listing` returns ``None`` when a piece is
missing, and the store lists with the SDK instead.
"""
from __future__ import annotations

import builtins
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, unquote

from azure.core.exceptions import (
    ClientAuthenticationError,
    DecodeError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ResourceNotModifiedError,
    map_error,
)
from azure.core.pipeline import AsyncPipeline
from azure.core.pipeline.policies import ContentDecodePolicy
from azure.core.rest import HttpRequest

__all__ = ["ListedBlob", "LeanListing", "lean_listing", "parse_page"]

logger = logging.getLogger(__name__)

# What the SDK's generated list_blob_flat_segment maps before its storage error processing.
_ERROR_MAP: dict[int, type[HttpResponseError]] = {
    401: ClientAuthenticationError, 404: ResourceNotFoundError, 409: ResourceExistsError,
    304: ResourceNotModifiedError,
}


@dataclass(frozen=True, slots=True)
class ListedBlob:
    """What the store reads of a listed blob (named as on ``BlobProperties``)."""

    name: str
    etag: str | None
    last_modified: datetime | None
    metadata: dict[str, str | None]


def _rfc1123(text: str | None, seen: dict[str, datetime | None]) -> datetime | None:
    """An RFC 1123 date as an aware UTC datetime, as the SDK's deserializer reads it
    (the offset the string names; listings use GMT). ``seen`` caches by text: a
    listing's dates repeat (one-second resolution)."""
    if not text:
        return None
    if text in seen:
        return seen[text]
    try:
        parsed = parsedate_to_datetime(text)
        when: datetime | None = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(
            timezone.utc)
    except (TypeError, ValueError, IndexError):
        when = None
    seen[text] = when
    return when


def parse_page(root: ET.Element) -> tuple[list[ListedBlob], str | None]:
    """The blobs of one ``EnumerationResults`` page and its ``NextMarker`` (``None`` on
    the last page). Raises ``ValueError`` if ``root`` is not a List Blobs answer."""
    if root.tag != "EnumerationResults":
        raise ValueError(f"expected EnumerationResults, got {root.tag!r}")
    blobs: list[ListedBlob] = []
    dates: dict[str, datetime | None] = {}
    for blob in root.iterfind("Blobs/Blob"):
        name = blob.find("Name")
        if name is None or name.text is None:
            raise ValueError("a listed blob has no Name")
        text = unquote(name.text) if name.get("Encoded") == "true" else name.text
        props = blob.find("Properties")
        etag = props.findtext("Etag") if props is not None else None
        modified = _rfc1123(props.findtext("Last-Modified"), dates) if props is not None else None
        metadata = blob.find("Metadata")
        blobs.append(ListedBlob(text, etag, modified,
                                {} if metadata is None else {child.tag: child.text for child in metadata}))
    marker = root.findtext("NextMarker")
    return blobs, marker or None


class LeanListing:
    """List Blobs through ``client``'s pipeline with :func:`parse_page` (see the module)."""

    def __init__(self, client: Any, pipeline: AsyncPipeline, process_error: Callable[[HttpResponseError], Any]) -> None:
        self._client = client
        self._pipeline = pipeline
        self._process_error = process_error

    async def list(self, prefix: str, *, hook: Callable[[Any], None] | None = None,
                   page_size: int | None = None) -> builtins.list[ListedBlob]:
        """Every blob whose name starts with ``prefix``, with metadata, in name order;
        ``hook`` is called with each page's response, as the SDK's ``raw_response_hook``.

        It is called here, with the answer each page was read from, not passed down the
        pipeline: azure-storage-blob's response hook takes ``raw_response_hook`` off the
        request at the first attempt, and the retry policy runs outside it, so a page
        whose first attempt failed in the transport would reach no hook (no server clock)."""
        blobs: builtins.list[ListedBlob] = []
        marker: str | None = None
        options: dict[str, Any] = {}
        while True:
            page, marker, location, response = await self._page(prefix, marker, page_size, options)
            if hook is not None:
                hook(response)
            blobs.extend(page)
            if marker is None:
                return blobs
            options["use_location"] = location  # later pages from the same host, as the SDK's pager asks

    async def _page(self, prefix: str, marker: str | None, page_size: int | None,
                    options: dict[str, Any]) -> tuple[builtins.list[ListedBlob], str | None, Any, Any]:
        # azure-core joins params as given: quote them, as the SDK's serializer does (a
        # prefix holds the codec's %xx; a marker may hold anything).
        params = {"restype": "container", "comp": "list", "include": "metadata"}
        if prefix:
            params["prefix"] = quote(prefix, safe="")
        if marker:
            params["marker"] = quote(marker, safe="")
        if page_size is not None:
            params["maxresults"] = str(page_size)
        # The client's URL carries a SAS given as a string; the pipeline adds the rest.
        request = HttpRequest("GET", self._client.url, params=params,
                              headers={"x-ms-version": self._client.api_version, "Accept": "application/xml"})
        try:
            response = await self._pipeline.run(request, stream=False, **options)
            http = response.http_response
            if http.status_code != 200:
                map_error(status_code=http.status_code, response=http, error_map=_ERROR_MAP)
                raise HttpResponseError(response=http)
        except HttpResponseError as error:
            self._process_error(error)  # raises the storage error, as the SDK's pager does
            raise
        root = response.context.get(ContentDecodePolicy.CONTEXT_NAME)
        try:
            if not isinstance(root, ET.Element):  # a pipeline without the decode policy
                root = ET.fromstring(http.body())
            blobs, next_marker = parse_page(root)
        except (ValueError, ET.ParseError) as error:
            raise DecodeError(f"cannot read the List Blobs answer: {error}", response=http) from error
        return blobs, next_marker, getattr(http, "location_mode", None), response


def lean_listing(client: Any) -> LeanListing | None:
    """A :class:`LeanListing` on ``client`` (an ``azure.storage.blob.aio.ContainerClient``),
    or ``None`` when this azure-storage-blob lacks a piece it needs."""
    try:
        from azure.storage.blob._shared import response_handlers
    except ImportError:
        response_handlers = None  # type: ignore[assignment]
    process_storage_error = getattr(response_handlers, "process_storage_error", None)
    pipeline = getattr(client, "_pipeline", None)
    api_version = getattr(client, "api_version", None)
    url = getattr(client, "url", None)
    if not callable(process_storage_error) or not isinstance(pipeline, AsyncPipeline) or not isinstance(
            api_version, str) or not isinstance(url, str):
        logger.info("listing blobs with azure-storage-blob's list_blobs: this version has no pipeline or error "
                    "processing the lean listing can use")
        return None
    return LeanListing(client, pipeline, process_storage_error)
