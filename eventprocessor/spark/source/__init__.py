"""Event Hubs as a Spark Structured Streaming source: ``spark.readStream.format("eventhubs")``.

Pure Python on PySpark 4.2 or later (classic sessions and Spark Connect), with the
Microsoft connector's options and columns. The modules, from the outside in:

* :mod:`.datasource`: the PySpark classes (``EventHubsDataSource``, its stream and
  batch readers); the only module that imports pyspark;
* :mod:`.options`: the options, checked once at ``load()``;
* :mod:`.offsets`: offsets and the pure planning (rate limits, new partitions,
  ``Trigger.AvailableNow``, split ranges);
* :mod:`.hub`: the driver's calls to the hub (partition properties, starting positions);
* :mod:`.executor`: the executors' reads of a range, over the receivers a worker keeps;
* :mod:`.rows`: events as the connector's Arrow columns;
* :mod:`.checkpoints`: the query's part in a consumer group's checkpoint store. It
  builds the Blob or Table store the options name, so this package sits above
  :mod:`stores` (the packaging tests hold it to that).

Example::

    from eventprocessor.spark import EventHubsDataSource

    spark.dataSource.register(EventHubsDataSource)
    df = spark.readStream.format("eventhubs").option("eventhubs.connectionString", conn).load()
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .datasource import EventHubsDataSource

__all__ = ["EventHubsDataSource"]


def __getattr__(name: str) -> Any:
    # pyspark is imported only when the data source itself is asked for.
    if name == "EventHubsDataSource":
        from .datasource import EventHubsDataSource

        return EventHubsDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
