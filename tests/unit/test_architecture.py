"""The layering of docs/architecture.md, checked from the imports (an `import` anywhere in a module,
lazy ones and those under `TYPE_CHECKING` included, counts)."""

from __future__ import annotations

import ast
from pathlib import Path

import racefuzz

PACKAGE = Path(racefuzz.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every absolute name `path` imports: modules, and `module.name` for each name taken from one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


SOURCES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
MODULES = {name: _imports(path) for name, path in SOURCES.items()}


def _dependencies(path: Path) -> set[str]:
    """The package's modules `path` imports: `from pkg import sub` is an edge to `pkg.sub` where that is a
    module, else (a name defined in, or handed on by, `pkg`) to `pkg`; `import a.b` is an edge to `a.b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in SOURCES)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in SOURCES:
                    found.add(submodule)
                elif node.module in SOURCES:
                    found.add(node.module)
    found.discard(_module_name(path))
    return found


GRAPH = {name: _dependencies(path) for name, path in SOURCES.items()}
"""Module -> the package's modules it imports."""


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle through each strongly connected set of `graph` that has one (Tarjan's algorithm,
    iterative): the modules of the set in the order of a walk back to where it started."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_walk_around(component, graph) for component in components]


def _walk_around(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A circle inside `component` (every member reaches every other): from its first member, the shortest
    way back to it, so that a failure names the files and the order of the imports to open."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


SCENARIO_PACKAGES = ("racefuzz.scenarios.sglang",)
"""Scenario implementations: only they and the commands that are about sglang's costs may import them."""

GENERIC = [name for name in MODULES if not name.startswith((*SCENARIO_PACKAGES, "racefuzz.bench"))]

CORE = (
    "racefuzz.program",
    "racefuzz.hb",
    "racefuzz.memory",
    "racefuzz.oracle",
    "racefuzz.sim",
    "racefuzz.execution",
    "racefuzz.schedule",
    "racefuzz.device",
    "racefuzz.designs",
    "racefuzz.scenarios",
    "racefuzz.schedulers",
)
"""The core of docs/architecture.md: it imports nothing from the layers above it, the backends included."""

PURE_CORE = (*CORE, "racefuzz.results", "racefuzz.search", "racefuzz.backends")
"""What imports neither torch nor cupy (the CUDA backend's own package excepted: it imports them lazily)."""

FACE = ("racefuzz.cli", "racefuzz.commands", "racefuzz.pytest_plugin", "racefuzz.testing")
"""What users call: the command, its subcommands, the pytest plugin and the assertions."""

ABOVE_THE_CORE = (
    *FACE,
    "racefuzz.report",
    "racefuzz.timeline",
    "racefuzz.lint",
    "racefuzz.progress",
    "racefuzz.prove",
    "racefuzz.selfcheck",
    "racefuzz.testing_programs",
    "racefuzz.trace",
    "racefuzz.search",
    "racefuzz.results",
    "racefuzz.backends",
)
"""The layers of docs/architecture.md above the core."""

LEAVES = ("racefuzz.watchdog", "racefuzz.errors", "racefuzz.exitcodes", "racefuzz.outputs", "racefuzz.progress")
"""Stdlib-only modules any layer may import: `watchdog` (the checkpoint a design hook passes, signals, the
per-example watchdog), the exceptions and exit codes, output paths and their fallback, progress lines."""

SCENARIO_SURFACE = ("racefuzz.scenarios.sglang.compare", "racefuzz.scenarios.sglang.real_kernels")
"""What lives with its scenario above the core: its own command (`Scenario.compare_command`, behind `racefuzz
compare`, which draws with the timeline) and its real-code step (sglang's own kernels, recorded by
`racefuzz.trace`)."""


def _imports_any(name: str, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(i for i in MODULES[name] if i.startswith(tuple(f"{p}." for p in prefixes)) or i in prefixes)


def _in(name: str, prefixes: tuple[str, ...]) -> bool:
    return name in prefixes or name.startswith(tuple(f"{p}." for p in prefixes))


def test_the_tree_was_found() -> None:
    assert "racefuzz.search.driver" in MODULES and "racefuzz.scenarios.sglang.loop" in MODULES
    assert "racefuzz.trace.recorder" in MODULES and "racefuzz.report" in MODULES
    assert len(GENERIC) > 20
    # The edges are the imports: spot checks of the two kinds of `from ... import ...`.
    assert "racefuzz.hb" in GRAPH["racefuzz.sim"]  # a name taken from a module
    assert "racefuzz.trace.fastpath" in GRAPH["racefuzz.trace.torch_mode"]  # a submodule taken from a package
    assert "racefuzz.trace" not in GRAPH["racefuzz.trace.torch_mode"]


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert _circles(graph) == [["a", "b", "c", "a"], ["f", "g", "f"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_package() -> None:
    circles = _circles(GRAPH)
    assert not circles, " ; ".join(" -> ".join(circle) for circle in circles)


def test_no_module_of_the_trace_names_sglang() -> None:
    """The recorder is generic: sglang's real-code step lives with sglang's scenario (`SCENARIO_SURFACE`)."""
    trace = [name for name in MODULES if _in(name, ("racefuzz.trace",))]
    assert len(trace) > 10
    offenders = {name: sorted(i for i in MODULES[name] if "sglang" in i) for name in trace}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders
    mentions = [name for name in trace if "sglang" in SOURCES[name].read_text().lower()]
    assert not mentions, mentions


def test_no_generic_module_imports_a_scenario_implementation() -> None:
    offenders = {name: _imports_any(name, SCENARIO_PACKAGES) for name in GENERIC}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_the_report_reads_results_not_the_runner() -> None:
    """The reports and the timeline take `racefuzz.results`' plain data; the search makes it."""
    readers = [n for n in MODULES if _in(n, ("racefuzz.report", "racefuzz.timeline", "racefuzz.results"))]
    offenders = {name: _imports_any(name, ("racefuzz.search",)) for name in readers}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders
    assert "racefuzz.results" in GRAPH["racefuzz.report"] and "racefuzz.results" in GRAPH["racefuzz.timeline"]


def test_the_recorder_imports_neither_the_face_nor_the_search() -> None:
    trace = [name for name in MODULES if _in(name, ("racefuzz.trace",))]
    offenders = {name: _imports_any(name, (*FACE, "racefuzz.search")) for name in trace}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


RECORDER_FRONTENDS = (
    "racefuzz.trace.capture",
    "racefuzz.trace.torch_mode",
    "racefuzz.trace.cuda_api",
    "racefuzz.trace.triton_launches",
    "racefuzz.trace.torch_patches",
)
"""What installs the recorder's hooks into torch, `torch.cuda` and Triton, and reports to the recorder."""

RECORDER_CORE = ("racefuzz.trace.recorder", "racefuzz.trace.storages", "racefuzz.trace.sources")
"""What the frontends report to: the recorder, its storage table, its source lines."""

OP_ANALYSIS = ("racefuzz.trace.op_schemas", "racefuzz.trace.sync_rules")
"""Read and write sets and host syncs from an op's schema: analysis of an op, of no recorder."""


def test_the_recorder_does_not_import_its_frontends_nor_the_op_analysis_the_recorder() -> None:
    """The frontends call the recorder, never the other way; the op analysis knows neither (CSAN's
    `ArgumentHandler` knows no `EventHandler`)."""
    for name in (*RECORDER_CORE, *OP_ANALYSIS):
        assert name in GRAPH, name
    offenders = {name: sorted(GRAPH[name] & {*RECORDER_FRONTENDS}) for name in RECORDER_CORE}
    offenders |= {name: sorted(GRAPH[name] & {*RECORDER_FRONTENDS, *RECORDER_CORE}) for name in OP_ANALYSIS}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders
    assert not _imports_any("racefuzz.trace.sync_rules", ("torch",))  # the tensor type is handed in


def test_the_pure_core_does_not_import_the_backends() -> None:
    """A backend runs what the core describes: the simulator's `Execution` is `racefuzz.execution`'s."""
    core = [n for n in MODULES if _in(n, CORE) and n not in SCENARIO_SURFACE]
    offenders = {name: _imports_any(name, ("racefuzz.backends",)) for name in core}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_the_pure_core_imports_neither_torch_nor_cupy() -> None:
    core = [n for n in MODULES if _in(n, PURE_CORE) and not _in(n, ("racefuzz.backends.cuda", *SCENARIO_SURFACE))]
    offenders = {name: _imports_any(name, ("torch", "cupy")) for name in core}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_no_module_imports_the_cli_but_the_entry_point() -> None:
    offenders = [name for name, imports in MODULES.items() if "racefuzz.cli" in imports and name != "racefuzz.__main__"]
    assert not offenders, offenders


def test_the_package_imports_nothing_of_the_repository_around_it() -> None:
    """The benchmarks (`ci.bench`) and the tests use the package; the wheel, which ships neither, runs alone."""
    offenders = {name: _imports_any(name, ("ci", "tests", "properties")) for name in MODULES}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = {
        name: sorted(i for i in imports if i.startswith("racefuzz.") and i.rsplit(".", 1)[-1].startswith("_"))
        for name, imports in MODULES.items()
    }
    offenders = {k: [i for i in v if not i.endswith("__version__")] for k, v in offenders.items()}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_the_core_imports_nothing_from_the_layers_above_it() -> None:
    core = [n for n in MODULES if _in(n, CORE) and n not in SCENARIO_SURFACE]
    offenders = {name: _imports_any(name, ABOVE_THE_CORE) for name in core}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_the_leaves_import_only_leaves() -> None:
    for leaf in LEAVES:
        inside = {i for i in GRAPH[leaf] if i.startswith("racefuzz")}
        assert inside <= set(LEAVES), (leaf, inside)
