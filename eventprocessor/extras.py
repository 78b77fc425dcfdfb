"""The command that installs an extra of this project, from where the user installed it.

Public, for programs and tools built on the SDK that want to print the same hint::

    from eventprocessor.extras import install_command
    print(f"this needs the [blob] extra: {install_command(['blob'])}")

This project is not on PyPI: a hint that asks pip for ``eventprocessor[blob]`` from the
index names a package the index does not have. It is installed from a source checkout (``pip install -e .``), or
from a wheel or a directory built from one. :func:`install_command` reads which (the
checkout this code runs from, else the installed distribution's ``direct_url.json``,
PEP 610) and gives the one command that adds an extra there, quoted for POSIX shells
(bash, zsh, fish: an unquoted ``.[blob]`` is a glob in zsh).
"""
from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["EXTRA_MODULES", "extra_for_module", "install_command", "source_checkout", "the_extra_it_needs"]

_ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "eventprocessor"

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "blob": ("azure.storage.blob", "azure.core", "aiohttp"),
    "table": ("azure.data.tables", "azure.core", "aiohttp"),
    "eventhub": ("azure.eventhub",),
    "spark": ("pyspark", "pyarrow", "pandas"),
    "otel": ("opentelemetry.sdk",),
    "postgres": ("asyncpg",),
}
"""The modules each extra of setup.cfg brings (tests/test_cli.py keeps the two in step)."""

# Which extra brings a module nobody checked for, longest prefix first.
_MODULE_EXTRA = [
    ("azure.storage", "blob"), ("azure.data", "table"), ("azure.eventhub", "eventhub"),
    ("azure.core", "blob"), ("aiohttp", "blob"), ("azure", "all"),
    ("pyspark", "spark"), ("pyarrow", "spark"), ("pandas", "spark"), ("opentelemetry", "otel"),
    ("asyncpg", "postgres"),
]


def extra_for_module(name: str) -> str | None:
    """The extra that installs the module ``name`` (``pyarrow`` -> ``spark``), or None."""
    for prefix, extra in _MODULE_EXTRA:
        if name == prefix or name.startswith(prefix + "."):
            return extra
    return None


@contextlib.contextmanager
def the_extra_it_needs(what: str) -> Iterator[None]:
    """Imports in the block that fail for a module an extra brings raise a
    ``ModuleNotFoundError`` whose one line names ``what``, the extra and the command
    that installs it; other import errors pass unchanged.

    Example (the first imports of a sub-package that needs ``[spark]``)::

        with the_extra_it_needs("eventprocessor.spark"):
            import pyarrow
        # ModuleNotFoundError: eventprocessor.spark needs the [spark] extra ('pyarrow' is not installed):
        # pip install -e '/src/eventprocessor[spark]'
    """
    try:
        yield
    except ModuleNotFoundError as error:
        extra = extra_for_module(error.name or "")
        if extra is None:
            raise
        # The cause says only what this line says: leave it out, so the hint is what shows.
        raise ModuleNotFoundError(f"{what} needs the [{extra}] extra ({error.name!r} is not installed): "
                                  f"{install_command([extra])}", name=error.name) from None


def source_checkout() -> Path | None:
    """The source checkout this package runs from (an editable install, or the tree on
    ``PYTHONPATH``), or None."""
    if (_ROOT / "setup.cfg").is_file() and (_ROOT / "eventprocessor").is_dir():
        return _ROOT
    return None


def _installed_from() -> str | None:
    """What ``pip install`` was given: a local directory or wheel path, a VCS URL, or
    None (an index, or not installed as a distribution)."""
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    url = str(info.get("url", ""))
    if url.startswith("file://"):
        path = Path(unquote(urlsplit(url).path))
        return str(path) if path.exists() else None
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        commit = f"@{vcs['commit_id']}" if vcs.get("commit_id") else ""
        return f"{vcs['vcs']}+{url}{commit}"
    return url or None


def install_command(extras: Sequence[str] = (), packages: Sequence[str] = ()) -> str:
    """The one command that installs ``extras`` of this project and other ``packages``,
    from wherever this copy of the project came from.

    Example::

        install_command(["blob"])
        # from a source checkout:  "pip install -e '/src/eventprocessor[blob]'"
        # from a wheel:            "pip install '/dist/eventprocessor-0.1.0-py3-none-any.whl[blob]'"
    """
    words = ["pip", "install"]
    if extras:
        wanted = f"[{','.join(sorted(set(extras)))}]"
        checkout = source_checkout()
        origin = _installed_from()
        if checkout is not None:
            words += ["-e", shlex.quote(f"{checkout}{wanted}")]
        elif origin is not None and "://" not in origin:
            words.append(shlex.quote(f"{origin}{wanted}"))
        elif origin is not None:
            words.append(shlex.quote(f"{DISTRIBUTION}{wanted} @ {origin}"))
        else:  # installed from an index of your own, or copied: the same source again, with the extra
            words.append(shlex.quote(f"{DISTRIBUTION}{wanted}"))
    words += [shlex.quote(package) for package in packages]
    return " ".join(words)
