"""``eventprocessor emulator``, then the Spark source with the connection string it
printed: the string had no ``EntityPath``, which the source requires, and its clear
error sat inside Spark's ``AnalysisException`` under a Python traceback. Now the
emulator prints a string per hub (``tests/test_cli_eventhubs.py``), and a string without
``EntityPath`` fails the first analysis with one line that says so and how to fix it."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.eventhubs]


def test_a_connection_string_without_entity_path_is_one_line_naming_the_fix(connect_spark, eventhubs_emulator):
    from eventprocessor.spark import EventHubsDataSource

    connect_spark.dataSource.register(EventHubsDataSource)
    namespace_only = eventhubs_emulator.connection_string  # the namespace's line, as a user might copy it
    df = connect_spark.readStream.format("eventhubs").option("eventhubs.connectionString", namespace_only).load()
    with pytest.raises(Exception) as raised:
        _ = df.schema  # over Spark Connect, load() is lazy: the server analyses here
    text = str(raised.value)
    first = text.strip().splitlines()[0]
    assert "ConfigurationError: the eventhubs source cannot load: eventhubs.connectionString has no EntityPath: " \
           "append ';EntityPath=<event hub name>'" in first, text
    assert "Traceback" not in text and "File " not in text, text
    assert "SAS_KEY_VALUE" not in text
    hub = eventhubs_emulator.fresh_hub(4)
    per_hub = eventhubs_emulator.process.connection_string_for(hub)  # the hub's line
    df = connect_spark.readStream.format("eventhubs").option("eventhubs.connectionString", per_hub).load()
    assert df.schema.names[:2] == ["body", "partition"]
