"""Every example and every command of the docs works as written.

The docs are README.md, CHANGELOG.md and every page of docs/ (``tests/docs_pages.py``).
New blocks are picked up by themselves. How each is checked is set by an HTML comment
(invisible on GitHub and on the site) right above the block.

The docs walk (``tests/test_getting_started.py``) runs every page top to bottom from a
clean clone, each block as its marker says. Here every block is held to having a marker,
and checked the cheap way, without services.

Python blocks (each is one example):

* no comment (or ``<!-- example: run -->``): the walk runs it as a script; here it is
  compiled and its imports run.
* ``<!-- example: compile: why -->``: a fragment of a larger program, or a program
  that needs a real Azure account, or one the page has the reader save
  (``<!-- file: NAME -->``) and a shell block of the page runs. It is compiled (top-level
  ``await`` allowed) and its imports are run, so every name it imports exists.

A fenced ``text`` block after an example, before the next heading or code block, is the
output the page claims. Each of its lines must be a line of the output, in any order;
a line ``...`` stands for the lines left out. (The walk checks it, for shell blocks too.)

Shell blocks (``bash``, ``sh``, ``shell``, ``console``) must say how they are checked;
a block without a marker fails:

* ``<!-- shell: run -->``: the walk runs it, each line as typed, in its shell (with what
  earlier pages set); here each ``eventprocessor`` line is parsed by the command line's
  own click parser (a renamed or removed option fails at once).
* ``<!-- shell: walked: tests/FILE.py why -->``: another test runs it exactly as
  written (the new-user paths, ``.ci/run``): that file must name the block
  (``<!-- getting-started: NAME -->``) or contain each of its commands verbatim.
* ``<!-- shell: check: why -->``: it needs a real Azure account (the reason says so), so
  each command is checked without running it: an ``eventprocessor`` line is
  parsed by the command line's own click parser (a renamed or removed option fails), a
  Python program or module must exist and list every option the line passes in its
  ``--help``, a ``pip install`` must name extras that setup.cfg has (the install hints
  themselves are ``tests/test_install_hints.py``'s), and a ``pytest`` line must name a
  test file that reads the variables the line sets. A command the check does not know is
  a failure: run it, walk it, or teach this file.

Every fenced block has a language (``text`` for plain text), so that no shell block
hides unmarked.
"""
from __future__ import annotations

import ast
import configparser
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

from tests import docs_pages

ROOT = docs_pages.ROOT
MODES = ("run", "compile")
SHELL_MODES = ("run", "walked", "check")
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


@dataclass
class Example:
    line: int  # of the opening fence, 1-based
    heading: str
    code: str
    mode: str
    expected: list[str] | None = None
    page: str = "README.md"

    @property
    def name(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-") or "top"
        return f"{slug}-line{self.line}"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class ShellBlock:
    page: str
    line: int
    language: str
    body: str
    mode: str | None
    why: str = ""
    block_name: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Blocks:
    examples: list[Example] = field(default_factory=list)
    shell: list[ShellBlock] = field(default_factory=list)
    unlabeled: list[int] = field(default_factory=list)


def _split(marker: str | None) -> tuple[str | None, str]:
    """``"walked: tests/x.py why"`` -> ``("walked", "tests/x.py why")``."""
    if marker is None:
        return None, ""
    mode, _, why = marker.partition(":")
    return mode.strip(), why.strip()


def blocks(text: str, page: str = "README.md") -> Blocks:
    """The fenced blocks of a page: python examples (with their mode and claimed
    output), shell blocks (with their mode), and the lines of blocks with no language."""
    found = Blocks()
    for block in docs_pages.fenced_blocks(text, page):
        if block.language == "python":
            mode, _ = _split(block.marker("example"))
            found.examples.append(Example(block.line, block.heading, block.body, mode or "run", block.output, page))
        elif block.language in SHELL_LANGUAGES:
            mode, why = _split(block.marker("shell"))
            found.shell.append(ShellBlock(page, block.line, block.language, block.body, mode, why,
                                          block.marker("getting-started")))
        elif not block.language:
            found.unlabeled.append(block.line)
    return found


def examples(text: str, page: str = "README.md") -> list[Example]:
    """The python examples of a page, each with its mode and its claimed output."""
    return blocks(text, page).examples


PAGES = {docs_pages.name(page): blocks(docs_pages.text(page), docs_pages.name(page)) for page in docs_pages.pages()}
EXAMPLES = [example for found in PAGES.values() for example in found.examples]
SHELL = [block for found in PAGES.values() for block in found.shell]


def _params() -> list:
    return [pytest.param(example, id=f"{example.page}-{example.name}") for example in EXAMPLES]


def _environment(**extra: str) -> dict:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": path, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def assert_claimed_output(expected: list[str], output: str) -> None:
    have = Counter(line.rstrip() for line in output.splitlines())
    want = Counter(line for line in expected if line.strip() != "...")
    missing = want - have
    assert not missing, f"the docs claim lines the example did not print: {sorted(missing.elements())}\n" \
                        f"it printed:\n{output}"


# --------------------------------------------------------------------------- python examples


@pytest.mark.parametrize("example", _params())
def test_docs_example(example: Example, tmp_path):
    """Compiled, and its imports run: the walk runs what the marker says runs."""
    assert example.mode in MODES, f"{example.where}: unknown example mode {example.mode!r}; use {MODES}"
    tree = compile(example.code, example.where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    code = "\n".join(ast.unparse(node) for node in imports)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env=_environment())
    assert out.returncode == 0, f"{example.where}: its imports fail:\n{out.stderr}"


def test_the_readme_has_examples_and_the_first_example_claims_its_output():
    readme = PAGES["README.md"].examples
    assert readme, "no ```python block found in README.md"
    first = [e for e in readme if e.heading == "A first example"]
    assert first and first[0].mode == "run" and first[0].expected, "the first example must run and show its output"


def test_every_page_of_the_docs_is_read_and_the_site_pages_have_examples():
    assert "docs/getting-started.md" in PAGES and "docs/howto/eventhubs.md" in PAGES
    on_site = {example.page for example in EXAMPLES if example.page.startswith("docs/")}
    assert {"docs/concepts/stateful.md", "docs/howto/operating.md", "docs/howto/migrating.md"} <= on_site, on_site


def test_the_claimed_output_check_catches_a_missing_line():
    claimed = ["got partition 2", "...", "received 20 events"]
    assert_claimed_output(claimed, "got partition 2\n2 0 event 0\nreceived 20 events\n")
    with pytest.raises(AssertionError, match="received 20 events"):
        assert_claimed_output(claimed, "got partition 2\nreceived 7 events\n")


# --------------------------------------------------------------------------- shell blocks


def _commands(body: str) -> list[str]:
    """The commands of a shell block: comments dropped, continued lines joined."""
    joined, pending = [], ""
    for raw in body.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a comment: "#" at the start of a word
        if line:
            joined.append(line)
    return joined


def _extras() -> set:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options.extras_require"])


def _check_click(argv: list[str], where: str) -> None:
    """Parse ``eventprocessor ARGV`` with the command line's own parser, down to the
    subcommand, without running anything."""
    from eventprocessor.cli import main

    command: click.Command = main
    try:
        ctx = main.make_context("eventprocessor", list(argv))
    except click.exceptions.Exit:  # --help, --version
        return
    except click.UsageError as error:
        raise AssertionError(f"{where}: eventprocessor {' '.join(argv)}: {error.format_message()}") from error
    args = _rest(ctx)
    while isinstance(command, click.Group) and args:
        try:
            name, sub, args = command.resolve_command(ctx, args)
        except click.UsageError as error:
            raise AssertionError(f"{where}: eventprocessor has no command {args[0]!r}") from error
        assert sub is not None, f"{where}: eventprocessor has no command {name!r}"
        command = sub
        try:
            ctx = sub.make_context(name or "", list(args), parent=ctx)
        except click.exceptions.Exit:
            return
        except click.BadParameter as error:
            # A file the reader brings or saves (--config Config.json) does not exist here.
            if isinstance(error.param and error.param.type, click.Path) and "does not exist" in str(error):
                return
            if isinstance(error.param and error.param.type, click.File) and "No such file" in str(error):
                return
            raise AssertionError(f"{where}: eventprocessor {' '.join(argv)}: {error.format_message()}") from error
        except click.UsageError as error:
            raise AssertionError(f"{where}: eventprocessor {' '.join(argv)}: {error.format_message()}") from error
        args = _rest(ctx) if isinstance(sub, click.Group) else []


def _rest(ctx: click.Context) -> list[str]:
    """What a group left for its subcommand (click 8.2 renamed ``protected_args``)."""
    protected = getattr(ctx, "_protected_args", None)
    if protected is None:
        protected = ctx.protected_args
    return list(protected) + list(ctx.args)


def _check_program(argv: list[str], where: str) -> None:
    """``python script.py OPTIONS`` or ``python -m module OPTIONS``: the program exists,
    and its ``--help`` lists every option the line passes."""
    if argv[0] == "-m":
        module = argv[1]
        import importlib.util

        assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
        target, options = ["-m", module], argv[2:]
    else:
        script = ROOT / argv[0]
        assert script.is_file(), f"{where}: {argv[0]} does not exist in the checkout"
        target, options = [str(script)], argv[1:]
    if target == ["-m", "eventprocessor.cli"]:
        _check_click(options, where)
        return
    out = subprocess.run([sys.executable, *target, "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=_environment())
    assert out.returncode == 0, f"{where}: {' '.join(target)} --help failed:\n{out.stderr[-2000:]}"
    for option in options:
        flag = option.split("=", 1)[0]
        if flag.startswith("--"):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out.stdout), \
                f"{where}: {' '.join(target)} has no option {flag} (its --help:\n{out.stdout})"


def _check_command(command: str, where: str) -> None:
    words = shlex.split(command)
    if words and words[-1] == "&":
        words = words[:-1]
    if words and words[0] == "export":
        for assignment in words[1:]:
            assert re.match(r"^[A-Z_][A-Z0-9_]*=", assignment), f"{where}: not an assignment: {assignment}"
        return
    settings: dict[str, str] = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, value = words.pop(0).split("=", 1)
        settings[key] = value
    if "|" in words:  # check what feeds the pipe; jq only reads what it is given
        words, rest = words[:words.index("|")], words[words.index("|") + 1:]
        assert rest and rest[0] == "jq", f"{where}: a pipe into {rest[:1]}, which this check does not know"
    words = [word for word in words if word != "..."]  # the reader's own arguments, left out
    assert words, f"{where}: an empty command"
    program, args = words[0], words[1:]
    if program == "eventprocessor":
        _check_click(args, where)
    elif program == "python":
        _check_program(args, where)
    elif program == "pip" and args[:1] == ["install"]:
        for spec in args[1:]:
            extras = re.search(r"\[([\w,-]+)\]$", spec)
            if extras and spec.split("[")[0] in (".", str(ROOT)):
                missing = set(extras.group(1).split(",")) - _extras()
                assert not missing, f"{where}: setup.cfg has no extra {sorted(missing)}"
    elif program == "pytest":
        files = [arg for arg in args if arg.endswith(".py")]
        assert files and all((ROOT / name).is_file() for name in files), f"{where}: {command}"
        for key in settings:
            assert any(key in (ROOT / name).read_text() for name in files), f"{where}: {files} never read {key}"
    elif program == "mkdocs":
        assert args[:1] in (["build"], ["serve"]) and (ROOT / "mkdocs.yml").is_file(), f"{where}: {command}"
    elif program == "npm":
        assert args == ["ci"] and (ROOT / "package-lock.json").is_file(), f"{where}: {command}"
    else:
        raise AssertionError(f"{where}: `{command}` is a command this check does not know: run it, walk it, "
                             "or teach tests/test_readme_examples.py")


def _shell_params() -> list:
    return [pytest.param(block, id=f"{block.page}-line{block.line}") for block in SHELL]


@pytest.mark.parametrize("block", _shell_params())
def test_docs_shell_block(block: ShellBlock, tmp_path):
    assert block.mode in SHELL_MODES, \
        f"{block.where}: a shell block needs a marker on the line above it, " \
        f"<!-- shell: run -->, <!-- shell: walked: tests/FILE.py why --> or <!-- shell: check: why --> " \
        f"(found {block.mode!r})"
    commands = _commands(block.body)
    assert commands, f"{block.where}: an empty shell block"
    if block.mode == "walked":
        walker = block.why.split()[0] if block.why else ""
        path = ROOT / walker
        assert walker and path.is_file(), f"{block.where}: `walked:` must name the file that runs it, not {walker!r}"
        source = path.read_text(encoding="utf-8")
        if block.block_name is not None and re.search(rf"[\"']{re.escape(block.block_name)}[\"']", source):
            return
        absent = [command for command in commands if command not in source]
        assert not absent, f"{block.where}: {walker} neither names this block nor runs {absent}"
    elif block.mode == "check":
        assert "Azure" in block.why, f"{block.where}: only a block that needs a real Azure account is left to " \
                                     f"checking (and its marker says so); the walk runs the others: {block.why!r}"
        for command in commands:
            _check_command(command, block.where)
    else:
        for command in commands:
            words = shlex.split(re.sub(r"\s+#.*$", "", command).rstrip("& "))
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words.pop(0)
            if words[:1] == ["eventprocessor"]:
                _check_click(words[1:], block.where)


def test_every_fenced_block_names_its_language():
    unlabeled = [f"{page}:{line}" for page, found in PAGES.items() for line in found.unlabeled]
    assert not unlabeled, f"fenced blocks without a language (```text for plain text): {unlabeled}"


def test_an_unmarked_shell_block_fails():
    found = blocks("# Page\n\n```bash\neventprocessor demo\n```\n", "page.md").shell
    assert [block.mode for block in found] == [None]
    with pytest.raises(AssertionError, match="needs a marker"):
        test_docs_shell_block(found[0], Path("."))


@pytest.mark.parametrize("command, complaint", [
    ("eventprocessor status --containr checkpoints", "No such option"),
    ("eventprocessor demo --timeout -5", "--timeout"),
    ("eventprocessor stats", "no command"),
    ("pip install -e '.[blobs]'", "no extra"),
    ("python -m eventprocessor.emulators.spark_cluster --no-such-flag", "no option --no-such-flag"),
    ("python samples/no_such_sample.py", "does not exist"),
    ("curl http://127.0.0.1", "does not know"),
])
def test_the_command_check_catches_what_a_reader_would_trip_on(command, complaint):
    with pytest.raises(AssertionError, match=re.escape(complaint)):
        _check_command(command, "page.md:1")


# --------------------------------------------------------------------------- the landing page


def test_the_readme_is_a_landing_page_whose_links_resolve():
    """README.md stays a few hundred lines with a table of contents; every relative
    link in it (into docs/, to CHANGELOG.md) names a file of the checkout, so it works
    on GitHub. The site's own links are checked by ``mkdocs build --strict``."""
    text = docs_pages.text(docs_pages.README)
    assert len(text.splitlines()) <= 300, "README.md is a landing page: move the detail into docs/"
    headings = re.findall(r"^## (.+)$", text, re.M)
    contents = re.findall(r"^- \[(.+?)\]\(#([\w-]+)\)$", text, re.M)
    assert [title for title, _ in contents] == headings, "the table of contents lists every section, in order"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[\w-]*)?\)", text)
    relative = [link for link in links if not re.match(r"^[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in relative)
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


_CHECKOUT_PATH = re.compile(r"`((?:\.ci|tests|samples|benchmarks|docs|harness|eventprocessor"
                            r")/[\w./-]*)`")


def checkout_paths_missing(page: str, source: str) -> list[str]:
    """The files and folders of the checkout that ``source`` names in inline code
    (`tests/test_x.py`, `benchmarks/results/`) and that do not exist. A path with a
    placeholder (`benchmarks/NAME.py`, `tests/FILE.py`) is the reader's to fill in."""
    named = {match.group(1) for match in _CHECKOUT_PATH.finditer(source)}
    return sorted(f"{page}: {path}" for path in named
                  if not re.search(r"/(NAME|FILE)\b", path) and not (ROOT / path).exists())


def test_every_file_the_docs_name_exists():
    """README.md and docs/ say what is true now, so a test, sample or benchmark they
    name must be in the checkout (CHANGELOG.md may name what is gone)."""
    missing = [path for page in docs_pages.pages() if page.name != "CHANGELOG.md"
               for path in checkout_paths_missing(docs_pages.name(page), docs_pages.text(page))]
    assert not missing, f"the docs name files that do not exist: {missing}"
    assert checkout_paths_missing("page.md", "run by `tests/test_docs.py`, see `benchmarks/NAME.py`, "
                                  "`benchmarks/RESULT.md`") == ["page.md: benchmarks/RESULT.md",
                                                                "page.md: tests/test_docs.py"]


def test_ci_retakes_the_screenshot_and_builds_the_site_with_warnings_as_errors():
    """tox (which ``.ci/run`` runs) installs the ``[docs]`` extra, retakes the status
    screenshot and then runs ``mkdocs build --strict``; the extra has what mkdocs.yml
    uses (the theme, mkdocstrings' Python handler) and what the screenshot needs (pyte)."""
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    env = tox["testenv"]
    assert "docs" in env["extras"].split()
    commands = [line.strip() for line in env["commands"].splitlines() if line.strip()]
    build = next(i for i, line in enumerate(commands) if line.startswith("mkdocs build"))
    assert "--strict" in commands[build].split()
    assert any(line.startswith("python docs/status_screenshot.py") for line in commands[:build])
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    docs_extra = {re.split(r"[<>=!~ ;]", line.strip())[0]
                  for line in cfg["options.extras_require"]["docs"].splitlines() if line.strip()}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings[python]", "pyte"} <= docs_extra, docs_extra
