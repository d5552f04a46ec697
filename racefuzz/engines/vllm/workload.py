"""Request streams the vLLM harness schedules into vLLM's `GPUModelRunner`: when each request arrives
(engine step), its prompt length and how many tokens it generates, whether it is preempted once (its
blocks freed and its row removed, then resumed with fresh blocks), and whether the engine runs with
async scheduling (vLLM's `--async-scheduling`: the host prepares step N+1 while step N runs).

`FIXED` is what CI runs: two prefills at once, their decodes, one finishing while the other decodes, a
third arriving later into the freed row and blocks, one preemption, async scheduling on.
`workloads()` draws others with Hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """One request: `rid`, the step it arrives at, its prompt and output lengths (tokens), the step at
    which it is preempted once (-1: never), and whether it samples at temperature 1 (`random`: vLLM's input
    batch then copies its sampling tensors to the device) or greedily."""

    rid: str
    arrival: int
    prompt_len: int
    output_len: int
    preempt_at: int = -1
    random: bool = False


@dataclass(frozen=True)
class Workload:
    """A request stream, the step budget, the KV blocks there are, async scheduling on or off, and the
    draft tokens a speculative decoder proposes per decode step (`spec_tokens`; 0: no speculative decoding;
    more: a hybrid model with an EAGLE-kind drafter, `runner.FakeDrafter`), and whether the model is
    multimodal (`multimodal`: vLLM's runner then embeds every step's tokens through its `_preprocess`
    multimodal branch, and each request with a prompt of 3 tokens or more carries one image, `image_range`)."""

    requests: tuple[Request, ...]
    async_scheduling: bool = True
    max_steps: int = 40
    num_blocks: int = 12
    spec_tokens: int = 0
    multimodal: bool = False

    def describe(self) -> str:
        parts = []
        for r in self.requests:
            preempt = f" preempted@{r.preempt_at}" if r.preempt_at >= 0 else ""
            sampled = " sampled" if r.random else ""
            parts.append(f"{r.rid}@{r.arrival}:{r.prompt_len}+{r.output_len}{preempt}{sampled}")
        mode = "async scheduling" if self.async_scheduling else "sync scheduling"
        spec = f", spec decode {self.spec_tokens} draft tokens (hybrid model)" if self.spec_tokens else ""
        images = sum(image_range(r) is not None for r in self.requests)
        mm = f", multimodal model ({images} image(s))" if self.multimodal else ""
        return f"{len(self.requests)} requests ({', '.join(parts)}), {self.num_blocks} blocks, {mode}{spec}{mm}"

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": [[r.rid, r.arrival, r.prompt_len, r.output_len, r.preempt_at, r.random] for r in self.requests],
            "async_scheduling": self.async_scheduling,
            "max_steps": self.max_steps,
            "num_blocks": self.num_blocks,
            "spec_tokens": self.spec_tokens,
            "multimodal": self.multimodal,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Workload:
        requests = tuple(
            Request(
                str(row[0]),
                int(row[1]),
                int(row[2]),
                int(row[3]),
                int(row[4]) if len(row) > 4 else -1,
                bool(row[5]) if len(row) > 5 else False,
            )
            for row in data["requests"]
        )
        if not requests:
            raise ValueError("a workload needs at least one request")
        for request in requests:
            if request.prompt_len < 1 or request.output_len < 1 or request.arrival < 0:
                raise ValueError(f"request {request.rid}: prompt and output lengths >= 1, arrival >= 0")
        spec_tokens = int(data.get("spec_tokens", 0))
        if not 0 <= spec_tokens <= 4:
            raise ValueError(f"spec_tokens must be 0 to 4, got {spec_tokens}")
        if spec_tokens and any(r.preempt_at >= 0 for r in requests):
            raise ValueError(
                "a speculative-decoding workload has no preemption (the fake scheduler does not resume drafts)"
            )
        return Workload(
            requests,
            bool(data.get("async_scheduling", True)),
            int(data.get("max_steps", 40)),
            int(data.get("num_blocks", 12)),
            spec_tokens,
            bool(data.get("multimodal", False)),
        )


def image_range(request: Request) -> tuple[int, int] | None:
    """The image placeholder of `request`'s prompt in a multimodal workload, as vLLM's `PlaceholderRange`
    (offset, length): every token but the first and the last, for a prompt of 3 tokens or more."""
    if request.prompt_len < 3:
        return None
    return 1, request.prompt_len - 2


FIXED = Workload(
    (
        Request("a", 0, 5, 3),
        Request("b", 0, 30, 6, preempt_at=5, random=True),
        Request("c", 4, 9, 3),
    )
)
"""Two prefills at step 0 (b: two blocks, sampled at temperature 1), a finishing while b decodes, b's
decode at step 3 taking a third block (`append_row` on its row), c arriving at step 4 into a's freed row
and blocks, b preempted at step 5 and resumed with fresh blocks."""


SPEC_DECODE = Workload((Request("a", 0, 5, 4), Request("b", 0, 9, 4, random=True)), spec_tokens=1)
"""Speculative decoding on a hybrid model under async scheduling (vLLM #36013's setting): two prefills at
step 0, then three decode steps of each with one draft token, the batch unchanged between steps (no row
moves: `InputBatch.condense` moves nothing)."""

SPEC_DECODE_CONDENSE = Workload(
    (Request("a", 0, 5, 2), Request("b", 0, 9, 4), Request("c", 0, 7, 4, random=True)), spec_tokens=1
)
"""As `SPEC_DECODE`, but request a finishes after its first decode while b and c decode on: the next step's
`InputBatch.condense` moves c's row (its accepted-token count with it) into a's (vLLM #51571's setting)."""


def workloads() -> Any:
    """A Hypothesis strategy of small workloads: 1-4 requests, prompts of 1-40 tokens, 1-6 outputs, an
    optional preemption, greedy or sampled, async scheduling on or off."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw: Any) -> Workload:
        count = draw(st.integers(1, 4))
        requests = []
        for index in range(count):
            arrival = draw(st.integers(0, 5))
            output_len = draw(st.integers(1, 6))
            preempt = draw(st.one_of(st.just(-1), st.integers(arrival + 1, arrival + 4)))
            prompt_len = draw(st.integers(1, 40))
            requests.append(Request(f"r{index}", arrival, prompt_len, output_len, preempt, draw(st.booleans())))
        return Workload(tuple(requests), draw(st.booleans()))

    return build()


MULTIMODAL = Workload(
    (Request("a", 0, 12, 3), Request("b", 0, 9, 4, random=True), Request("c", 2, 10, 3)), multimodal=True
)
"""A multimodal model under async scheduling (vLLM #31841's setting): two prefills with an image each at step
0, their decodes, a third request with an image arriving at step 2. Every step's `_gather_mm_embeddings`
rewrites `is_mm_embed`'s host half and copies it to the device."""


NAMED = {
    "fixed": FIXED,
    "spec": SPEC_DECODE,
    "spec-condense": SPEC_DECODE_CONDENSE,
    "multimodal": MULTIMODAL,
}
"""The fixed workloads by their `racefuzz vllm --workload` names."""
