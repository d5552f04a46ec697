"""The caching allocator's lifetime hazards on a real GPU, beside the CPU's verdict on the same steps
(tests/unit/test_trace_lifetime.py): the allocator does hand a freed block to the next allocation of its
stream and pool, a read pending at the free then manifests as a wrong value under a delay, and a free no
allocation reuses is a latent hazard on both devices.

Each test prints what it saw (run with `-s` for the record)."""

from __future__ import annotations

import pytest

from racefuzz.trace.convert import judge_trace
from racefuzz.trace.search import run_once
from tests.unit.test_trace_lifetime import SMALL, lifetime_step

pytestmark = pytest.mark.cuda

CASES = {
    "reuse": lifetime_step("default"),
    "reuse-ordered": lifetime_step("default", ordered_before_reuse=True),
    "no-reuse": lifetime_step("none"),
    "other-pool": lifetime_step("default-large"),
    "other-stream": lifetime_step("forward"),
}


def judged(step, device: str) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    judgement = judge_trace(run_once(step, device, serialize=True).trace)
    print(device, "races", *judgement.races, "latent", *judgement.latent, sep="\n  ")

    def pairs(races):
        return [(r.race.kind.value, r.first.stream, r.second.stream) for r in races]

    return pairs(judgement.races), pairs(judgement.latent)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cpus_lifetime_verdict_is_the_gpus(case):
    gpu, cpu = judged(CASES[case], "cuda"), judged(CASES[case], "cpu")
    assert gpu == cpu
    assert gpu[0] if case == "reuse" else not gpu[0]  # the reuse races, nothing else does (control and cases)


def in_a_fresh_process(code: str) -> dict:
    """Run `code` (which prints one JSON object last) in a new process: a fresh caching allocator, whose
    choice of block is then the one the test means (in this process, earlier tests leave free fragments that
    a best-fit search may prefer)."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    print(done.stdout, done.stderr[-2000:])
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_caching_allocator_hands_a_freed_block_to_its_streams_next_allocation_of_its_pool():
    seen = in_a_fresh_process(
        f"""
import json, torch
side = torch.cuda.Stream()
first = torch.ones({SMALL}, device="cuda")
block = first.data_ptr()
del first
with torch.cuda.stream(side):
    elsewhere = torch.zeros({SMALL}, device="cuda")  # another stream's pool
large = torch.zeros(1 << 19, device="cuda")  # 2 MiB: the large pool
again = torch.zeros({SMALL}, device="cuda")  # the default stream, the small pool
at = {{"elsewhere": elsewhere.data_ptr(), "large": large.data_ptr(), "again": again.data_ptr()}}
print(json.dumps({{"block": block, **at}}))
"""
    )
    assert seen["elsewhere"] != seen["block"] and seen["large"] != seen["block"]
    assert seen["again"] == seen["block"]


def test_the_reuse_race_manifests_and_the_latent_hazard_does_not():
    seen = in_a_fresh_process(
        """
import json
from racefuzz.trace import fuzz
from tests.unit.test_trace_lifetime import lifetime_step
reused = fuzz(lifetime_step("default"), device="cuda", examples=40, seed=0)
latent = fuzz(lifetime_step("none"), device="cuda", examples=40, seed=0)
print(json.dumps({
    "reused": [len(reused.races), reused.manifested, str(reused.divergence), reused.delays],
    "latent": [len(latent.races), len(latent.latent), latent.divergence is None],
}))
"""
    )
    races, manifested, _, _ = seen["reused"]
    assert races == 1 and manifested  # the pending sum reads the zeros of the block's new owner, k of k
    assert seen["latent"] == [0, 1, True]  # nothing reuses the block: said, not a race, nothing diverges
