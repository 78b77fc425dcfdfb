"""The core install stays light and typed."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_core_pulls_in_neither_azure_nor_pyspark():
    code = ("import sys, eventprocessor, eventprocessor.sources, stores; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('azure', 'pyspark', 'pyarrow', 'pandas')]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_core_requirements_and_extras():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    core = cfg["options"]["install_requires"]
    assert "pyspark" not in core and "azure" not in core
    extras = cfg["options.extras_require"]
    for extra in ("blob", "table", "eventhub", "spark", "otel", "all"):
        assert extras[extra].strip(), extra
    assert "pyspark" in extras["spark"] and "pyspark" in extras["all"]


def test_packages_ship_py_typed():
    assert (ROOT / "eventprocessor" / "py.typed").exists()
    assert (ROOT / "stores" / "py.typed").exists()
    for package in ("emulators", "eventprocessor_cli"):
        assert (ROOT / package / "py.typed").exists()


# Who may import whom. The SDK core is at the bottom; the stores build on it; the
# command line, the local emulators, the samples and the benchmarks sit on top.
LAYERS = {
    "eventprocessor": {"eventprocessor"},
    "stores": {"eventprocessor", "stores"},
    "emulators": {"emulators"},
    "eventprocessor_cli": {"eventprocessor", "stores", "emulators", "eventprocessor_cli", "benchmarks"},
}
OURS = set(LAYERS) | {"benchmarks", "samples", "tests"}


def _imported_roots(path: Path):
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.lineno


# eventprocessor.testing is a layer of its own, above the stores: its Cluster runs real
# processors over the in-memory store. Nothing else in the core may import it. The
# drop-in client also sits above the stores: it builds one of them from azure-eventhub's
# BlobCheckpointStore (and an in-memory one when given none), as azure-eventhub does.
TESTING = Path("eventprocessor") / "testing"
ABOVE_STORES = {Path("eventprocessor") / "consumer_client" / "options.py"}
# The Spark source builds the Blob or Table store its options name: a layer above the
# stores too. The core reaches it only through the lazy export in eventprocessor.spark.
SPARK_SOURCE = Path("eventprocessor") / "spark" / "source"


def _may_import_stores(path: Path) -> bool:
    relative = path.relative_to(ROOT)
    return relative in ABOVE_STORES or SPARK_SOURCE in relative.parents


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_module_imports_a_layer_above_its_own(package):
    allowed = LAYERS[package]
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {root}"
             for path in sorted((ROOT / package).rglob("*.py")) if TESTING not in path.relative_to(ROOT).parents
             for root, line in _imported_roots(path) if root in OURS and root not in allowed
             and not (_may_import_stores(path) and root == "stores")]
    assert not wrong, "\n".join(wrong)


def test_the_spark_source_builds_on_the_core_and_the_stores_only_and_pulls_in_no_pyspark_until_asked():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {root}"
             for path in sorted((ROOT / SPARK_SOURCE).rglob("*.py"))
             for root, line in _imported_roots(path) if root in OURS and root not in ("eventprocessor", "stores")]
    assert not wrong, "\n".join(wrong)
    code = ("import sys, eventprocessor.spark, eventprocessor.spark.source.offsets, eventprocessor.spark.source.options; "
            "before = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'stores')); "
            "from eventprocessor.spark import EventHubsDataSource; "
            "print(before, EventHubsDataSource.name(), 'pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] eventhubs True"


def test_the_testing_package_builds_on_the_core_and_the_stores_only():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {root}"
             for path in sorted((ROOT / TESTING).rglob("*.py"))
             for root, line in _imported_roots(path) if root in OURS and root not in ("eventprocessor", "stores")]
    assert not wrong, "\n".join(wrong)
    core = [f"{path.relative_to(ROOT)}" for path in sorted((ROOT / "eventprocessor").rglob("*.py"))
            if TESTING not in path.relative_to(ROOT).parents and "eventprocessor.testing" in path.read_text()
            .replace("~eventprocessor.testing", "")]
    assert not core, f"core modules import eventprocessor.testing: {core}"
