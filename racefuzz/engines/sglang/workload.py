"""Request streams the harness feeds sglang's scheduler: when each request arrives (loop iteration),
its prompt length and how many tokens it generates (then it finishes and its `req_to_token` row is freed,
for a later request to reuse).

`FIXED` is the small stream CI runs: two prefills at once, their decodes, the short one finishing while
the long one decodes, and a third request arriving later that takes the freed row (the pool has two rows).
`workloads()` draws others with Hypothesis (the same shape, drawn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """One request: `rid`, the iteration it arrives at, its prompt length and output length (tokens)."""

    rid: str
    arrival: int
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class Workload:
    """A request stream and the iteration budget after which the loop is stopped regardless."""

    requests: tuple[Request, ...]
    max_iterations: int = 40
    pool_rows: int = 2

    def describe(self) -> str:
        parts = [f"{r.rid}@{r.arrival}:{r.prompt_len}+{r.output_len}" for r in self.requests]
        return f"{len(self.requests)} requests ({', '.join(parts)}), {self.pool_rows} rows"

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": [[r.rid, r.arrival, r.prompt_len, r.output_len] for r in self.requests],
            "max_iterations": self.max_iterations,
            "pool_rows": self.pool_rows,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Workload:
        return Workload(
            tuple(Request(str(a), int(b), int(c), int(d)) for a, b, c, d in data["requests"]),
            int(data.get("max_iterations", 40)),
            int(data.get("pool_rows", 2)),
        )


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
