"""A griffe extension for the API reference: the docstrings' reST as Markdown.

The docstrings are written for ``help()`` and Sphinx alike (``:class:`EventProcessor```,
``:meth:`~EventProcessor.stop```, ``Example::`` before an indented block). MkDocs renders
Markdown, where a role would show as literal text, so each role becomes a code span that
links to the object when the reference documents it (an *optional* cross-reference: a
private target stays plain code instead of failing the strict build); and a paragraph
ending in ``::`` ends in ``:`` with its indented block fenced as code (Python when it
compiles as Python, else text), as Sphinx shows it.
"""
from __future__ import annotations

import ast
import html
import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([^`<>]+?)`")


def _resolve(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as seen from ``obj``, or ``target`` when unknown."""
    head, _, rest = target.partition(".")
    for scope in (obj, obj.parent):
        if scope is None:
            continue
        try:
            resolved = scope.resolve(head)
        except Exception:  # griffe raises NameResolutionError, or a lookup of an alias fails
            continue
        return f"{resolved}.{rest}" if rest else resolved
    return target


_LITERAL = re.compile(r"^(\s*)(\S.*?)\s*::\s*$")


def _language(code: str) -> str:
    try:
        compile(code, "<docstring>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return "text"
    return "python"


def literal_blocks(text: str) -> str:
    """reST literal blocks (a paragraph ending ``::``, then an indented block) as fenced code."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        found = _LITERAL.match(lines[i])
        if found is None or found.group(2).startswith(".."):
            out.append(lines[i])
            i += 1
            continue
        indent = len(found.group(1))
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        block = textwrap.dedent("\n".join(lines[i + 1:end])).strip("\n")
        if not block:
            out.append(lines[i])
            i += 1
            continue
        pad = found.group(1)
        out += [f"{pad}{found.group(2)}:", "", f"{pad}```{_language(block)}",
                *[f"{pad}{line}" if line else "" for line in block.split("\n")], f"{pad}```", ""]
        i = end
    return "\n".join(out).rstrip("\n") + ("\n" if text.endswith("\n") else "")


def rewrite(text: str, obj: griffe.Object) -> str:
    def link(match: re.Match) -> str:
        short, target = match.group(1) == "~", match.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        identifier = html.escape(_resolve(obj, target), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'

    return _ROLE.sub(link, literal_blocks(text))


class RestRoles(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        seen: set = set()

        def visit(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, obj)
            for member in obj.members.values():
                if not member.is_alias:
                    visit(member)  # type: ignore[arg-type]

        visit(pkg)
