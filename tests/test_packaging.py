"""The core install stays light and typed."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

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
    for extra in ("blob", "table", "eventhub", "spark", "all"):
        assert extras[extra].strip(), extra
    assert "pyspark" in extras["spark"] and "pyspark" in extras["all"]


def test_packages_ship_py_typed():
    assert (ROOT / "eventprocessor" / "py.typed").exists()
    assert (ROOT / "stores" / "py.typed").exists()
