"""Every Python example of README.md runs and prints what the README says it prints.

New examples are picked up by themselves: each fenced ``python`` block is one example.
How it is checked is set by an HTML comment (invisible on GitHub) on the line before
the block:

* no comment: run as a script in a fresh process (cwd: a scratch directory, the checkout
  on ``PYTHONPATH``); it must exit 0.
* ``<!-- example: run-with-azurite -->``: the same, with
  ``AZURE_STORAGE_CONNECTION_STRING`` set to the test session's Azurite.
* ``<!-- example: compile: why -->``: for an example that needs a real Azure account or
  Spark, or is a fragment of a larger program. It is compiled (top-level ``await``
  allowed) and its imports are run, so every name it imports exists.

A fenced ``text`` block after an example, before the next heading or code block, is the
output the README claims. Each of its lines must be a line of the output, in any order;
a line ``...`` stands for the lines left out.
"""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MODES = ("run", "run-with-azurite", "compile")
_MARKER = re.compile(r"<!--\s*example:\s*([a-z-]+)\s*(?::\s*(.*?))?\s*-->")


@dataclass
class Example:
    line: int  # of the opening fence, 1-based
    heading: str
    code: str
    mode: str
    expected: Optional[List[str]] = None

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-") or "top"
        return f"{slug}-line{self.line}"


def examples(text: str) -> List[Example]:
    """The python examples of a README, each with its mode and its claimed output."""
    found: List[Example] = []
    heading = ""
    lines = text.splitlines()
    waiting_for_output: Optional[Example] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(```+|~~~+)\s*([\w+-]*)", line)
        if not fence:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
                waiting_for_output = None
            i += 1
            continue
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), len(lines))
        body = lines[start + 1:end]
        language = fence.group(2).lower()
        if language == "python":
            # The marker is in the HTML comments right above the block (there may be several).
            marker = None
            for j in range(start - 1, -1, -1):
                above = lines[j].strip()
                if not above:
                    continue
                if not above.startswith("<!--"):
                    break
                marker = marker or _MARKER.search(above)
            example = Example(start + 1, heading, "\n".join(body) + "\n", marker.group(1) if marker else "run")
            found.append(example)
            waiting_for_output = example
        elif language == "text" and waiting_for_output is not None:
            waiting_for_output.expected = [row.rstrip() for row in body if row.strip()]
            waiting_for_output = None
        else:
            waiting_for_output = None
        i = end + 1
    return found


EXAMPLES = examples(README.read_text(encoding="utf-8"))


def _params() -> list:
    return [pytest.param(example, id=example.name,
                         marks=[pytest.mark.azurite] if example.mode == "run-with-azurite" else [])
            for example in EXAMPLES]


def _environment(**extra: str) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def assert_claimed_output(expected: List[str], output: str) -> None:
    have = Counter(line.rstrip() for line in output.splitlines())
    want = Counter(line for line in expected if line.strip() != "...")
    missing = want - have
    assert not missing, f"the README claims lines the example did not print: {sorted(missing.elements())}\n" \
                        f"it printed:\n{output}"


@pytest.mark.parametrize("example", _params())
def test_readme_example(example: Example, tmp_path, request):
    assert example.mode in MODES, f"README line {example.line}: unknown example mode {example.mode!r}; use {MODES}"
    if example.mode == "compile":
        tree = compile(example.code, f"README.md:{example.line}", "exec",
                       flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        code = "\n".join(ast.unparse(node) for node in imports)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path, env=_environment())
        assert out.returncode == 0, f"README line {example.line}: its imports fail:\n{out.stderr}"
        return
    env = _environment()
    if example.mode == "run-with-azurite":
        env["AZURE_STORAGE_CONNECTION_STRING"] = request.getfixturevalue("azurite").connection_string
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                         env=env)
    assert out.returncode == 0, f"README line {example.line} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    if example.expected is not None:
        assert_claimed_output(example.expected, out.stdout)


def test_the_readme_has_examples_and_the_use_example_claims_its_output():
    assert EXAMPLES, "no ```python block found in README.md"
    use = [e for e in EXAMPLES if e.heading == "Use"]
    assert use and use[0].mode == "run" and use[0].expected, "the Use example must run and show its output"


def test_the_claimed_output_check_catches_a_missing_line():
    claimed = ["got partition 2", "...", "received 20 events"]
    assert_claimed_output(claimed, "got partition 2\n2 0 event 0\nreceived 20 events\n")
    with pytest.raises(AssertionError, match="received 20 events"):
        assert_claimed_output(claimed, "got partition 2\nreceived 7 events\n")
