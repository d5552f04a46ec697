"""Sync designs: where the fences go. Loading a built-in or a user's design for a scenario.

A design is any object -- a module, a class instance, a `types.SimpleNamespace` -- with a `name` and
some of its scenario's hooks (`Scenario.hook_names`), each called at the point of the scenario's host
program where that system's sync code sits. Nothing to subclass. A design names its scenario with a
`scenario` attribute (a built-in name such as "sglang-overlap", `module:attr`, or the scenario object);
without one it belongs to the default scenario, sglang's overlap loop, whose hooks are documented in
`racefuzz.scenarios.sglang.loop` and whose built-ins live in `racefuzz.scenarios.sglang.designs`.

`load_design` also knows a scenario's deliberately broken designs (`mutant-...`) by name; they are not
built-ins (`racefuzz designs --mutants` lists them). A user's design is `package.module:attr` (imported with
the working directory on the import path, as `python -m` does) or `path/to/file.py:attr`; its hooks are
wrapped (`GuardedHooks`) so that an exception in one is a `UserCodeError` naming the hook and the user's
own frame, not a traceback through racefuzz.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from racefuzz.errors import InvalidArgument, UserCodeError
from racefuzz.scenarios import Scenario, get_scenario
from racefuzz.watchdog import checkpoint

PACKAGE_DIR = str(Path(__file__).resolve().parent)
"""Frames under this directory are racefuzz's own; the first frame outside it is the user's."""


@dataclass(frozen=True)
class Design:
    """A loaded design: its name, one-line description, where it came from, its hook object and scenario."""

    name: str
    description: str
    spec: str
    hooks: object
    scenario: Scenario


def label(design: Design) -> str:
    """How reports and messages name a design: as the user named it (a built-in's name, or the
    `module:attr` / `path/to/file.py:attr` given), so that a report's header, the run's first line and its
    last line name it alike, and each can be pasted back into `--design`."""
    return design.spec


def describe(obj: object) -> str:
    """The first line of a design's `description` (or docstring)."""
    doc = getattr(obj, "description", None) or (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else "(no description)"


def check_design(obj: object, spec: str, scenario: Scenario) -> None:
    """Raise `InvalidArgument` unless `obj` looks like a design of `scenario`: a name, callable hooks, and no
    attribute that looks like a misspelt hook (a typo would silently leave that fence out)."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{spec} is not a design: it has no `name` string attribute")
    hook_names = scenario.hook_names
    for attr in dir(obj):
        if attr.startswith("_") or attr in hook_names or not callable(getattr(obj, attr, None)):
            continue
        close = difflib.get_close_matches(attr, hook_names, n=1, cutoff=0.8)
        if close:
            raise InvalidArgument(f"{spec}: {attr!r} is not a design hook; did you mean {close[0]!r}?")
    for hook in hook_names:
        if getattr(obj, hook, None) is not None and not callable(getattr(obj, hook)):
            raise InvalidArgument(f"{spec}: hook {hook!r} is not callable")
    scenario.check_design(obj, spec)


def scenario_of(obj: object, default: Scenario | str | None = None) -> Scenario:
    """The scenario a design object belongs to: its `scenario` attribute, else `default`."""
    declared = getattr(obj, "scenario", None)
    return get_scenario(declared if declared is not None else default)  # type: ignore[arg-type]


def load_design(spec: str, scenario: Scenario | str | None = None) -> Design:
    """A built-in design or a mutant of `scenario` (default: sglang's overlap loop) by name, or
    `package.module:attribute` / `path/to/file.py:attribute` (a design object or a module), whose own
    `scenario` attribute wins. Any problem is one-line `InvalidArgument`; an exception raised while
    importing the user's module is a `UserCodeError`."""
    home = get_scenario(scenario)
    builtin = home.designs()
    if spec in builtin:
        obj = builtin[spec]
        return Design(spec, describe(obj), spec, obj, home)
    if spec.startswith("mutant-") and spec in home.mutants():
        obj = home.mutants()[spec]
        return Design(spec, describe(obj), spec, obj, home)
    file_path, module_name, attr = split_spec(spec)
    if file_path is None and ":" not in spec and "." not in spec:
        close = difflib.get_close_matches(spec, [*builtin, *home.mutants()], n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InvalidArgument(
            f"unknown design {spec!r}; {hint}built-in designs: {', '.join(builtin)} (or module:attr or "
            "path/to/file.py:attr; the deliberately broken `mutant-*` designs are listed by "
            "`racefuzz designs --mutants`)"
        )
    module = _import_file(file_path, spec) if file_path is not None else _import_module(module_name)
    obj: object = module
    if attr:
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(module) if not n.startswith("_")]
            close = difflib.get_close_matches(attr, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            where = f"design file {str(file_path)!r}" if file_path is not None else f"module {module_name!r}"
            raise InvalidArgument(f"{where} has no attribute {attr!r}{hint}") from None
    owner = scenario_of(obj, home)
    check_design(obj, spec, owner)
    hooks = GuardedHooks(obj, spec, owner.hook_names)
    return Design(str(obj.name), describe(obj), spec, hooks, owner)  # type: ignore[attr-defined]


def split_spec(spec: str) -> tuple[Path | None, str, str]:
    """(file path or None, module name, attribute) of a user's design (or traced step) spec."""
    left, colon, attr = spec.rpartition(":")
    if not colon:
        left, attr = spec, ""
    if left.endswith(".py") or "/" in left or os.sep in left:
        return Path(left), "", attr
    module_name, _, attr = spec.partition(":")
    return None, module_name, attr


def working_directory_on_path() -> str:
    """Put the working directory on the import path (if nothing there stands for it yet); returns it."""
    # The console script does not put the working directory on the import path (`python -m` does): a design
    # beside the user (`racefuzz run --design mypkg.sync:design`, or a file importing `mypkg`) must import
    # as it does in their tests.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    return cwd


def import_user_file(path: Path, spec: str, kind: str = "design"):
    """The user's module in the file `path`, for the `kind` ("design", "step") `spec` names: a file that is
    not there is an `InvalidArgument`; one that raises -- or calls sys.exit -- while it is imported is a
    `UserCodeError` naming the user's frame."""
    return _import_file(path, spec, kind)


def _import_module(module_name: str, kind: str = "design"):
    cwd = working_directory_on_path()
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and module_name.startswith(exc.name):  # the design's own module is missing
            raise InvalidArgument(
                f"cannot import {kind} module {module_name!r}: {exc} (searched from {cwd}; a file path such as "
                f"path/to/{'sync' if kind == 'design' else 'steps'}.py:{kind} works too)"
            ) from None
        raise UserCodeError(
            f"importing {kind} module {module_name!r} failed: {type(exc).__name__}: {exc}{user_frame(exc)}",
            traceback.format_exc(),
        ) from None
    except (Exception, SystemExit) as exc:  # the user's module raised (or called sys.exit) while importing
        raise UserCodeError(
            f"importing {kind} module {module_name!r} failed: {type(exc).__name__}: {one_line(exc)}{user_frame(exc)}",
            traceback.format_exc(),
        ) from None


def _import_file(path: Path, spec: str, kind: str = "design"):
    if not path.is_file():
        raise InvalidArgument(f"{kind} {spec!r}: no such file {str(path)!r}")
    if path.suffix != ".py":
        raise InvalidArgument(f"{kind} {spec!r}: {str(path)!r} is not a .py file")
    resolved = path.resolve()
    working_directory_on_path()
    # One module per file, under a name that cannot clash with the user's packages.
    name = "racefuzz_design_" + "".join(c if c.isalnum() else "_" for c in str(resolved))
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, resolved)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # sys.exit() at import is the user's error too, not an exit code
        del sys.modules[name]
        raise UserCodeError(
            f"importing {kind} file {str(path)!r} failed: {type(exc).__name__}: {one_line(exc)}{user_frame(exc)}",
            traceback.format_exc(),
        ) from None
    return module


def one_line(exc: BaseException) -> str:
    text = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, SystemExit):  # `sys.exit()` reads better than an empty message or a bare code
        return f"sys.exit({exc.code!r}) was called" if text else "sys.exit() was called"
    return text


def user_frame(exc: BaseException) -> str:
    """ " (at file:line in function)" for the innermost traceback frame outside racefuzz, else ""."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(PACKAGE_DIR)]
    frames = [f for f in frames if not f.filename.startswith("<frozen")]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {_short(frame.filename)}:{frame.lineno} in {frame.name})"


def _short(filename: str) -> str:
    try:
        return os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename


def _defined_at(hook: Callable[..., object]) -> str:
    function = getattr(hook, "__func__", hook)
    code = getattr(function, "__code__", None)
    if code is None:
        return ""
    return f"; defined at {_short(code.co_filename)}:{code.co_firstlineno}"


class GuardedHooks:
    """A user design's hooks, each turning an exception into a one-line `UserCodeError` that names the hook and
    the user's own frame (the full traceback in `details`); every other attribute is the design's own.

    `first_error` keeps the first such error: inside a Hypothesis search a hook that raised once and not when
    Hypothesis re-ran the example is reported as flaky there and could be lost; callers re-raise it after
    the search (`raise_hook_error`).

    Built-in designs are not wrapped: an exception in one is a bug in racefuzz."""

    def __init__(self, design: object, spec: str, hook_names: tuple[str, ...]) -> None:
        self.design = design
        self.first_error: UserCodeError | None = None
        for name in hook_names:
            hook = getattr(design, name, None)
            if hook is not None:
                setattr(self, name, _guard(hook, name, spec, self))

    def __getattr__(self, name: str) -> object:  # only called for what __init__ did not set
        return getattr(self.design, name)


def raise_hook_error(design: Design) -> None:
    """Raise the first error a user design's hook raised, if any (see `GuardedHooks.first_error`)."""
    error = getattr(design.hooks, "first_error", None) if isinstance(design.hooks, GuardedHooks) else None
    if error is not None:
        raise error


def _guard(hook: Callable[..., object], name: str, spec: str, owner: GuardedHooks) -> Callable[..., object]:
    doing = f"hook {name} of design {spec}"

    def guarded(*args: object, **kwargs: object) -> object:
        checkpoint(doing)  # Ctrl-C and the watchdog see a hook that never returns as this one
        try:
            return hook(*args, **kwargs)
        except UserCodeError:
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a hook must not become racefuzz's exit code
            error = _user_code_error(exc, hook, name, spec, args, kwargs)
            if owner.first_error is None:
                owner.first_error = error
            raise error from None

    guarded.__name__ = name
    guarded.__wrapped__ = hook  # type: ignore[attr-defined]
    return guarded


def _user_code_error(
    exc: BaseException, hook: Callable[..., object], name: str, spec: str, args: tuple, kwargs: dict
) -> UserCodeError:
    """The one-line error for `exc`, raised by the hook `name` or by calling it (a wrong signature)."""
    details = "".join(traceback.format_exception(exc))
    where = user_frame(exc)
    if isinstance(exc, TypeError) and not where:
        try:
            inspect.signature(hook).bind(*args, **kwargs)
        except TypeError:  # the call itself failed: the hook's signature is wrong
            return UserCodeError(
                f"design {spec}: hook {name} cannot be called with {len(args)} argument(s): "
                f"{one_line(exc)}{_defined_at(hook)}",
                details,
            )
        except ValueError:  # no signature to check (a builtin)
            pass
    return UserCodeError(
        f"design {spec}: hook {name} raised {type(exc).__name__}: {one_line(exc)}{where or _defined_at(hook)}",
        details,
    )
