"""What the `racefuzz_trace` pytest fixture hands a test: `fuzz(step, ...)` that fails the test on a race.

    def test_overlap_step(racefuzz_trace):
        racefuzz_trace.fuzz(step, watch=["req_to_token"])

The device follows `--racefuzz-backend` (`sim` records on the CPU, `cuda` on the GPU, `auto` the GPU when
usable), the number of fuzzed runs `--racefuzz-examples` (or the Hypothesis profile's), the seed
`--racefuzz-seed`; a replay file of a manifested race goes to `--racefuzz-report-dir`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from racefuzz.trace.search import Step, TraceResult

_DEVICES = {"sim": "cpu", "cpu": "cpu", "cuda": "cuda", "auto": "auto"}


class RaceInTrace(AssertionError):
    """A traced step raced: the message is the report."""


class TraceFixture:
    """`fuzz(step, watch=..., control=...)`: see the module doc."""

    def __init__(self, backend: str = "auto", examples: int = 100, seed: int | None = None, report_dir: Any = None):
        self.device = _DEVICES.get(backend, "auto")
        self.examples = examples
        self.seed = seed
        self.report_dir = report_dir

    def fuzz(
        self,
        step: Step,
        *,
        watch: Sequence[str] = (),
        control: Step | None = None,
        max_delays: int = 2,
        examples: int | None = None,
    ) -> TraceResult:
        """Fuzz `step`; raise `RaceInTrace` (a failed assertion) with the report if it races.

        `control`: a step that must race (the negative control); if it does not, the verdict on `step`
        means nothing and this fails too.
        """
        from racefuzz.trace.report import render, write_replay
        from racefuzz.trace.search import fuzz

        options = dict(
            device=self.device,
            watch=tuple(watch),
            examples=examples or self.examples,
            max_delays=max_delays,
            seed=self.seed,
        )
        if control is not None and not fuzz(control, **options).racy:
            raise RaceInTrace(
                f"the negative control {control.__qualname__} did not race: a clean verdict means nothing"
            )
        result = fuzz(step, **options)
        if result.racy:
            path = (
                write_replay(result, self.report_dir, tuple(watch)) if result.divergence and self.report_dir else None
            )
            raise RaceInTrace(render(result, path))
        return result
