"""Request streams the harness feeds sglang's scheduler: when each request arrives (loop iteration),
its prompt length and how many tokens it generates (then it finishes and its `req_to_token` row is freed,
for a later request to reuse).

`FIXED` is the small stream CI runs: two prefills at once, their decodes, the short one finishing while
the long one decodes, and a third request arriving later that takes the freed row (the pool has two rows).
`workloads()` draws others with Hypothesis (the same shape, drawn).

A workload also names the speculative decoding the scheduler runs (`spec`: `none`, or `dflash` for sglang's
own DFLASH worker v2 over the fake target and draft models) and, for DFLASH, whether
`DFlashDraftInputV2.prepare_for_decode` runs on sglang's overlap plan stream (`plan_stream`: sglang's
`SGLANG_ENABLE_OVERLAP_PLAN_STREAM`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Request:
    """One request: `rid`, the iteration it arrives at, its prompt length and output length (tokens)."""

    rid: str
    arrival: int
    prompt_len: int
    output_len: int


SPECS = ("none", "dflash")
"""The speculative algorithms a workload may run: none, or sglang's DFLASH (worker v2)."""


@dataclass(frozen=True)
class Workload:
    """A request stream, the iteration budget after which the loop is stopped regardless, and the
    speculative decoding it runs (`spec`, one of `SPECS`; `plan_stream` only with `dflash`)."""

    requests: tuple[Request, ...]
    max_iterations: int = 40
    pool_rows: int = 2
    spec: str = "none"
    plan_stream: bool = False

    def __post_init__(self) -> None:
        if self.spec not in SPECS:
            raise ValueError(f"spec must be one of {', '.join(SPECS)}, got {self.spec!r}")
        if self.plan_stream and self.spec != "dflash":
            raise ValueError("plan_stream needs spec dflash (only DFLASH's prepare_for_decode has a plan stream)")

    def describe(self) -> str:
        parts = [f"{r.rid}@{r.arrival}:{r.prompt_len}+{r.output_len}" for r in self.requests]
        spec = "" if self.spec == "none" else f", {self.spec}" + (" on the plan stream" if self.plan_stream else "")
        return f"{len(self.requests)} requests ({', '.join(parts)}), {self.pool_rows} rows{spec}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "requests": [[r.rid, r.arrival, r.prompt_len, r.output_len] for r in self.requests],
            "max_iterations": self.max_iterations,
            "pool_rows": self.pool_rows,
        }
        if self.spec != "none":
            data["spec"] = self.spec
            data["plan_stream"] = self.plan_stream
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Workload:
        return Workload(
            tuple(Request(str(a), int(b), int(c), int(d)) for a, b, c, d in data["requests"]),
            int(data.get("max_iterations", 40)),
            int(data.get("pool_rows", 2)),
            str(data.get("spec", "none")),
            bool(data.get("plan_stream", False)),
        )

    def with_spec(self, spec: str, plan_stream: bool = False) -> Workload:
        """This request stream under another speculative algorithm (the same workloads, DFLASH on or off)."""
        return replace(self, spec=spec, plan_stream=plan_stream)


FIXED = Workload(
    (
        Request("r0", 0, 12, 2),
        Request("r1", 0, 20, 5),
        Request("r2", 2, 16, 2),
    ),
)


def workloads(max_requests: int = 4) -> Any:
    """A Hypothesis strategy of `Workload`s: 1..max_requests requests, arrivals 0..4, prompts 1..40
    tokens, outputs 1..6 tokens, 1..3 pool rows (fewer rows than requests forces row reuse)."""
    from hypothesis import strategies as st

    request = st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(1, 6))

    def build(spec: tuple[list[tuple[int, int, int]], int]) -> Workload:
        items, rows = spec
        requests = tuple(Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(sorted(items)))
        return Workload(requests, pool_rows=rows)

    return st.tuples(st.lists(request, min_size=1, max_size=max_requests), st.integers(1, 3)).map(build)
