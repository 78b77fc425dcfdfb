"""The core install stays light and typed."""
from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_importing_the_core_pulls_in_neither_azure_nor_pyspark():
    code = ("import sys, eventprocessor, eventprocessor.sources, eventprocessor.stores; "
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


def test_the_package_ships_py_typed():
    assert (ROOT / "eventprocessor" / "py.typed").exists()


# The layers of ``eventprocessor``, bottom first. A module imports only from its own layer and
# the layers below it, type-only imports included (the cycle test below sees to the order
# within a layer). The vocabulary is public: errors, events and the policies, the handler's
# context and the claim behind it, the store contract and the stores, the sources and the
# partition state. The processor's internals sit on it, one role per private package: what
# every part runs on, then ownership, then delivery, then the one place that wires them and
# the façade. The public face on top: the package itself, the drop-in client, Spark, the
# testing tools and the command line. The local emulators import nothing of ours.
PACKAGE = "eventprocessor"
LAYERS = [
    ("vocabulary", ("errors", "events", "extras", "policies", "_version", "_claim", "partition", "stores", "sources",
                    "state")),
    ("runtime", ("_runtime",)),
    ("ownership", ("_ownership",)),
    ("delivery", ("_delivery",)),
    ("wiring", ("_assembly", "_processor")),
    ("face", ("", "__main__", "_sink_handler", "consumer_client", "spark", "postgres", "testing", "cli")),
]
EMULATORS = f"{PACKAGE}.emulators"
INTERNAL = ("runtime", "ownership", "delivery")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> Iterator[tuple[str, int]]:
    module = _module_name(path)
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                prefix = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(prefix + ([node.module] if node.module else []))
            yield base, node.lineno


def _within(module: str, prefixes) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def _layer(module: str) -> int | None:
    """The index of ``module``'s layer in :data:`LAYERS` (None: the emulators)."""
    if _within(module, (EMULATORS,)):
        return None
    name = module[len(PACKAGE) + 1:] if module != PACKAGE else ""
    for index, (_label, tops) in enumerate(LAYERS):
        if name.split(".")[0] in tops:
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def test_no_module_imports_a_layer_above_its_own():
    wrong = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        module = _module_name(path)
        layer = _layer(module)
        for imported, line in _imported_modules(path):
            if not _within(imported, (PACKAGE, "benchmarks", "harness", "tests", "samples")):
                continue
            if layer is None:  # the emulators: themselves only
                allowed = _within(imported, (EMULATORS,))
            elif not _within(imported, (PACKAGE,)):  # the command line runs the benchmarks
                allowed = _within(module, (f"{PACKAGE}.cli",)) and _within(imported, ("benchmarks",))
            else:
                target = _layer(imported)
                allowed = target <= layer if target is not None else LAYERS[layer][0] == "face"
            if not allowed:
                label = LAYERS[layer][0] if layer is not None else "emulators"
                wrong.append(f"{path.relative_to(ROOT)}:{line} ({label}) imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_the_internal_packages_are_layered_runtime_ownership_delivery():
    order = [label for label, _tops in LAYERS]
    assert [label for label in order if label in INTERNAL] == ["runtime", "ownership", "delivery"]
    assert order.index("vocabulary") < order.index("runtime") and order.index("delivery") < order.index("wiring")


def test_the_sdk_asks_a_context_s_claim_and_touches_no_private_member_of_the_context_elsewhere():
    """The pump, the Spark sink and the drop-in use the claim behind a handler's context
    (``claim_of(context)``), never the context's private members."""
    wrong = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        if path == ROOT / PACKAGE / "partition.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                value = node.value
                if (isinstance(value, ast.Name) and value.id in ("context", "ctx")) or \
                        (isinstance(value, ast.Attribute) and value.attr == "context"):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


def test_the_spark_source_builds_on_the_core_and_the_stores_only_and_pulls_in_no_pyspark_until_asked():
    code = ("import sys, eventprocessor.spark, eventprocessor.spark.source.offsets, "
            "eventprocessor.spark.source.options; "
            "before = sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'pyspark' or m.startswith(('eventprocessor.stores.blob', "
            "'eventprocessor.stores.table', 'eventprocessor.stores._azure'))); "
            "from eventprocessor.spark import EventHubsDataSource; "
            "print(before, EventHubsDataSource.name(), 'pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] eventhubs True"


def test_nothing_in_the_package_imports_the_harness_the_tests_or_the_benchmarks_but_the_cli_its_benchmarks():
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
             for path in sorted((ROOT / PACKAGE).rglob("*.py"))
             for imported, line in _imported_modules(path)
             if _within(imported, ("harness", "tests", "samples"))
             or (_within(imported, ("benchmarks",)) and not _within(_module_name(path), (f"{PACKAGE}.cli",)))]
    assert not wrong, "\n".join(wrong)


# Benchmarks, samples and the harness use the SDK's public names only; the tests use them
# too, except the unit tests of the processor's internals (the private role packages and
# the modules that build on them), which import what they test. Tests never import the
# benchmarks (a benchmark's own machinery is tested by running it as a program). Each
# entry below is a known exception, with who is to remove it.
IMPORTS_BENCHMARKS_STILL: set[str] = set()
PRIVATE_IMPORTS_STILL: dict[str, set[str]] = {
    # bench: the state benchmark bounds its store calls as a processor does
    "benchmarks/state.py": {"eventprocessor._runtime.bounded_store", "eventprocessor._runtime.clock"},
}
SDK = ("eventprocessor",)
INTERNALS = ("eventprocessor._runtime", "eventprocessor._ownership", "eventprocessor._delivery",
             "eventprocessor._assembly", "eventprocessor._processor")


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


def test_tests_benchmarks_samples_and_the_harness_import_no_private_name_of_the_sdk():
    wrong = {}
    for folder in ("tests", "benchmarks", "samples", "harness"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            names = {name for name in _imports(path) if name.split(".")[0] in SDK
                     and any(part.startswith("_") and part != "__init__" for part in name.split("."))
                     and not (folder == "tests" and _within(name, INTERNALS))}
            names = {name for name in names if not any(name.startswith(allowed) for allowed in
                                                        PRIVATE_IMPORTS_STILL.get(str(path.relative_to(ROOT)), ()))}
            if names:
                wrong[str(path.relative_to(ROOT))] = sorted(names)
    assert not wrong, wrong


# Nor do they touch a private attribute of an SDK object: ``x._name`` where ``x`` is a
# name imported from the SDK, or a name bound (in the same function or an enclosing one)
# to what calling one of those returns (``source = EventHubSource.from_connection_string(...)``,
# ``a, b = make_pair(...)`` binding both), and so on (``receiver = await source.open_receiver(...)``),
# or a parameter annotated with an SDK name (``def check(processor: EventProcessor)``,
# ``Optional[EventProcessor]`` too).
# Names bound any other way are not followed, so another library's internals are never
# flagged; an SDK object reached another way can be missed. Each entry below is a known
# exception, with who is to remove it.
PRIVATE_ATTRIBUTES_STILL: dict[str, set[str]] = {}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _sdk_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in SDK:
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                      if alias.name.split(".")[0] in SDK}
    return names


def _in_scope(node: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _SCOPES):
            yield child
            yield from _in_scope(child)


def _nested_scopes(node: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _SCOPES):
            yield child
        else:
            yield from _nested_scopes(child)


def _made_by(value: ast.AST, sdk: set[str]) -> bool:
    """``value`` calls (and maybe awaits) an SDK name or one of its attributes."""
    if isinstance(value, ast.Await):
        value = value.value
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in sdk


def _target_names(target: ast.AST) -> set[str]:
    """The names an assignment target binds: ``x``, ``x, y``, ``(x, [y, *z])``."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(element) for element in target.elts))
    return set()


def _sdk_parameters(scope: ast.AST, sdk: set[str]) -> set[str]:
    """Parameters of a function annotated with an SDK name (anywhere in the annotation)."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    arguments = scope.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
             *filter(None, [arguments.vararg, arguments.kwarg])]
    return {argument.arg for argument in every if argument.annotation is not None and any(
        isinstance(node, ast.Name) and node.id in sdk for node in ast.walk(argument.annotation))}


def _private_attributes_of_sdk_objects(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    sdk = _sdk_names(tree)
    found: list[tuple[int, str]] = []

    def visit(scope: ast.AST, outer: set[str]) -> None:
        nodes = list(_in_scope(scope))
        bound = set(outer) | _sdk_parameters(scope, sdk)
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = set().union(*(_target_names(target) for target in targets))
                bound = bound | names if _made_by(node.value, sdk | bound) else bound - names
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) \
                    and _made_by(node.context_expr, sdk | bound):
                bound.add(node.optional_vars.id)
        for node in nodes:
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.value, ast.Name) and node.value.id in bound | sdk:
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
        for child in _nested_scopes(scope):
            visit(child, bound)

    visit(tree, set())
    return found


def test_the_private_attribute_check_sees_reads_and_writes_and_leaves_other_libraries_alone(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from azure.eventhub import EventData\n"
        "from eventprocessor.sources.eventhub import EventHubSource\n"
        "def test():\n"
        "    source = EventHubSource.from_connection_string('x')\n"
        "    async def inner():\n"
        "        source._lean = False\n"
        "        receiver = await source.open_receiver('0')\n"
        "        receiver._handler.do_work_async = None\n"
        "        return EventHubSource._new_client\n"
        "    client = source.clients['a']\n"
        "    return client._consumer_group, EventData._from_message, source._client_kwargs, self._own\n"
        "def check(processor: Optional[EventProcessor], other: int, data: EventData):\n"
        "    pair, (single, *rest) = EventHubSource.split()\n"
        "    return processor._taker, other._x, data._raw, pair._a, single._b, rest._c\n")
    sample.write_text(sample.read_text().replace(
        "from eventprocessor.sources.eventhub import EventHubSource\n",
        "from eventprocessor.sources.eventhub import EventHubSource\nfrom eventprocessor import EventProcessor\n"))
    assert sorted(_private_attributes_of_sdk_objects(sample)) == sorted([
        (12, "source._client_kwargs"), (7, "source._lean"), (9, "receiver._handler"),
        (10, "EventHubSource._new_client"),
        (15, "processor._taker"), (15, "pair._a"), (15, "single._b"), (15, "rest._c")])


def test_tests_benchmarks_and_samples_touch_no_private_attribute_of_an_sdk_object():
    wrong = {}
    for folder in ("tests", "benchmarks", "samples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            touched = {what for _line, what in _private_attributes_of_sdk_objects(path)}
            if touched - PRIVATE_ATTRIBUTES_STILL.get(name, set()):
                wrong[name] = sorted(touched - PRIVATE_ATTRIBUTES_STILL.get(name, set()))
    assert not wrong, wrong


def _module_imports(package: str, *, for_types: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports when it is imported (not those
    imported inside a function, nor those under ``TYPE_CHECKING`` unless ``for_types``)."""
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def imported(module: str, statements: list[ast.stmt]) -> Iterator[str]:
        here = module if modules[module].name == "__init__.py" else module.rpartition(".")[0]
        for node in statements:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not for_types:
                yield from imported(module, node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                handlers = [statement for handler in getattr(node, "handlers", []) for statement in handler.body]
                yield from imported(module, node.body + node.orelse + handlers + getattr(node, "finalbody", []))
            elif isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    prefix = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(prefix + ([node.module] if node.module else []))
                for alias in node.names:
                    yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base

    return {module: {name for name in imported(module, ast.parse(path.read_text()).body)
                     if name in modules and name != module} for module, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles = []
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(" -> ".join(path[path.index(module):] + [module]))
            return
        if module in done:
            return
        for imported in sorted(graph[module]):
            walk(imported, path + [module])
        done.add(module)

    for module in sorted(graph):
        walk(module, [])
    return cycles


@pytest.mark.parametrize("package", ["eventprocessor", "harness", "benchmarks"])
def test_no_import_cycles(package):
    cycles = _cycles(_module_imports(package))
    assert not cycles, cycles


# Cycles through imports made for type checking only that are known, with who is to remove them.
TYPE_CYCLES_STILL: dict[str, str] = {}


def test_no_import_cycles_even_through_imports_for_type_checking_only():
    cycles = [cycle for cycle in _cycles(_module_imports("eventprocessor", for_types=True))
              if not any(all(_within(module, (package,)) for module in cycle.split(" -> "))
                         for package in TYPE_CYCLES_STILL)]
    assert not cycles, cycles


# No module of the package over 500 lines, no function over 80. Each entry below is a known
# exception, with who is to split it; an entry that no longer exceeds its limit must go.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 80
LONG_MODULES_STILL = {
}
LONG_FUNCTIONS_STILL = {
    "eventprocessor/emulators/eventhubs/codec.py:_decode_with_constructor": "dropin",
}


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        modules[name] = text.count("\n")
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{name}:{node.name}"
                functions[key] = max(functions.get(key, 0), node.end_lineno - node.lineno + 1)
    return modules, functions


def test_no_module_over_500_lines_and_no_function_over_80():
    modules, functions = _sizes()
    long_modules = {name: lines for name, lines in modules.items() if lines > MAX_MODULE_LINES}
    long_functions = {name: lines for name, lines in functions.items() if lines > MAX_FUNCTION_LINES}
    assert set(long_modules) <= set(LONG_MODULES_STILL), \
        {name: lines for name, lines in long_modules.items() if name not in LONG_MODULES_STILL}
    assert set(long_functions) <= set(LONG_FUNCTIONS_STILL), \
        {name: lines for name, lines in long_functions.items() if name not in LONG_FUNCTIONS_STILL}
    assert not set(LONG_MODULES_STILL) - set(long_modules), "split now: remove from LONG_MODULES_STILL"
    assert not set(LONG_FUNCTIONS_STILL) - set(long_functions), "split now: remove from LONG_FUNCTIONS_STILL"


def test_the_wheel_holds_one_top_level_package_and_no_harness(tmp_path):
    """Built from the tracked files only, as a clean clone would build it."""
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT, check=True).stdout
    source = tmp_path / "source"
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                          str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import zipfile

    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"eventprocessor", next(top for top in tops if top.endswith(".dist-info"))}, sorted(tops)
    packages = {name.rsplit("/", 1)[0] for name in names if name.endswith("/__init__.py")}
    assert {"eventprocessor/stores", "eventprocessor/emulators", "eventprocessor/cli",
            "eventprocessor/testing"} <= packages
    assert not [name for name in names if "/harness" in name or name.startswith(("tests/", "benchmarks/"))]
    public_testing = {name.rsplit("/", 1)[1] for name in names if name.startswith("eventprocessor/testing/")}
    assert public_testing == {"__init__.py", "cluster.py", "loop.py", "ownership.py", "recorder.py", "source.py",
                              "store.py"}, sorted(public_testing)
    assert "eventprocessor/py.typed" in names


def test_a_users_own_stores_or_emulators_module_shadows_nothing(tmp_path):
    for name in ("stores", "emulators", "harness", "cli"):
        (tmp_path / f"{name}.py").write_text("MINE = True\n")
    code = ("import stores, emulators, cli; "
            "from eventprocessor.stores import InMemoryCheckpointStore; "
            "from eventprocessor.emulators.ports import free_ports; "
            "import eventprocessor.cli; "
            "print(stores.MINE, emulators.MINE, cli.MINE, InMemoryCheckpointStore.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True", "eventprocessor.stores.memory"]


def test_the_event_hubs_receivers_reach_their_source_through_a_narrow_link_only():
    """The partition receivers of ``EventHubSource`` get a small link object (what they
    need of their source), not the source: no module of the package imports another in
    a circle (imports for type checking and inside functions included), and no receiver
    writes an attribute of anything it holds but itself (the source's fields included)."""
    package = ROOT / "eventprocessor" / "sources" / "eventhub"
    names = {path.stem for path in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        graph[path.stem] = {node.module.split(".")[0] if node.module else alias.name
                            for node in ast.walk(ast.parse(path.read_text()))
                            if isinstance(node, ast.ImportFrom) and node.level == 1
                            for alias in node.names} & names - {path.stem}

    def cycle_from(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        for imported in sorted(graph[module]):
            found = cycle_from(imported, path + [module])
            if found:
                return found
        return None

    cycles = [" -> ".join(found) for module in sorted(graph) if (found := cycle_from(module, []))]
    assert not cycles, cycles
    writes = []
    for name in ("receiver", "lean", "fallback"):
        tree = ast.parse((package / f"{name}.py").read_text())
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) \
                        and isinstance(target.value.value, ast.Name) and target.value.value.id == "self":
                    writes.append(f"{name}.py:{node.lineno}: {ast.unparse(target)}")
    assert not writes, writes
