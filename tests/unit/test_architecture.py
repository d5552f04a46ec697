"""The layering of docs/architecture.md, checked from the imports (an `import` anywhere in a module,
lazy ones included, counts)."""

from __future__ import annotations

import ast
from pathlib import Path

import racefuzz

PACKAGE = Path(racefuzz.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


MODULES = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}

SCENARIO_PACKAGES = ("racefuzz.scenarios.sglang",)
"""Scenario implementations: only they, the benchmarks (which measure sglang's scenario) and the commands
that are about sglang's costs may import them."""

GENERIC = [name for name in MODULES if not name.startswith(SCENARIO_PACKAGES) and not name.startswith("racefuzz.bench")]

CORE = (
    "racefuzz.program",
    "racefuzz.hb",
    "racefuzz.memory",
    "racefuzz.oracle",
    "racefuzz.sim",
    "racefuzz.schedule",
    "racefuzz.device",
    "racefuzz.designs",
    "racefuzz.scenarios",
    "racefuzz.schedulers",
)
"""The core of docs/architecture.md: it imports nothing from the layers above it."""

PURE_CORE = (*CORE, "racefuzz.search", "racefuzz.backends")
"""What imports neither torch nor cupy (the CUDA backend's own package excepted: it imports them lazily)."""


def _imports_any(name: str, prefixes: tuple[str, ...]) -> list[str]:
    return sorted(i for i in MODULES[name] if i.startswith(prefixes) or i in prefixes)


def test_the_tree_was_found() -> None:
    assert "racefuzz.search.driver" in MODULES and "racefuzz.scenarios.sglang.loop" in MODULES
    assert len(GENERIC) > 20


def test_no_generic_module_imports_a_scenario_implementation() -> None:
    offenders = {name: _imports_any(name, SCENARIO_PACKAGES) for name in GENERIC}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_the_pure_core_imports_neither_torch_nor_cupy() -> None:
    core = [n for n in MODULES if n.startswith(PURE_CORE) and not n.startswith("racefuzz.backends.cuda")]
    offenders = {name: _imports_any(name, ("torch", "cupy")) for name in core}
    assert not {k: v for k, v in offenders.items() if v}


def test_no_module_imports_the_cli_but_the_entry_point() -> None:
    offenders = [name for name, imports in MODULES.items() if "racefuzz.cli" in imports and name != "racefuzz.__main__"]
    assert not offenders, offenders


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = {
        name: sorted(i for i in imports if i.startswith("racefuzz.") and i.rsplit(".", 1)[-1].startswith("_"))
        for name, imports in MODULES.items()
    }
    offenders = {k: [i for i in v if not i.endswith("__version__")] for k, v in offenders.items()}
    assert not {k: v for k, v in offenders.items() if v}, offenders


USER_SURFACE = (
    "racefuzz.cli",
    "racefuzz.commands",
    "racefuzz.pytest_plugin",
    "racefuzz.testing",
    "racefuzz.report",
    "racefuzz.timeline",
    "racefuzz.outputs",
    "racefuzz.lint",
    "racefuzz.progress",
    "racefuzz.prove",
    "racefuzz.trace",
    "racefuzz.bench",
    "racefuzz.search",
)
"""The layers of docs/architecture.md above the core. `racefuzz.watchdog` (stdlib only: the checkpoint a design
hook passes, Ctrl-C, the per-example watchdog), `errors` and `exitcodes` are leaves any layer may import."""


SCENARIO_COMMANDS = ("racefuzz.scenarios.sglang.compare",)
"""A scenario's own command (`Scenario.compare_command`, behind `racefuzz compare`): user surface that lives
with its scenario, so it may draw with the timeline."""


def test_the_core_imports_nothing_from_the_layers_above_it() -> None:
    core = [n for n in MODULES if n.startswith(CORE) and n not in SCENARIO_COMMANDS]
    offenders = {name: _imports_any(name, USER_SURFACE) for name in core}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_leaves_import_only_leaves() -> None:
    for leaf in ("racefuzz.watchdog", "racefuzz.errors", "racefuzz.exitcodes"):
        inside = {i for i in MODULES[leaf] if i.startswith("racefuzz")}
        assert inside <= {"racefuzz.exitcodes", "racefuzz.exitcodes.ExitCode", "racefuzz.errors"}, (leaf, inside)
