"""Every page of the docs, walked top to bottom as a new user walks it: one fresh virtual
environment of a clean clone, one shell, one set of services.

In the reader's order (README.md, then the site's pages in the order of mkdocs.yml's
nav), every text read from the clone, each block as its marker says
(``tests/test_readme_examples.py`` holds every block to having one):

* ``shell: run``: each command as typed, in one bash session in the clone
  (``tests/doc_shell.py``), so what a page sets stays set: the README's quick start
  makes and activates ``.venv``, which every later command uses; ``export``s carry on.
  A command ending in ``&`` starts a service the way the page says (Azurite, the Event
  Hubs emulators, the Spark cluster), which the later pages share, and it is stopped
  with SIGTERM at the end. A service the reader already started is not started twice.
* a block marked ``file: NAME`` is saved as NAME in the clone, as the page asks.
* a Python block without a marker (or ``run``) runs; ``compile`` is compiled and its
  imports run, in the venv.
* a ``text`` block after a block is the output it claims: every line of it must be a
  line of the output (``...`` stands for lines left out).
* ``shell: walked`` blocks are run as written by the test they name; ``shell: check``
  blocks need a real Azure account, and say so.

It fails on any traceback, warning or error in any output (services' included), any
service that does not stop cleanly, any process left running (every process carries an
environment marker), and any command that does not do what the docs say.

Offline and reused: ``pip`` reads a wheelhouse (``PIP_NO_INDEX``/``PIP_FIND_LINKS``, so
the commands stay as the docs write them) that ``pip wheel`` fills once per set of
requirements (setup.cfg's, and the packages the pages install), Python and platform, and
keeps for a day in the user's cache directory (``~/.cache/eventprocessor-tests``): a CI
run from a fresh clone builds a fresh test environment, and filling the wheelhouse again
took it 50-90 s at the start of a busy session. After a day it is filled again, so the
walk installs what a new user would get, give or take a day of releases. Needs the docs'
fixed ports free: Azurite's 10000-10002, the emulators' 5672 and 5673, Spark's 7077 and
15002.
"""
from __future__ import annotations

import configparser
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.doc_shell import ShellSession
from tests.docs_pages import Block, fenced_blocks
from tests.test_new_user_paths import MARKER, assert_nothing_left
from tests.test_readme_examples import assert_claimed_output

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSES = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eventprocessor-tests" / "wheels"
FRESH_FOR = 24 * 3600.0  # seconds a wheelhouse is reused
FIXED_PORTS = (10000, 10001, 10002, 5672, 5673, 7077, 15002)
NOISE = re.compile(r"Traceback|WARNING|\bERROR\b|Error:|Unclosed|Task exception")
# Lines no program of this project prints and none can avoid: the JVM's, under Spark 4.
NOT_OURS = re.compile(r"^WARNING: Using incubator modules: jdk\.incubator\.vector$")
TIMEOUTS = {"pip install": 600, "npm ci": 600, "samples/spark_consumer.py": 600, "spark_streaming.py": 600}
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


# --------------------------------------------------------------------------- the pages


def reader_pages(clone: Path) -> list[tuple[str, str]]:
    """(name, text) of README.md and the site's pages, in nav order, from ``clone``."""
    nav = (clone / "mkdocs.yml").read_text(encoding="utf-8")
    nav = nav[nav.index("\nnav:"):]
    names = re.findall(r":\s*([\w./-]+\.md)\s*$", nav[:re.search(r"\n\S", nav[1:]).start() + 1], re.M)
    return [("README.md", (clone / "README.md").read_text(encoding="utf-8"))] + [
        (f"docs/{name}", (clone / "docs" / name).read_text(encoding="utf-8")) for name in names]


def _commands(body: str) -> list[str]:
    """The commands of a shell block as typed: comment lines dropped, continued lines joined."""
    commands, pending = [], ""
    for raw in body.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line, pending = (pending + raw).strip(), ""
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def _without_comment(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command).strip()


# --------------------------------------------------------------------------- the wheelhouse


def _requirements(pages: list[tuple[str, str]]) -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in ("blob", "table", "eventhub", "otel", "spark", "postgres"):
        lines += cfg["options.extras_require"][extra].splitlines()
    build = re.search(r"requires\s*=\s*\[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S)
    assert build, "pyproject.toml names its build requirements"
    lines += re.findall(r'"([^"]+)"', build.group(1))
    for _, text in pages:  # what the pages install besides this project
        for block in fenced_blocks(text, ""):
            for command in _commands(block.body) if block.marker("shell") == "run" else []:
                lines += _installed_packages(command)
    return sorted({line.strip() for line in lines if line.strip()})


def _installed_packages(command: str) -> list[str]:
    """What the ``pip install`` commands of a command line install besides this project."""
    lexer = shlex.shlex(_without_comment(command), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    found, words = [], []
    for token in [*lexer, "&&"]:
        if token in ("&&", "||", ";", "|", "&"):
            if words[:2] == ["pip", "install"]:
                found += [word for word in words[2:] if not word.startswith(("-", "."))]
            words = []
        else:
            words.append(token)
    return found


def _wheelhouse(pages: list[tuple[str, str]]) -> Path:
    """Wheels of every requirement of the walk, built once a day per set of requirements,
    Python and platform (``pip wheel``: an sdist such as pyspark's is built once, not at
    every install). The fixed-ports lock keeps two walks on one machine from filling it
    at once."""
    requirements = _requirements(pages)
    key = "\n".join([*requirements, sys.version, sysconfig.get_platform()])
    house = WHEELHOUSES / hashlib.sha256(key.encode()).hexdigest()[:16]
    done = house / ".complete"
    if done.exists() and time.time() - done.stat().st_mtime < FRESH_FOR:
        return house
    for old in [house, *(d for d in WHEELHOUSES.glob("*") if not (d / ".complete").exists()
                         or time.time() - (d / ".complete").stat().st_mtime >= FRESH_FOR)]:
        shutil.rmtree(old, ignore_errors=True)  # stale, or left half-filled
    house.mkdir(parents=True)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(house),
                          *requirements], capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        unavailable(f"could not fill the wheelhouse with pip wheel: {out.stderr.strip()[-500:]}")
    done.write_text(key)
    return house


# --------------------------------------------------------------------------- the walk


class DocsWalk:
    """The state of one walk: the clone, the shell, what each page printed."""

    def __init__(self, clone: Path, shell: ShellSession, scratch: Path) -> None:
        self.clone = clone
        self.shell = shell
        self.scratch = scratch
        self.outputs: dict[str, str] = {}  # "page:line" of each block run -> what it printed
        self.printed: dict[str, list[tuple[str, str]]] = {}  # "page:line" -> (command, output) of each command
        self.saved: dict[str, Block] = {}  # the files the pages had the reader save, by name

    def quiet(self, command: str, *, expect: int = 0) -> str:
        timeout = next((t for key, t in TIMEOUTS.items() if key in command), 240)
        code, output = self.shell.run(command, timeout=timeout)
        assert code == expect, f"$ {command}\nexited {code}, not {expect}:\n{output[-4000:]}"
        if expect == 0:
            noise = [line for line in output.splitlines() if NOISE.search(line) and not NOT_OURS.match(line)]
            assert not noise, f"$ {command}\n" + "\n".join(noise)
        return output

    def block(self, block: Block) -> None:
        name = block.marker("file")
        if name is not None:  # the program is run by a later command of the page, which names it
            (self.clone / name).write_text(block.body, encoding="utf-8")
            self.saved[name] = block
        elif block.language in SHELL_LANGUAGES:
            self._shell(block)
        elif block.language == "python":
            self._python(block)

    def _shell(self, block: Block) -> None:
        mode = block.marker("shell") or ""
        if mode.startswith(("walked:", "check:")):
            return
        assert mode == "run", f"{block.where}: shell marker {mode!r}"
        printed = self.printed.setdefault(block.where, [])
        for command in _commands(block.body):
            typed = _without_comment(command)
            if typed.endswith("&"):
                if self.shell.running(typed) is None:  # a reader does not start what already runs
                    self.shell.start(typed)
                continue
            printed.append((typed, self.quiet(command)))
        self._claimed(block, "\n".join(output for _, output in printed))

    def _python(self, block: Block) -> None:
        mode = (block.marker("example") or "run").split(":")[0]
        script = self.scratch / f"{block.page.replace('/', '-')}-{block.line}.py"
        if mode == "compile":
            script.write_text(f"import ast\ncode = {block.body!r}\n"
                              "tree = compile(code, 'block', 'exec', flags=ast.PyCF_ONLY_AST | "
                              "ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
                              "exec('\\n'.join(ast.unparse(node) for node in tree.body "
                              "if isinstance(node, (ast.Import, ast.ImportFrom))))\n", encoding="utf-8")
            self.quiet(f"python {shlex.quote(str(script))}")
            return
        assert mode == "run", f"{block.where}: example marker {mode!r}"
        script.write_text(block.body, encoding="utf-8")
        self._claimed(block, self.quiet(f"(cd {shlex.quote(str(self.scratch))} && python {shlex.quote(str(script))})"))

    def _claimed(self, block: Block, output: str) -> None:
        self.outputs[block.where] = output
        if block.output is not None:
            try:
                assert_claimed_output(block.output, output)
            except AssertionError as error:
                raise AssertionError(f"{block.where}: {error}") from None


def _ports_free() -> None:
    import socket

    for port in FIXED_PORTS:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                unavailable(f"127.0.0.1:{port} is in use; the docs' services use it")


def _environment(marker: str, wheels: Path) -> dict[str, str]:
    """A new user's shell: none of this test run's variables, and not its environment's
    Python on PATH. pip refuses to install outside a virtual environment, as Debian's and
    Ubuntu's system Python do (``externally-managed-environment``)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_", "EVENTHUB_", "STORAGE_", "EVENTPROCESSOR_",
                                  "AZURITE_", "PYSPARK_", "SPARK_REMOTE", "OUTPUT", "RUN_SECONDS"))}
    ours = {str(Path(sys.prefix) / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d not in ours)
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                "PIP_REQUIRE_VIRTUALENV": "1", "COLUMNS": "200", MARKER: marker})
    return env  # COLUMNS: as wide as a terminal, for status's table


@pytest.mark.slow
@pytest.mark.azurite
@pytest.mark.eventhubs
@pytest.mark.spark
def test_every_page_of_the_docs_runs_from_a_clean_clone(tmp_path):
    for tool in ("git", "bash", "npm", "node", "java"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")
    _ports_free()
    clone = tmp_path / "eventprocessor"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    pages = reader_pages(clone)
    wheels = _wheelhouse(pages)
    (tmp_path / "logs").mkdir()
    (tmp_path / "scratch").mkdir()
    marker = uuid.uuid4().hex
    shell = ShellSession(clone, _environment(marker, wheels), tmp_path / "logs")
    walk = DocsWalk(clone, shell, tmp_path / "scratch")
    try:
        for page, text in pages:
            _walk_page(walk, page, text)
        exits = shell.stop()
    except BaseException:
        shell.kill()
        with contextlib.suppress(AssertionError):  # what the walk started must not hold the ports of later tests
            assert_nothing_left(marker, grace=10.0)
        raise
    slowest = sorted(shell.seconds, reverse=True)[:12]
    print(f"the walk's commands took {sum(s for s, _ in shell.seconds):.0f} s; the slowest:\n" +
          "\n".join(f"{seconds:6.1f} s  {command}" for seconds, command in slowest))  # pytest -s shows it
    assert all(code == 0 for code in exits.values()), f"services that did not stop cleanly: {exits}"
    for job in shell.jobs:
        noise = [line for line in job.err.read_text(errors="replace").splitlines()
                 if NOISE.search(line) and not NOT_OURS.match(line)]
        assert not noise, f"$ {job.command}\n" + "\n".join(noise)
    assert_nothing_left(marker)


def _walk_page(walk: DocsWalk, page: str, text: str) -> None:
    blocks = fenced_blocks(text, page)
    for block in blocks:
        walk.block(block)
        if block.marker("getting-started") == "quick-start":
            _after_the_quick_start(walk, block)
        if block.marker("getting-started") == "migrating":
            _the_switch_and_back(walk, block)
    commands = " ".join(command for block in blocks for command, _ in walk.printed.get(block.where, []))
    unrun = [name for name, block in walk.saved.items() if block.page == page and block.language == "python"
             and name not in commands]
    assert not unrun, f"{page}: programs it has the reader save and no command of it runs: {unrun}"


def _after_the_quick_start(walk: DocsWalk, block: Block) -> None:
    """The demo lost nothing; and a command that needs an extra not yet installed says
    what to run, which works as printed, from any directory."""
    demo = walk.outputs[block.where]
    lost = [line for line in demo.splitlines() if "events lost" in line]
    assert lost and lost[0].split()[-2] == "0", demo[-2000:]
    assert "[done] all" in demo
    said = walk.quiet("eventprocessor demo --store blob", expect=1)
    hint = re.search(r"run `(pip install [^`]+)`", said)
    assert hint, said
    assert hint.group(1) == f"pip install -e {shlex.quote(str(walk.clone) + '[blob]')}", said
    walk.quiet(f"(cd {shlex.quote(str(walk.scratch))} && {hint.group(1)})")


def _the_switch_and_back(walk: DocsWalk, block: Block) -> None:
    """docs/howto/migrating.md with the strings it exports: azure-eventhub's client read
    the events sent before it, the drop-in those sent after, nothing twice (both crashed
    in azure-eventhub's own store, KeyError: 'ACCOUNTNAME', on UseDevelopmentStorage=true)."""
    runs = [output for command, output in walk.printed[block.where] if command.endswith("python consumer.py")]
    assert len(runs) == 2, walk.printed[block.where]

    def bodies(output: str, word: str) -> list[str]:
        return sorted(line.split(" ", 2)[2] for line in output.splitlines() if re.match(rf"^\d+ \d+ {word} \d+$", line))

    official, drop_in = runs
    assert bodies(official, "before") == [f"before {i}" for i in range(4)], official
    assert bodies(drop_in, "after") == [f"after {i}" for i in range(4)] and not bodies(drop_in, "before"), drop_in
