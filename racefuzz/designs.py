"""Sync designs: where the fences of the overlap loop go. Built-ins, and loading a user's design.

A design is any object -- a module, a class instance, a `types.SimpleNamespace` -- with a `name` and some
of these hooks, each called with the `LoopContext` (see `racefuzz.scenarios.sglang`):

    loop_top        schedule side, at the top of every iteration (sglang's `_apply_war_barrier` until #31687)
    prepare_decode  host, at the top of DFLASH `prepare_for_decode` (decode iterations only)
    plan_enter      plan stream, on entering the plan context (default: plan.wait_stream(schedule))
    plan_fence      plan stream, before the over-allocation write (plan stream only)
    plan_exit       on leaving the plan context (default: schedule.wait_stream(plan))
    before_verify   forward stream, after the draft's reads, before the verify page-table build (decode)
    after_reads     forward stream, right after the forward's last read of req_to_token
    forward_end     forward stream, at the end of the forward
    after_launch    right after run_batch, before result processing (#31687's barrier position)
    wait_result     host, before processing forward k-1's result; called as (ctx, copy_done)
                    (default: copy_done.synchronize())

and optionally `headroom_blocks` (over-allocation headroom in blocks, default 2) and `description`.
Nothing to subclass: see README's "write your own design" for a complete one in a dozen lines.

Besides the built-ins, `load_design` knows the deliberately broken designs of `racefuzz.designs.mutants`
by name (`mutant-...`); they are not built-ins (`BUILTIN` lists the designs one would ship).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

from racefuzz.designs import global_war, none, read_done, self_event, war_after_launch
from racefuzz.errors import InvalidArgument
from racefuzz.scenarios.sglang import Hooks

BUILTIN: dict[str, object] = {
    module.design.name: module.design  # type: ignore[attr-defined]
    for module in (none, self_event, global_war, read_done, war_after_launch)
}
"""The built-in designs by name."""


@dataclass(frozen=True)
class Design:
    """A loaded design: its name, one-line description, where it came from, and the hook object."""

    name: str
    description: str
    spec: str
    hooks: object


def describe(obj: object) -> str:
    doc = getattr(obj, "description", None) or (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else "(no description)"


def check_design(obj: object, spec: str) -> None:
    """Raise `InvalidArgument` unless `obj` looks like a design: a name, callable hooks, and no attribute
    that looks like a misspelt hook (a typo would silently leave that fence out)."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{spec} is not a design: it has no `name` string attribute")
    for attr in dir(obj):
        if attr.startswith("_") or attr in Hooks.NAMES or not callable(getattr(obj, attr, None)):
            continue
        close = difflib.get_close_matches(attr, Hooks.NAMES, n=1, cutoff=0.8)
        if close:
            raise InvalidArgument(f"{spec}: {attr!r} is not a design hook; did you mean {close[0]!r}?")
    hooks = [h for h in Hooks.NAMES if getattr(obj, h, None) is not None]
    for hook in hooks:
        if not callable(getattr(obj, hook)):
            raise InvalidArgument(f"{spec}: hook {hook!r} is not callable")
    headroom = getattr(obj, "headroom_blocks", 2)
    if isinstance(headroom, bool) or not isinstance(headroom, int) or headroom < 0:
        raise InvalidArgument(f"{spec}: headroom_blocks must be a non-negative int, got {headroom!r}")


def mutant_designs() -> dict[str, object]:
    """The mutants by name (`racefuzz.designs.mutants.MUTANTS`), imported on first use."""
    from racefuzz.designs.mutants import MUTANTS

    return MUTANTS


def load_design(spec: str) -> Design:
    """A built-in design or a mutant by name, or `package.module:attribute` (a design object or a module)."""
    if spec in BUILTIN:
        obj = BUILTIN[spec]
        return Design(spec, describe(obj), spec, obj)
    if spec.startswith("mutant-") and spec in mutant_designs():
        obj = mutant_designs()[spec]
        return Design(spec, describe(obj), spec, obj)
    if ":" not in spec and "." not in spec:
        raise InvalidArgument(
            f"unknown design {spec!r}; built-in designs: {', '.join(BUILTIN)} (or module:attr; the deliberately "
            "broken `mutant-*` designs are listed in racefuzz.designs.mutants)"
        )
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import design module {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module raised while importing
        raise InvalidArgument(f"importing design module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj = module
    if attr:
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    check_design(obj, spec)
    return Design(str(obj.name), describe(obj), spec, obj)  # type: ignore[attr-defined]
