"""The one change that migrates a program from azure-eventhub's consumer to the drop-in:
``EventHubConsumerClient`` imported from ``eventprocessor`` instead of
``azure.eventhub.aio``, whatever form the import has (one line, several names,
parenthesised over several lines)."""
from __future__ import annotations

import ast

__all__ = ["migrated"]

_NAME = "EventHubConsumerClient"


def migrated(text: str) -> str:
    """``text`` with ``EventHubConsumerClient`` imported from eventprocessor instead of
    azure.eventhub.aio (the import's other names stay where they were). Refuses a
    program where that import is not exactly one statement."""
    statements = [node for node in ast.parse(text).body if isinstance(node, ast.ImportFrom)
                  and node.module == "azure.eventhub.aio" and any(alias.name == _NAME for alias in node.names)]
    assert len(statements) == 1, f"expected one import of {_NAME} from azure.eventhub.aio, found {len(statements)}"
    (statement,) = statements
    others = [alias for alias in statement.names if alias.name != _NAME]
    replacement = []
    if others:
        names = ", ".join(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}" for alias in others)
        replacement.append(f"from azure.eventhub.aio import {names}\n")
    replacement.append(f"from eventprocessor import {_NAME}\n")
    lines = text.splitlines(keepends=True)
    assert statement.end_lineno is not None
    return "".join(lines[:statement.lineno - 1] + replacement + lines[statement.end_lineno:])
