"""The API reference as mkdocstrings renders it (griffe, the docstrings parsed in the
Sphinx style mkdocs.yml names, through the same extensions): no reST literal-block marker
shown as text (``Example::`` rendered literally 42 times), and every parameter of
``EventProcessor`` described in a parameter section."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("eventprocessor", "eventprocessor.sources", "eventprocessor.stores", "eventprocessor.spark",
         "eventprocessor.testing")


@pytest.fixture(scope="module")
def package():
    extensions = re.findall(r"^\s+- (docs/[\w/]+\.py:\w+)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert extensions, "mkdocs.yml names the griffe extensions of the reference"
    return griffe.load("eventprocessor", search_paths=[str(ROOT)],
                       extensions=griffe.load_extensions(*extensions), docstring_parser="sphinx")


def _documented(obj, seen: set, path: str = ""):
    """Every public object the reference shows under ``obj``, with its docstring."""
    try:
        target = obj.final_target if obj.is_alias else obj
    except Exception:  # an alias to something outside the package
        return
    if id(target) in seen:
        return
    seen.add(id(target))
    if target.docstring is not None:
        yield path or target.path, target
    if target.kind.value not in ("module", "class"):
        return
    for name, member in target.members.items():
        if name.startswith("_") and name != "__init__":
            continue
        if member.is_alias and not member.path.startswith("eventprocessor"):
            continue
        yield from _documented(member, seen, f"{path or target.path}.{name}")


def test_no_rest_literal_block_marker_is_rendered_as_text(package):
    shown = []
    seen: set = set()
    for page in PAGES:
        module = package[page.removeprefix("eventprocessor.")] if page != "eventprocessor" else package
        for where, obj in _documented(module, seen):
            for section in obj.docstring.parse("sphinx"):
                if section.kind.value == "text" and re.search(r"\S::\s*$", section.value, re.M):
                    shown.append(where)
    assert not shown, f"{len(shown)} docstrings show a literal '::': {shown[:10]}"


def test_every_event_processor_parameter_is_described(package):
    from eventprocessor import EventProcessor

    processor = package["EventProcessor"].final_target
    sections = [*processor.docstring.parse("sphinx"), *processor["__init__"].docstring.parse("sphinx")]
    described = {parameter.name: parameter.description for section in sections
                 if section.kind.value == "parameters" for parameter in section.value}
    wanted = [name for name in inspect.signature(EventProcessor.__init__).parameters if name != "self"]
    missing = [name for name in wanted if not described.get(name, "").strip()]
    assert not missing, f"EventProcessor parameters without a description: {missing}"
    assert not set(described) - set(wanted), set(described) - set(wanted)
