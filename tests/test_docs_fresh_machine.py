"""The docs on a fresh machine, checked cheaply: what the walk of every page
(``tests/test_getting_started.py``) finds by running them, read from the pages here
without services, one row of the second hour each, so that a page that goes wrong again
says which row at once."""
from __future__ import annotations

import asyncio
import re
import shlex

import pytest

from tests import docs_pages

SHELL = ("bash", "sh", "shell", "console")


def _run_blocks() -> list[tuple[str, docs_pages.Block, list[str]]]:
    """(page, block, commands) of every ``shell: run`` block, in the reader's order."""
    from tests.test_getting_started import _commands, _without_comment

    found = []
    for page in [docs_pages.README, *docs_pages.nav()]:
        name = docs_pages.name(page)
        for block in docs_pages.fenced_blocks(docs_pages.text(page), name):
            if block.language in SHELL and block.marker("shell") == "run":
                found.append((name, block, [_without_comment(command) for command in _commands(block.body)]))
    return found


def test_the_quick_start_makes_and_activates_a_venv_before_anything_is_installed():
    """On Debian's system Python, the README's ``pip install -e .`` failed with
    ``externally-managed-environment``: there was no venv step."""
    blocks = _run_blocks()
    page, quick_start, commands = blocks[0]
    assert page == "README.md" and quick_start.marker("getting-started") == "quick-start", (page, quick_start.where)
    first = commands[0].split("&&")
    assert re.fullmatch(r"python3 -m venv (\S+)", first[0].strip()), commands[0]
    venv = first[0].split()[-1]
    assert [part.strip() for part in first[1:]] == [f". {venv}/bin/activate"], commands[0]
    installs = [(block.where, command) for _, block, commands in blocks for command in commands
                if re.search(r"(^|&&\s*)pip install", command)]
    assert installs and installs[0][0] == quick_start.where and "venv" not in installs[0][1], installs


def _exported(name: str, before: tuple[str, int]) -> str | None:
    """The value of ``name`` a reader has exported when they reach line ``before`` of a
    page, going through the pages in order."""
    value = None
    order = [docs_pages.name(page) for page in [docs_pages.README, *docs_pages.nav()]]
    for page, block, commands in _run_blocks():
        if (order.index(page), block.line) >= (order.index(before[0]), before[1]):
            break
        for command in commands:
            words = shlex.split(command)
            if words[:1] == ["export"] and words[1].startswith(f"{name}="):
                value = words[1].split("=", 1)[1]
    return value


def test_the_migration_guide_runs_its_program_with_a_storage_string_azure_eventhub_s_store_takes():
    """docs/howto/migrating.md with ``STORAGE_CONNECTION_STRING='UseDevelopmentStorage=true'``
    as docs/howto/eventhubs.md exports it: both programs crashed in azure-eventhub's own
    store (``KeyError: 'ACCOUNTNAME'``), and the guide never said why."""
    aio = pytest.importorskip("azure.eventhub.extensions.checkpointstoreblobaio")
    runs = [(block, command) for page, block, commands in _run_blocks() if page == "docs/howto/migrating.md"
            for command in commands if command.endswith("python consumer.py")]
    assert len(runs) == 2, "the guide runs its program under azure-eventhub's client, then under the drop-in"
    block, _ = runs[0]
    value = _exported("STORAGE_CONNECTION_STRING", ("docs/howto/migrating.md", block.line + 1))
    assert value is not None

    async def build() -> None:
        store = aio.BlobCheckpointStore.from_connection_string(value, container_name="checkpoints")
        await store.close()

    asyncio.run(build())  # raises KeyError: 'ACCOUNTNAME' for UseDevelopmentStorage=true
    assert "UseDevelopmentStorage=true" in block.body or "UseDevelopmentStorage=true" in docs_pages.text(
        docs_pages.DOCS / "howto" / "migrating.md"), "the guide says why it does not use the short form"


@pytest.mark.parametrize("page, program", [
    ("docs/howto/eventhubs.md", "eventhubs_example.py"),
    ("docs/howto/spark-streaming.md", "spark_streaming.py"),
])
def test_a_how_to_page_puts_its_events_in_the_hub_with_a_command_it_shows(page, program):
    """docs/howto/eventhubs.md and spark-streaming.md on a fresh emulator: the example
    printed nothing for 20 s (an empty hub, no way to send given); the streaming page
    showed output for readings the reader could not produce."""
    runs = [(block, commands) for name, block, commands in _run_blocks() if name == page
            and any(command.endswith(f"python {program}") for command in commands)]
    assert runs, f"{page} runs {program} in a block of its own"
    block, commands = runs[0]
    at = next(i for i, command in enumerate(commands) if command.endswith(f"python {program}"))
    assert any(command.startswith("eventprocessor send ") for command in commands[:at]), commands
    assert block.output, f"{page}: what {program} prints is shown after the block that runs it"
