"""Microsoft's tests under ``livetest/`` are not collected by this suite directly: they
run in a pytest session of their own against the session's emulator, once per client,
from ``tests/test_azure_eventhub_tests.py`` (see ``README.md`` here)."""

collect_ignore = ["livetest", "emulator_conftest.py"]
