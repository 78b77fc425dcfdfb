"""SparkSessions for the sink: classic (``local[*]``, ``spark://``, ``yarn``, ``k8s://``)
or Spark Connect (``sc://``), and DataFrames from Arrow on either.

The sink only calls the DataFrame API (``createDataFrame``, ``df.write``), never
``_jvm`` or ``sparkContext``, so one code path serves both kinds of session.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from ..errors import ConfigurationError

__all__ = ["spark_session", "create_dataframe", "is_connect", "SESSION_DEFAULTS"]

logger = logging.getLogger(__name__)

SESSION_DEFAULTS: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    # Read partition_id=0 back as the string it was written as, not as an int.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
}
"""Session settings the sink's sessions get (runtime settings: they work over Connect too)."""

_CLASSIC_DEFAULTS: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
}


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_session(master: str | None = None, conf: Mapping[str, str] | None = None,
                  app_name: str = "eventprocessor-spark-sink", *, remote: str | None = None) -> Any:
    """The active SparkSession, or a new one.

    * ``remote="sc://host:15002"``: a Spark Connect session (needs the
      ``pyspark[connect]`` client packages, installed by the ``[spark]`` extra). No JVM
      runs in this process; ``conf`` may hold runtime SQL settings only.
    * ``master``: a classic session on that master (``local[*]``, ``spark://host:7077``,
      ``yarn``, ``k8s://...``). A local master binds the driver to 127.0.0.1.
    * neither: the active session if there is one, else a classic ``local[*]`` one.

    Arrow conversion is on and the UI off unless ``conf`` says otherwise. Nothing is
    downloaded: no ``spark.jars.packages`` is set.

    Example::

        spark = spark_session("spark://head:7077", {"spark.executor.memory": "4g"})
        spark = spark_session(remote="sc://spark-connect.example.com:15002/;token=...")
    """
    from pyspark.sql import SparkSession

    if remote is not None:
        if master is not None:
            raise ConfigurationError("pass either master (a classic session) or remote (Spark Connect), not both")
        if not remote.startswith("sc://"):
            shown = remote.split("/;")[0]  # never the parameters: they may hold a token
            raise ConfigurationError(f"remote must be a Spark Connect URL sc://host:port, got {shown!r}")
        builder = SparkSession.builder.remote(remote)
        for key, value in {**SESSION_DEFAULTS, **dict(conf or {})}.items():
            builder = builder.config(str(key), str(value))
        session = builder.getOrCreate()
        logger.info("Spark Connect session ready (Spark %s)", session.version)
        return session
    active = SparkSession.getActiveSession()
    if active is not None and master is None and not conf:
        return active
    master = master or "local[*]"
    settings: dict[str, str] = {**_CLASSIC_DEFAULTS, **SESSION_DEFAULTS}
    if master.startswith("local"):
        settings.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    settings.update({str(k): str(v) for k, v in (conf or {}).items()})
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    logger.info("Spark session ready (master %s, Spark %s)", master, session.version)
    return session


def create_dataframe(spark: Any, table: pa.Table) -> Any:
    """An Arrow table as a DataFrame without Python rows: Spark 4 (classic and Connect)
    takes Arrow directly; Spark 3.5 goes through pandas with Arrow enabled."""
    major = int(str(spark.version).split(".")[0])
    if major >= 4:
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))
