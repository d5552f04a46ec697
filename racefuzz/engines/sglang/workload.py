"""Request streams the harness feeds sglang's scheduler: when each request arrives (loop iteration),
its prompt length and how many tokens it generates (then it finishes and its `req_to_token` row is freed,
for a later request to reuse).

`FIXED` is the small stream CI runs: two prefills at once, their decodes, the short one finishing while
the long one decodes, and a third request arriving later that takes the freed row (the pool has two rows).
`workloads()` draws others with Hypothesis (the same shape, drawn).

A workload also names the speculative decoding the scheduler runs (`spec`: `none`, or `dflash` for sglang's
own DFLASH worker v2 over the fake target and draft models) and, for DFLASH, whether
`DFlashDraftInputV2.prepare_for_decode` runs on sglang's overlap plan stream (`plan_stream`: sglang's
`SGLANG_ENABLE_OVERLAP_PLAN_STREAM`), how the fake attention backend reads `req_to_token` (`attention`:
`flashinfer`, each request's own `[0, len)` as `create_flashinfer_kv_indices_triton` does, or `fa3`, the
eager FA3 page table `req_to_token[rows, :max_len]`: every row to the batch's longest), and whether the
radix cache is on (`radix_cache`: with it off sglang's `ChunkCache` never rewrites a prefill's row).
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
ATTENTION = ("flashinfer", "fa3")
"""The fake backend's read extents: each row's own length, or every row to the batch's longest."""


@dataclass(frozen=True)
class Workload:
    """A request stream, the iteration budget after which the loop is stopped regardless, and the
    speculative decoding it runs (`spec`, one of `SPECS`; `plan_stream` only with `dflash`)."""

    requests: tuple[Request, ...]
    max_iterations: int = 40
    pool_rows: int = 2
    spec: str = "none"
    plan_stream: bool = False
    attention: str = "flashinfer"
    radix_cache: bool = True

    def __post_init__(self) -> None:
        if self.spec not in SPECS:
            raise ValueError(f"spec must be one of {', '.join(SPECS)}, got {self.spec!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.plan_stream and self.spec != "dflash":
            raise ValueError("plan_stream needs spec dflash (only DFLASH's prepare_for_decode has a plan stream)")

    def describe(self) -> str:
        parts = [f"{r.rid}@{r.arrival}:{r.prompt_len}+{r.output_len}" for r in self.requests]
        spec = "" if self.spec == "none" else f", {self.spec}" + (" on the plan stream" if self.plan_stream else "")
        backend = "" if self.attention == "flashinfer" else f", {self.attention} reads"
        radix = "" if self.radix_cache else ", radix cache off"
        return f"{len(self.requests)} requests ({', '.join(parts)}), {self.pool_rows} rows{spec}{backend}{radix}"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "requests": [[r.rid, r.arrival, r.prompt_len, r.output_len] for r in self.requests],
            "max_iterations": self.max_iterations,
            "pool_rows": self.pool_rows,
        }
        if self.spec != "none":
            data["spec"] = self.spec
            data["plan_stream"] = self.plan_stream
        if self.attention != "flashinfer":
            data["attention"] = self.attention
        if not self.radix_cache:
            data["radix_cache"] = False
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Workload:
        return Workload(
            tuple(Request(str(a), int(b), int(c), int(d)) for a, b, c, d in data["requests"]),
            int(data.get("max_iterations", 40)),
            int(data.get("pool_rows", 2)),
            str(data.get("spec", "none")),
            bool(data.get("plan_stream", False)),
            str(data.get("attention", "flashinfer")),
            bool(data.get("radix_cache", True)),
        )

    def with_spec(
        self, spec: str, plan_stream: bool = False, attention: str | None = None, radix_cache: bool | None = None
    ) -> Workload:
        """This request stream under another speculative algorithm (the same workloads, DFLASH on or off),
        and, where given, another read extent or radix-cache setting."""
        return replace(
            self,
            spec=spec,
            plan_stream=plan_stream,
            attention=self.attention if attention is None else attention,
            radix_cache=self.radix_cache if radix_cache is None else radix_cache,
        )


FIXED = Workload(
    (
        Request("r0", 0, 12, 2),
        Request("r1", 0, 20, 5),
        Request("r2", 2, 16, 2),
    ),
)


def workloads(max_requests: int = 4, max_output: int = 6) -> Any:
    """A Hypothesis strategy of `Workload`s: 1..max_requests requests, arrivals 0..4, prompts 1..40
    tokens, outputs 1..max_output tokens, 1..3 pool rows (fewer rows than requests forces row reuse)."""
    from hypothesis import strategies as st

    request = st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(1, max_output))

    def build(spec: tuple[list[tuple[int, int, int]], int]) -> Workload:
        items, rows = spec
        requests = tuple(Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(sorted(items)))
        return Workload(requests, pool_rows=rows)

    return st.tuples(st.lists(request, min_size=1, max_size=max_requests), st.integers(1, 3)).map(build)
