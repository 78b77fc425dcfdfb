"""A griffe extension for the API reference: the docstrings' reST roles as links.

The docstrings are written for ``help()`` and Sphinx alike (``:class:`EventProcessor```,
``:meth:`~EventProcessor.stop```). MkDocs renders Markdown, where a role would show as
literal text, so each role becomes a code span that links to the object when the
reference documents it (an *optional* cross-reference: a private target stays plain
code instead of failing the strict build).
"""
from __future__ import annotations

import html
import re
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


def rewrite(text: str, obj: griffe.Object) -> str:
    def link(match: re.Match) -> str:
        short, target = match.group(1) == "~", match.group(2).strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        identifier = html.escape(_resolve(obj, target), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'

    return _ROLE.sub(link, text)


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
