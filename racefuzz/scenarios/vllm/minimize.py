"""The vLLM scenario's structural minimizer candidates: simpler workloads, most promising first."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from racefuzz.errors import InvalidArgument
from racefuzz.scenarios.vllm.workload import RequestSpec, Workload


def _simpler_requests(r: RequestSpec) -> Iterator[RequestSpec]:
    if r.arrival:
        yield replace(r, arrival=0)
    if r.eos:
        yield replace(r, eos=False)
    if r.remote:
        yield replace(r, remote=False)
    if r.output_len > 1:
        yield replace(r, output_len=r.output_len - 1)
    if r.prompt_len > 1:
        yield replace(r, prompt_len=max(1, r.prompt_len // 2))
        yield replace(r, prompt_len=r.prompt_len - 1)


def _valid(w: Workload, **changes: object) -> Iterator[Workload]:
    """`w` with `changes`, if that is a valid workload (fewer blocks than a request needs is not)."""
    try:
        yield replace(w, **changes)  # type: ignore[arg-type]
    except InvalidArgument:
        return


def simpler_workloads(w: Workload) -> Iterator[Workload]:
    for steps in range(1, w.steps):
        yield from _valid(w, steps=steps)
    if len(w.requests) > 1:
        for i in range(len(w.requests)):
            rest = w.requests[:i] + w.requests[i + 1 :]
            # The pool shrunk by the removed request's blocks first: as tight for the rest as it was for all.
            tight = max(max(w.blocks_needed(r) for r in rest), w.num_blocks - w.blocks_needed(w.requests[i]))
            if tight < w.num_blocks:
                yield from _valid(w, requests=rest, num_blocks=tight)
            yield from _valid(w, requests=rest)
    if w.async_scheduling:
        yield from _valid(w, async_scheduling=False)
    if w.num_blocks > 1:
        yield from _valid(w, num_blocks=w.num_blocks - 1)
    for i, r in enumerate(w.requests):
        for simpler in _simpler_requests(r):
            yield from _valid(w, requests=(*w.requests[:i], simpler, *w.requests[i + 1 :]))
    if w.block_size > 1:
        yield from _valid(w, block_size=w.block_size - 1)
