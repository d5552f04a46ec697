"""The overlap scenario's structural minimizer candidates: simpler workloads, most promising first.

Hypothesis shrinks the bytes a workload is decoded from; it does not know that 7 bytes are a request or
that one header byte is the iteration count. `racefuzz.search.minimize` asks the scenario for these
candidates and keeps each that still fails the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from racefuzz.scenarios.sglang.workload import RequestSpec, Workload


def _simpler_requests(r: RequestSpec) -> Iterator[RequestSpec]:
    if r.arrival:
        yield replace(r, arrival=0)
    if r.accepts:  # down to none: a request that finishes at its prefill (max_new_tokens=1)
        yield replace(r, accepts=r.accepts[:-1])
    if any(a > 1 for a in r.accepts):
        yield replace(r, accepts=tuple(1 for _ in r.accepts))
    if r.swa_recovery:
        yield replace(r, swa_recovery=False)
    for step in r.rewrite_at:
        yield replace(r, rewrite_at=tuple(s for s in r.rewrite_at if s != step))
    if r.prompt_len > 1:
        yield replace(r, prompt_len=max(1, r.prompt_len // 2))
        yield replace(r, prompt_len=r.prompt_len - 1)
    if r.chunk < r.prompt_len:
        yield replace(r, chunk=64)


def simpler_workloads(w: Workload) -> Iterator[Workload]:
    for iterations in range(1, w.iterations):
        yield replace(w, iterations=iterations)
    for i in range(len(w.requests)):
        if len(w.requests) > 1:
            rest = w.requests[:i] + w.requests[i + 1 :]
            yield replace(w, requests=rest, rows=min(w.rows, len(rest)))
    if w.plan_stream:
        yield replace(w, plan_stream=False)
    if w.page_size > 1:
        yield replace(w, page_size=1)
    if w.read_extent != "exact":
        yield replace(w, read_extent="exact")
    if w.read_extent == "reserved":
        yield replace(w, read_extent="rectangle")
    if w.rows > 1:
        yield replace(w, rows=w.rows - 1)
    for i, r in enumerate(w.requests):
        for simpler in _simpler_requests(r):
            yield replace(w, requests=(*w.requests[:i], simpler, *w.requests[i + 1 :]))
    if w.block_size > 1 and all(a < w.block_size for r in w.requests for a in r.accepts):
        yield replace(w, block_size=w.block_size - 1)
