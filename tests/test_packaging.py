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


# eventprocessor.testing is a layer of its own, above the stores and the emulators: its
# Cluster runs real processors over the in-memory store, its Azurite fault scenarios run
# them on a real Azurite through the emulators' TCP fault proxy (emulators imports none
# of ours, so no cycle). Nothing else in the core may import it. The
# drop-in client also sits above the stores: it builds one of them from azure-eventhub's
# BlobCheckpointStore (and an in-memory one when given none), as azure-eventhub does.
TESTING = Path("eventprocessor") / "testing"
ABOVE_STORES = {Path("eventprocessor") / "consumer_client" / "options.py"}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_module_imports_a_layer_above_its_own(package):
    allowed = LAYERS[package]
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {root}"
             for path in sorted((ROOT / package).rglob("*.py")) if TESTING not in path.relative_to(ROOT).parents
             for root, line in _imported_roots(path) if root in OURS and root not in allowed
             and not (path.relative_to(ROOT) in ABOVE_STORES and root == "stores")]
    assert not wrong, "\n".join(wrong)


def test_the_testing_package_builds_on_the_core_the_stores_and_the_emulators_only():
    # Its fault runners drive the local stand-ins (the Event Hubs emulator, Azurite, the fault proxies).
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {root}"
             for path in sorted((ROOT / TESTING).rglob("*.py"))
             for root, line in _imported_roots(path)
             if root in OURS and root not in ("eventprocessor", "stores", "emulators")]
    assert not wrong, "\n".join(wrong)
    core = [f"{path.relative_to(ROOT)}" for path in sorted((ROOT / "eventprocessor").rglob("*.py"))
            if TESTING not in path.relative_to(ROOT).parents and "eventprocessor.testing" in path.read_text()
            .replace("~eventprocessor.testing", "")]
    assert not core, f"core modules import eventprocessor.testing: {core}"


# Tests and benchmarks use the SDK's public names only, and tests never import the
# benchmarks (a benchmark's own machinery is tested by running it as a program). Each
# entry below is a known exception, with who is to remove it.
IMPORTS_BENCHMARKS_STILL = {
    "tests/test_store_bench.py",  # store_bench's tests: being reworked with store_bench itself
    "tests/test_benchmark_programs.py",  # its scale tests: moving to a file that runs scale as a program
}
PRIVATE_IMPORTS_STILL = {
    "benchmarks/scale.py": {"stores._account"},  # DEFAULT_OPERATION_TIMEOUT; scale is being reworked
    "tests/test_new_user_paths.py": {"stores._account", "eventprocessor._install"},  # describe_error, install hints
    "tests/test_source_faults_emulator.py": {"eventprocessor.sources.eventhub._ErrorContext"},  # the source's split
}
SDK = ("eventprocessor", "stores", "emulators")


def _imports(path: Path):
    import ast

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_test_imports_the_benchmarks():
    wrong = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "tests").glob("*.py"))
             if any(name.split(".")[0] == "benchmarks" for name in _imports(path))]
    assert set(wrong) <= IMPORTS_BENCHMARKS_STILL, sorted(set(wrong) - IMPORTS_BENCHMARKS_STILL)


def test_tests_and_benchmarks_import_no_private_name_of_the_sdk():
    wrong = {}
    for folder in ("tests", "benchmarks"):
        for path in sorted((ROOT / folder).glob("*.py")):
            names = {name for name in _imports(path) if name.split(".")[0] in SDK
                     and any(part.startswith("_") and part != "__init__" for part in name.split("."))}
            names = {name for name in names if not any(name.startswith(allowed) for allowed in
                                                        PRIVATE_IMPORTS_STILL.get(str(path.relative_to(ROOT)), ()))}
            if names:
                wrong[str(path.relative_to(ROOT))] = sorted(names)
    assert not wrong, wrong
