"""The documentation as the tests read it: README.md, CHANGELOG.md and every page of docs/.

The tests that check what the docs say (the examples run, the commands work, the facts
agree with the code) find the text here, wherever the docs keep it, so a section can
move between pages without its test losing track of it. A page's source is read as
written: a ``--8<--`` include (pymdownx.snippets) is checked where it is written, in
the file it includes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def nav() -> list[Path]:
    """The site's pages in the order of mkdocs.yml's ``nav`` (a reader's order)."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    section = text[text.index("\nnav:"):]
    section = section[:re.search(r"\n\S", section[1:]).start() + 1]  # up to the next top-level key
    return [DOCS / name for name in re.findall(r":\s*([\w./-]+\.md)\s*$", section, re.M)]


def pages() -> list[Path]:
    """Every Markdown page a reader is given: README.md first, then the site in nav
    order, then any page of docs/ the nav does not list, then CHANGELOG.md."""
    ordered = [README] + nav()
    ordered += sorted(set(DOCS.rglob("*.md")) - set(ordered))
    return ordered + [ROOT / "CHANGELOG.md"]


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def everything() -> str:
    """All pages as one text, for facts that may sit on any of them."""
    return "\n\n".join(text(page) for page in pages())


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def find(pattern: str, what: str, flags: int = re.S) -> tuple[Path, re.Match]:
    """The one page where ``pattern`` matches, and the match; fails naming ``what``."""
    found = [(page, match) for page in pages() if (match := re.search(pattern, text(page), flags))]
    assert found, f"no page of the docs has {what}"
    assert len(found) == 1, f"{what} is on several pages: {[name(page) for page, _ in found]}"
    return found[0]


def getting_started_block(block: str) -> list[str]:
    """The lines of the fenced block marked ``<!-- getting-started: block -->``."""
    _, match = find(rf"<!-- getting-started: {re.escape(block)} -->\s*(?:<!--.*?-->\s*)*```bash\n(.*?)```",
                    f"a getting-started block {block!r}")
    return [line for line in match.group(1).splitlines() if line.strip()]


def eventhubs_example() -> str:
    """The program between ``<!-- BEGIN eventhubs-example -->`` and its END."""
    _, match = find(r"<!-- BEGIN eventhubs-example -->\s*```python\n(.*?)```\s*<!-- END eventhubs-example -->",
                    "the eventhubs-example block")
    return match.group(1)


@dataclass
class Block:
    """A fenced block of a page, with the HTML comments right above it (its markers,
    ``<!-- name: value -->``) and, for a block of code, the ``text`` block that follows
    it before the next heading or block: the output the page claims for it."""

    page: str
    line: int  # of the opening fence, 1-based
    language: str
    body: str
    heading: str
    markers: dict[str, str] = field(default_factory=dict)
    output: list[str] | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def marker(self, name: str) -> str | None:
        return self.markers.get(name)


_COMMENT = re.compile(r"<!--\s*([a-z-]+)\s*:\s*(.*?)\s*-->")


def fenced_blocks(source: str, page: str) -> list[Block]:
    """Every fenced block of ``source`` in order, with its markers and claimed output."""
    found: list[Block] = []
    lines = source.splitlines()
    heading, last_code, i = "", None, 0
    while i < len(lines):
        fence = re.match(r"^(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not fence:
            if lines[i].startswith("#"):
                heading, last_code = lines[i].lstrip("#").strip(), None
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), len(lines))
        markers: dict[str, str] = {}
        for j in range(i - 1, -1, -1):
            above = lines[j].strip()
            if not above:
                continue
            if not above.startswith("<!--"):
                break
            if (match := _COMMENT.match(above)) and match.group(1) not in markers:
                markers[match.group(1)] = match.group(2)
        block = Block(page, i + 1, fence.group(2).lower(), "\n".join(lines[i + 1:end]) + "\n", heading, markers)
        if block.language == "text" and last_code is not None and "file" not in markers:
            last_code.output = [row.rstrip() for row in block.body.splitlines() if row.strip()]
            last_code = None
        else:
            found.append(block)
            last_code = block if block.language not in ("text", "") and "file" not in markers else None
        i = end + 1
    return found


def headings(source: str) -> list[tuple[int, int, str]]:
    """(offset, level, title) of every Markdown heading outside fenced code."""
    found, offset, fence = [], 0, None
    for line in source.splitlines(keepends=True):
        opening = re.match(r"(```+|~~~+)", line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None and line.startswith(fence):
            fence = None
        elif fence is None and (heading := re.match(r"(#+) (.*?)\s*$", line)):
            found.append((offset, len(heading.group(1)), heading.group(2)))
        offset += len(line)
    return found


def section(page: str, heading: str) -> str:
    """The text of ``page`` (relative to the checkout) under ``heading``, up to the next
    heading of the same or a higher level."""
    source = (ROOT / page).read_text(encoding="utf-8")
    marks = headings(source)
    starts = [i for i, (_, _, title) in enumerate(marks) if title == heading]
    assert starts, f"{page} has no heading {heading!r}"
    offset, level, _ = marks[starts[0]]
    end = next((o for o, lvl, _ in marks[starts[0] + 1:] if lvl <= level), len(source))
    return source[offset:end]
