"""The first hour of a new user, the installs: every install hint a user is
told is a command that works from anywhere, every extra says in one line what to
install, and every sample checks what it needs before it starts anything.
(The other paths are ``tests/test_new_user_paths.py`` and
``tests/test_new_user_commands.py``.)"""
from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests import docs_pages
from tests.conftest import unavailable
from tests.test_new_user_paths import assert_nothing_left, assert_one_line_error, environment, run_without

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- install hints


def _install_hints() -> list[str]:
    """Every ``pip install ...`` a user is told, in the README and every page of the
    docs, the samples and the program sources, as written (up to the end of its code
    span or line)."""
    texts = [docs_pages.text(page) for page in docs_pages.pages()]
    folders = ("eventprocessor", "harness", "samples", "docs", "benchmarks")
    texts += [path.read_text(encoding="utf-8") for folder in folders
              for path in sorted((ROOT / folder).rglob("*.py"))]
    hints = []
    for text in texts:
        for match in re.finditer(r"pip install[^`\n\"]*", text):
            hints.append(match.group(0).strip())
    return hints


def test_every_install_hint_quotes_its_brackets_and_names_no_package_the_index_lacks():
    """``pip install eventprocessor[eventhub]`` named a package PyPI does not have, and
    an unquoted ``.[blob]`` is a glob in zsh (``no matches found``)."""
    hints = _install_hints()
    assert len(hints) > 10, hints
    for hint in hints:
        words = shlex.split(hint.replace("{", "").replace("}", ""), posix=True)
        raw = hint.split()
        for word, written in zip(words, raw, strict=False):
            if "[" in word:
                assert written.startswith(("'", '"')), f"unquoted brackets (a glob in zsh): {hint!r}"
        assert not re.search(r"(?<![\w/.-])eventprocessor\[", hint.replace("'", "")) or "@" in hint, \
            f"names the package eventprocessor, which is not on PyPI: {hint!r}"


def test_the_install_hint_from_a_checkout_works_from_any_directory(tmp_path):
    from eventprocessor.extras import install_command

    hint = install_command(["blob", "eventhub"], ["azure-identity"])
    assert hint == f"pip install -e {shlex.quote(str(ROOT) + '[blob,eventhub]')} azure-identity"
    # What the shell hands pip, from another directory, is the checkout with the extras.
    words = subprocess.run(["sh", "-c", f"printf '%s\\n' {hint.split(' ', 2)[2]}"], capture_output=True, text=True,
                           cwd=tmp_path).stdout.split()
    assert words == ["-e", f"{ROOT}[blob,eventhub]", "azure-identity"]


def test_the_install_hint_of_a_wheel_names_the_wheel(monkeypatch, tmp_path):
    """Installed from a wheel (no checkout), the hint reinstalls that wheel with the
    extra: the project is not on any index."""
    from importlib import metadata

    from eventprocessor import extras

    wheel = tmp_path / "eventprocessor-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")

    class Installed:
        def read_text(self, name: str) -> str | None:
            assert name == "direct_url.json"
            return json.dumps({"url": wheel.as_uri(), "archive_info": {}})

    monkeypatch.setattr(extras, "source_checkout", lambda: None)
    monkeypatch.setattr(metadata, "distribution", lambda name: Installed())
    assert extras.install_command(["blob"]) == f"pip install {shlex.quote(f'{wheel}[blob]')}"


def test_importing_a_store_without_its_extra_says_the_install_command(tmp_path):
    program = tmp_path / "import_store.py"
    program.write_text("from eventprocessor import stores\ntry:\n    stores.BlobCheckpointStore\n"
                       "except ModuleNotFoundError as error:\n    print(error)\n")
    out = run_without(["azure", "aiohttp"], [str(program)], env=environment())
    assert out.returncode == 0, out.stderr
    assert "BlobCheckpointStore needs the [blob] extra" in out.stdout, out.stdout
    assert f"pip install -e {shlex.quote(f'{ROOT}[blob]')}" in out.stdout, out.stdout


@pytest.mark.parametrize("statement, needs", [
    ("from eventprocessor.spark import EventHubsDataSource", "eventprocessor.spark needs the [spark] extra"),
    ("from eventprocessor.spark import SparkSink", "eventprocessor.spark needs the [spark] extra"),
])
def test_importing_spark_without_its_extra_is_one_line_with_the_install_command(tmp_path, statement, needs):
    """``from eventprocessor.spark import EventHubsDataSource`` in a core-only install:
    a bare ``ModuleNotFoundError: No module named 'pyarrow'``."""
    program = tmp_path / "import_spark.py"
    program.write_text(statement + "\n")
    out = run_without(SPARK_MODULES, [str(program)], env=environment())
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: {needs} ("), out.stderr
    assert last.endswith(f"is not installed): pip install -e {shlex.quote(f'{ROOT}[spark]')}"), out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("ModuleNotFoundError:")]
    assert errors == [last], out.stderr  # the hint, not the bare error above it


# --------------------------------------------------------------------------- samples check first


SPARK_MODULES = ["pyspark", "pyarrow", "pandas"]


def test_the_spark_sample_without_the_spark_extra_is_one_line():
    started = time.monotonic()
    out = run_without(SPARK_MODULES, [str(ROOT / "samples" / "spark_consumer.py")], env=environment())
    assert time.monotonic() - started < 10
    assert_one_line_error(out, "[spark]", f"pip install -e {shlex.quote(f'{ROOT}[spark]')}")


def test_the_spark_sample_without_java_is_one_line(tmp_path):
    from eventprocessor.cli.user_errors import missing_modules

    if missing_modules(SPARK_MODULES):
        unavailable("pyspark is not installed (pip install -e '.[all]')")
    env = environment(PATH=str(Path(sys.executable).parent), JAVA_HOME=str(tmp_path / "no-jdk"))
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "samples" / "spark_consumer.py")], capture_output=True,
                         text=True, timeout=60, env=env, cwd=ROOT)
    assert time.monotonic() - started < 10
    assert_one_line_error(out, "Java 17")


@pytest.mark.parametrize("sample, blocked, needle", [
    ("eventhub_consumer.py", ["azure.eventhub"], "[eventhub]"),
    ("callback_consumer.py", ["azure.eventhub"], "[eventhub]"),
    ("multiprocess_azurite.py", ["azure"], "[blob,eventhub]"),
])
def test_samples_without_their_extras_are_one_line(sample, blocked, needle):
    marker = uuid.uuid4().hex
    out = run_without(blocked, [str(ROOT / "samples" / sample)], env=environment(marker))
    assert_one_line_error(out, needle, "pip install -e")
    assert_nothing_left(marker)


# --------------------------------------------------------------------------- extras match the docs


def test_the_otel_extra_installs_what_the_metrics_example_imports():
    """``pip install -e '.[otel]'`` then the metrics example (docs/howto/operating.md):
    ``ModuleNotFoundError: opentelemetry.sdk`` (the extra had only the API)."""
    from importlib import metadata

    section = docs_pages.section("docs/howto/operating.md", "Metrics")
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example
    imported = set(re.findall(r"^(?:from|import) (opentelemetry[\w.]*)", example.group(1), re.M))
    assert imported, "the metrics example imports OpenTelemetry"
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    otel = {re.split(r"[<>=!~\[ ]", line.strip())[0].lower()
            for line in cfg["options.extras_require"]["otel"].splitlines() if line.strip()}
    providers = metadata.packages_distributions()
    for module in imported:
        # The distribution that installs this module (opentelemetry is a namespace package:
        # look at the deepest installed package of the module's path).
        parts = module.split(".")
        dists: set = set()
        for depth in range(len(parts), 0, -1):
            candidates = {d.lower() for d in providers.get(".".join(parts[:depth]), [])}
            if depth == 1:
                candidates = set()
            if candidates:
                dists = candidates
                break
        if not dists:
            import importlib.util

            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin, module
            for dist in metadata.distributions():
                files = dist.files or []
                if any(str(dist.locate_file(f)) == spec.origin for f in files):
                    dists.add(dist.metadata["Name"].lower())
        assert dists & otel, f"{module} comes with {sorted(dists)}, which the [otel] extra ({sorted(otel)}) lacks"


