"""Failures a user can fix, each said in one line with what to do.

The command line (and the benchmark programs, which share it) checks what a command
needs before it starts: the optional extras (``[blob]``, ``[spark]``...), other Python
packages, and tools such as Java or Azurite. A missing piece raises
:class:`MissingRequirementError`, whose message is the exact command to run. Anything
else a user can cause (an unreachable store, Azurite that does not start, a timeout)
is turned into one line by :func:`one_line_message`; ``--debug`` shows the traceback
instead.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from eventprocessor.extras import EXTRA_MODULES, extra_for_module, source_checkout
from eventprocessor.extras import install_command as _install_command

__all__ = [
    "CommandError", "MissingRequirementError", "install_command", "missing_modules", "one_line_message",
    "require", "require_azurite", "require_java", "require_or_exit", "source_checkout",
]

logger = logging.getLogger(__name__)


# The Azurite package.json pins and the Node.js its engines range accepts (README.md,
# "Quick start"); tests/test_new_user_paths.py keeps the three in step.
PINNED_AZURITE = "3.35.0"
NODE_VERSION = "20.6 or newer"


class CommandError(Exception):
    """A failure the user can fix. The message says what happened and what to do."""


class MissingRequirementError(CommandError, ImportError):
    """Something a command needs is not installed. The message is the command to run.

    Example::

        try:
            require(extras=["blob"], purpose="--store blob")
        except MissingRequirementError as error:
            print(error)   # --store blob needs ...: run `pip install -e '/src/eventprocessor[blob]'`
    """


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The modules of ``modules`` that cannot be imported (without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a missing parent package, or a stub without a spec
            found = False
        if not found:
            missing.append(name)
    return missing


def install_command(extras: Sequence[str] = (), packages: Sequence[str] = ()) -> str:
    """The one command that installs ``extras`` of this project and other ``packages``,
    from where this copy came from, quoted for every POSIX shell.

    From a source checkout it is ``pip install -e '<checkout>[blob]'`` (it works from any
    directory); from a wheel, ``pip install '<the wheel>[blob]'`` (see
    :func:`eventprocessor.extras.install_command`).
    """
    return _install_command(extras, packages)


def require(*, purpose: str, extras: Sequence[str] = (), packages: Sequence[tuple[str, str]] = ()) -> None:
    """Raise :class:`MissingRequirementError` unless every extra and package is importable.

    ``packages`` are ``(module, pip name)`` pairs for what no extra provides. Nothing is
    imported. Example::

        require(purpose="store-bench", extras=["blob"],
                packages=[("azure.eventhub.extensions.checkpointstoreblobaio",
                           "azure-eventhub-checkpointstoreblob-aio")])
    """
    unknown = [extra for extra in extras if extra not in EXTRA_MODULES]
    if unknown:
        raise ValueError(f"unknown extra(s) {unknown}; known: {sorted(EXTRA_MODULES)}")
    missing_extras = [extra for extra in extras if missing_modules(EXTRA_MODULES[extra])]
    missing_packages = [pip_name for module, pip_name in packages if missing_modules([module])]
    if not missing_extras and not missing_packages:
        return
    what = []
    if missing_extras:
        what.append(f"the [{','.join(missing_extras)}] extra" + ("s" if len(missing_extras) > 1 else ""))
    if missing_packages:
        what.append("the package" + ("s " if len(missing_packages) > 1 else " ") + ", ".join(missing_packages))
    verb = "is" if len(missing_extras) + len(missing_packages) == 1 else "are"
    raise MissingRequirementError(
        f"{purpose} needs {' and '.join(what)}, which {verb} not installed: "
        f"run `{install_command(missing_extras, missing_packages)}`")


def require_azurite(purpose: str) -> None:
    """Raise :class:`MissingRequirementError` unless Azurite and Node.js can be started."""
    from eventprocessor.emulators.azurite import find_azurite

    binary = find_azurite()
    if binary is None or not binary.exists():
        checkout = source_checkout()
        how = (f"cd {shlex.quote(str(checkout))} && npm ci" if checkout and (checkout / "package.json").exists()
               else f"npm install -g azurite@{PINNED_AZURITE}")
        where = f" ($AZURITE_BIN is {binary})" if os.environ.get("AZURITE_BIN") else ""
        raise MissingRequirementError(
            f"{purpose} needs the Azurite storage emulator, which is not installed{where}: run `{how}` "
            f"(needs Node.js {NODE_VERSION} and npm)")
    if shutil.which("node") is None:
        raise MissingRequirementError(
            f"{purpose} needs Node.js to run Azurite ({binary}), and `node` is not on PATH: "
            f"install Node.js {NODE_VERSION}")


def require_java(purpose: str) -> None:
    """Raise :class:`MissingRequirementError` unless a ``java`` executable can be found."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return
    if shutil.which("java"):
        return
    raise MissingRequirementError(
        f"{purpose} needs Java 17 for Spark, and there is no `java` on PATH nor in $JAVA_HOME: install a JDK 17 "
        "(for example `sudo apt-get install openjdk-17-jre-headless`) and try again")


def require_or_exit(purpose: str, *, extras: Sequence[str] = (), packages: Sequence[tuple[str, str]] = (),
                    java: bool = False, azurite: bool = False) -> None:
    """For a program of this project (a sample): check what it needs before it starts
    anything; if something is missing, print one line that says what to run and exit
    with status 2. ``azurite``: Azurite and Node.js must be there to be started.

    Example (the first lines of a sample's ``main``)::

        require_or_exit("samples/spark_consumer.py", extras=["spark"], java=True)
        # Error: samples/spark_consumer.py needs the [spark] extra, which is not installed: run `pip install ...`
    """
    try:
        require(purpose=purpose, extras=extras, packages=packages)
        if java:
            require_java(purpose)
        if azurite:
            require_azurite(purpose)
    except MissingRequirementError as error:
        print(f"Error: {_flat(error)}", file=sys.stderr)
        raise SystemExit(2) from None


def one_line_message(error: BaseException) -> str | None:
    """One line that says what went wrong and what to do, for failures a user can fix.

    None for anything else (a bug: show it with its traceback, or with a hint to use
    ``--debug``). Messages of our own errors never contain secrets, so they are shown
    as they are.
    """
    from eventprocessor.errors import EventProcessorError

    if isinstance(error, CommandError):
        return _flat(error)
    if isinstance(error, ModuleNotFoundError) and error.name:
        extra = extra_for_module(error.name)
        if extra is not None:
            return (f"the module {error.name!r} is not installed; it comes with the [{extra}] extra: "
                    f"run `{install_command([extra])}`")
        return None
    if type(error).__name__ == "AzuriteUnavailable":  # eventprocessor.emulators.azurite; not imported for a check
        return f"Azurite is not available: {_flat(error)}"
    if type(error).__name__ == "PostgresUnavailable":  # eventprocessor.emulators.postgres
        return f"PostgreSQL is not available: {_flat(error)}"
    if isinstance(error, EventProcessorError):
        return f"{type(error).__name__}: {_flat(error)}"
    if isinstance(error, TimeoutError):
        return _flat(error) or "timed out"
    if isinstance(error, ConnectionError):
        return f"{type(error).__name__}: {_flat(error)}"
    return None


def _flat(error: BaseException) -> str:
    return " ".join(str(error).split())
