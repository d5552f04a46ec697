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
radix cache is on (`radix_cache`: with it off sglang's `ChunkCache` never rewrites a prefill's row),
the prefill chunk (`chunked_prefill`: sglang's `chunked_prefill_size`, tokens; 0 is off, sglang's -1: a prompt
goes in one forward) and whether a prefill is mixed with the running decodes (`mixed_chunk`: sglang's
`enable_mixed_chunk`, which `Scheduler.is_mixed_chunk` takes only with a chunk size; then
`ScheduleBatch.mix_with_running` runs and the forward gathers the decodes' tokens by `mix_running_indices`,
the path of sglang #34076), and the KV page size (`page_size`: sglang's `server_args.page_size`; above 1
the pools are sglang's `PagedTokenToKVPoolAllocator` and a page-aligned `RadixCache`, and allocation runs
sglang's paged paths: the decode's last-slot read and `alloc_paged_token_slots_extend` / `_decode`), and
whether decodes replay CUDA graphs (`cuda_graph`: the fake worker's captured graphs, replayed through
sglang's `DecodeCudaGraphRunner.execute`, `graph_runner.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Request:
    """One request: `rid`, the iteration it arrives at, its prompt length and output length (tokens), and
    whether its prompt arrives as input embeddings (`embeds`: `TokenizedGenerateReqInput.input_embeds`;
    sglang never mixes such a prefill with the running decodes, 0.5.21 scheduler.py:4134, so it is how a
    workload puts an unmixed prefill between a decode and a mixed one)."""

    rid: str
    arrival: int
    prompt_len: int
    output_len: int
    embeds: bool = False

    def describe(self) -> str:
        return f"{self.rid}@{self.arrival}:{self.prompt_len}+{self.output_len}" + (" embeds" if self.embeds else "")

    def to_json(self) -> list[Any]:
        fields: list[Any] = [self.rid, self.arrival, self.prompt_len, self.output_len]
        return [*fields, True] if self.embeds else fields

    @staticmethod
    def from_json(fields: list[Any]) -> Request:
        rid, arrival, prompt_len, output_len, *rest = fields
        return Request(str(rid), int(arrival), int(prompt_len), int(output_len), bool(rest[0]) if rest else False)


SPECS = ("none", "dflash")
"""The speculative algorithms a workload may run: none, or sglang's DFLASH (worker v2)."""
ATTENTION = ("flashinfer", "fa3")
"""The fake backend's read extents: each row's own length, or every row to the batch's longest."""
MAX_PAGE_SIZE = 64
"""The largest KV page size a workload may name (a power of two; the harness's rows hold 256 tokens)."""


def check_page_size(page_size: int) -> None:
    """`ValueError` unless `page_size` is a power of two from 1 to `MAX_PAGE_SIZE`."""
    if not (1 <= page_size <= MAX_PAGE_SIZE and page_size & (page_size - 1) == 0):
        raise ValueError(f"page_size must be a power of two from 1 to {MAX_PAGE_SIZE}, got {page_size}")


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
    chunked_prefill: int = 0
    mixed_chunk: bool = False
    page_size: int = 1
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        if self.spec not in SPECS:
            raise ValueError(f"spec must be one of {', '.join(SPECS)}, got {self.spec!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.plan_stream and self.spec != "dflash":
            raise ValueError("plan_stream needs spec dflash (only DFLASH's prepare_for_decode has a plan stream)")
        if self.chunked_prefill < 0:
            raise ValueError(f"chunked_prefill must be 0 (off) or a chunk size in tokens, got {self.chunked_prefill}")
        if self.mixed_chunk and not self.chunked_prefill:
            raise ValueError("mixed_chunk needs chunked_prefill (sglang mixes only chunked prefills)")
        if self.mixed_chunk and self.spec != "none":
            raise ValueError("mixed_chunk needs spec none (the harness mixes chunks without speculative decoding)")
        check_page_size(self.page_size)
        if self.page_size > 1 and self.spec != "none":
            raise ValueError("page_size above 1 needs spec none (DFLASH is driven with page size 1 only)")
        if self.cuda_graph and self.spec != "none":
            raise ValueError("cuda_graph needs spec none (the harness replays decode graphs only without DFLASH)")
        if self.chunked_prefill % self.page_size:
            raise ValueError(
                f"chunked_prefill ({self.chunked_prefill}) must be a multiple of page_size ({self.page_size}), "
                "as sglang's ServerArgs asserts"
            )

    def describe(self) -> str:
        parts = [r.describe() for r in self.requests]
        spec = "" if self.spec == "none" else f", {self.spec}" + (" on the plan stream" if self.plan_stream else "")
        backend = "" if self.attention == "flashinfer" else f", {self.attention} reads"
        radix = "" if self.radix_cache else ", radix cache off"
        chunk = (
            f", chunks of {self.chunked_prefill}{' mixed' if self.mixed_chunk else ''}" if self.chunked_prefill else ""
        )
        pages = f", pages of {self.page_size}" if self.page_size > 1 else ""
        pages += ", decode in CUDA graphs" if self.cuda_graph else ""
        return (
            f"{len(self.requests)} requests ({', '.join(parts)}), {self.pool_rows} rows"
            f"{spec}{backend}{radix}{chunk}{pages}"
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "requests": [r.to_json() for r in self.requests],
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
        if self.chunked_prefill:
            data["chunked_prefill"] = self.chunked_prefill
            data["mixed_chunk"] = self.mixed_chunk
        if self.page_size > 1:  # absent: page size 1 (files written before the field read as they did)
            data["page_size"] = self.page_size
        if self.cuda_graph:  # absent: eager decode, as files written before the field
            data["cuda_graph"] = True
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Workload:
        return Workload(
            tuple(Request.from_json(fields) for fields in data["requests"]),
            int(data.get("max_iterations", 40)),
            int(data.get("pool_rows", 2)),
            str(data.get("spec", "none")),
            bool(data.get("plan_stream", False)),
            str(data.get("attention", "flashinfer")),
            bool(data.get("radix_cache", True)),
            int(data.get("chunked_prefill", 0)),
            bool(data.get("mixed_chunk", False)),
            int(data.get("page_size", 1)),
            bool(data.get("cuda_graph", False)),
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

    def with_page_size(self, page_size: int) -> Workload:
        """This request stream with KV pages of `page_size` tokens (a chunk size, if any, must divide by it)."""
        return replace(self, page_size=page_size)

    def with_cuda_graph(self, cuda_graph: bool) -> Workload:
        """This request stream with its decodes replayed from CUDA graphs, or eager."""
        return replace(self, cuda_graph=cuda_graph)


FIXED = Workload(
    (
        Request("r0", 0, 12, 2),
        Request("r1", 0, 20, 5),
        Request("r2", 2, 16, 2),
    ),
)


MIXED_CHUNK = Workload(
    (
        Request("r0", 0, 4, 10),
        Request("r1", 2, 4, 3, embeds=True),
        Request("r2", 3, 12, 2),
    ),
    pool_rows=4,
    chunked_prefill=8,
    mixed_chunk=True,
)
"""sglang #34076's seam (`--workload mixed-chunk`): r0 decodes; r1's prompt arrives as embeddings, so its
prefill runs unmixed and the next batch selection merges it into the running batch (`merge_batch`: a new
`req_pool_indices`, held by the running batch alone); r2's first chunk is then mixed with that batch
(`mix_with_running` aliases it as `mix_running_indices`, which the forward stream gathers in
`resolve_forward_inputs`), and that batch object's last reference (the 2-slot record ring's, from r0's
decode two iterations before) goes in the same `run_batch` (`record_batch_in_overlap`), after the gather
was enqueued and before anything waited for it."""


CUDA_GRAPHS = {"off": (False,), "on": (True,), "drawn": (False, True)}
"""`racefuzz sglang --cuda-graph`'s values as the settings `workloads(cuda_graphs=...)` draws from."""
CHUNK_SIZES = (4, 8, 16)
"""The prefill chunks (tokens) `workloads(mixed_chunk=True)` draws from."""


def workloads(
    max_requests: int = 4,
    max_output: int = 6,
    mixed_chunk: bool = False,
    page_sizes: tuple[int, ...] = (1,),
    cuda_graphs: tuple[bool, ...] = (False,),
) -> Any:
    """A Hypothesis strategy of `Workload`s: 1..max_requests requests, arrivals 0..4, prompts 1..40
    tokens, outputs 1..max_output tokens, 1..3 pool rows (fewer rows than requests forces row reuse).
    With `mixed_chunk`: mixed chunked prefill on, a chunk of `CHUNK_SIZES`, 2..4 pool rows, and each
    request's prompt as embeddings or not (`Request.embeds`: an unmixed prefill). `page_sizes`: the KV page
    sizes drawn from (one: every workload has it; several: drawn per workload, shrinking toward the first;
    with `mixed_chunk` the chunk is then drawn among the multiples of the page, else the page itself). With
    the defaults the strategy draws what it drew before the page size was a dimension (the same examples for
    the same seed). `cuda_graphs`: whether decodes replay CUDA graphs, drawn the same way (one value: every
    workload; both: drawn per workload)."""
    from hypothesis import strategies as st

    if not cuda_graphs:
        raise ValueError("cuda_graphs must name at least one setting")
    for page_size in page_sizes:
        check_page_size(page_size)
    if not page_sizes:
        raise ValueError("page_sizes must name at least one page size")
    drawn = _mixed_workloads(max_requests, max_output, page_sizes) if mixed_chunk else _plain(max_requests, max_output)
    if not mixed_chunk and page_sizes != (1,):
        if len(page_sizes) == 1:
            drawn = drawn.map(lambda w: w.with_page_size(page_sizes[0]))
        else:
            drawn = st.tuples(drawn, st.sampled_from(page_sizes)).map(lambda pair: pair[0].with_page_size(pair[1]))
    if cuda_graphs == (False,):
        return drawn
    if len(cuda_graphs) == 1:
        return drawn.map(lambda w: w.with_cuda_graph(cuda_graphs[0]))
    return st.tuples(drawn, st.sampled_from(cuda_graphs)).map(lambda pair: pair[0].with_cuda_graph(pair[1]))


def _plain(max_requests: int, max_output: int) -> Any:
    from hypothesis import strategies as st

    request = st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(1, max_output))

    def build(spec: tuple[list[tuple[int, int, int]], int]) -> Workload:
        items, rows = spec
        requests = tuple(Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(sorted(items)))
        return Workload(requests, pool_rows=rows)

    return st.tuples(st.lists(request, min_size=1, max_size=max_requests), st.integers(1, 3)).map(build)


def _mixed_workloads(max_requests: int, max_output: int, page_sizes: tuple[int, ...]) -> Any:
    from hypothesis import strategies as st

    mixed_request = st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(1, max_output), st.booleans())

    def build_mixed(spec: tuple[list[tuple[int, int, int, bool]], int, tuple[int, int]]) -> Workload:
        items, rows, (chunk, page_size) = spec
        requests = tuple(Request(f"r{i}", a, p, o, e) for i, (a, p, o, e) in enumerate(sorted(items)))
        return Workload(requests, pool_rows=rows, chunked_prefill=chunk, mixed_chunk=True, page_size=page_size)

    if page_sizes == (1,):
        chunk_and_page = st.sampled_from(CHUNK_SIZES).map(lambda chunk: (chunk, 1))
    else:
        chunk_and_page = st.sampled_from(page_sizes).flatmap(
            lambda page: st.sampled_from([c for c in CHUNK_SIZES if c % page == 0] or [page]).map(lambda c: (c, page))
        )
    return st.tuples(st.lists(mixed_request, min_size=1, max_size=max_requests), st.integers(2, 4), chunk_and_page).map(
        build_mixed
    )
