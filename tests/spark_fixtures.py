"""Session fixtures for the Spark cluster tests (imported by ``tests/conftest.py``).

``spark_cluster``: one standalone master, one worker and one Spark Connect server
(:mod:`eventprocessor.emulators.spark_cluster`) for the whole session, started the first time a test
asks for it and stopped (by process group) at the end of the session, whatever the
tests did. Missing Java or Spark fails in CI and skips elsewhere.

``connect_spark``: a Spark Connect session on that cluster, for the test process. It is
made with ``pyspark.sql.connect``'s own builder, which does not mark the whole process
as a Spark Connect one (``SparkSession.builder.remote`` sets
``SPARK_CONNECT_MODE_ENABLED``), so the classic local session of ``test_spark_sink.py``
keeps working in the same pytest process.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from eventprocessor.emulators.spark_cluster import SparkCluster


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    from eventprocessor.emulators.spark_cluster import SparkClusterUnavailable, start_spark_cluster
    from tests.conftest import unavailable

    try:
        cluster = start_spark_cluster()
    except SparkClusterUnavailable as error:
        unavailable(f"the Spark cluster could not start: {error}")
        raise  # unreachable
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def connect_spark(spark_cluster: SparkCluster) -> Iterator[Any]:
    from tests.conftest import unavailable

    try:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession
    except ImportError as error:
        unavailable(f"the Spark Connect client packages are missing ({error}); pip install -e '.[spark]'")
        raise  # unreachable
    from eventprocessor.spark.session import SESSION_DEFAULTS

    assert spark_cluster.connect_url is not None
    session = RemoteSparkSession.builder.remote(spark_cluster.connect_url).getOrCreate()
    for key, value in SESSION_DEFAULTS.items():
        session.conf.set(key, value)
    try:
        yield session
    finally:
        session.stop()
