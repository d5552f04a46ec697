"""What the `racefuzz_trace` pytest fixture hands a test: `fuzz(step, ...)` that fails the test on a race.

    def test_overlap_step(racefuzz_trace):
        racefuzz_trace.fuzz(step, watch=["req_to_token"])

The device follows `--racefuzz-backend` (`sim` records on the CPU, `cuda` on the GPU, `auto` the GPU when
usable), the number of fuzzed runs `--racefuzz-examples` (or the Hypothesis profile's), the seed
`--racefuzz-seed`. A race fails the test as `RaceInTrace` (a `racefuzz.testing.RaceFound`: race found), after
its replay file (a manifested value race) and its timeline (`trace-<step>.trace.json` and `.png`) are
written to `--racefuzz-report-dir`; a negative control that does not race fails it as
`racefuzz.testing.Inconclusive`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from racefuzz.errors import Inconclusive, RaceFound
from racefuzz.trace.search import Step, TraceResult

_DEVICES = {"sim": "cpu", "cpu": "cpu", "cuda": "cuda", "auto": "auto"}


class RaceInTrace(RaceFound):
    """A traced step raced (the CLI's exit code 1): the message is the report, its files written first."""


class TraceFixture:
    """`fuzz(step, watch=..., control=...)`: see the module doc."""

    def __init__(
        self,
        backend: str = "auto",
        examples: int = 100,
        seed: int | None = None,
        report_dir: Any = None,
        *,
        example_timeout: float | None = None,
        on_abandon: Callable[[str], None] | None = None,
    ):
        self.device = _DEVICES.get(backend, "auto")
        self.examples = examples
        self.seed = seed
        self.report_dir = report_dir
        self.example_timeout = example_timeout
        self.on_abandon = on_abandon

    def fuzz(
        self,
        step: Step,
        *,
        watch: Sequence[str] = (),
        control: Step | None = None,
        max_delays: int = 2,
        examples: int | None = None,
    ) -> TraceResult:
        """Fuzz `step`; raise `RaceInTrace` (a failed assertion) with the report if it races, after writing its
        replay file (on a value divergence) and timeline to the report directory.

        `control`: a step that must race (the negative control); if it does not, the verdict on `step`
        means nothing and this fails as `Inconclusive`.
        """
        from racefuzz.trace.report import render
        from racefuzz.trace.search import build_recorder, fuzz, step_name, watched_step
        from racefuzz.watchdog import watched

        watch = (watch,) if isinstance(watch, str) else tuple(watch)  # one name, not its letters
        options = dict(
            device=self.device,
            watch=watch,
            examples=self.examples if examples is None else examples,  # 0: happens-before only
            max_delays=max_delays,
            seed=self.seed,
        )
        # Each run of a step passes a checkpoint: one past --racefuzz-example-timeout fails the test as
        # `ExampleTimeout`, and one that never returns ends the session (exit 6) with a line naming it.
        build_recorder()  # the fast path's first build (10-60 s) is not an example's run
        with watched(self.example_timeout, self.on_abandon):
            if control is not None:
                caught = fuzz(watched_step(control, step_name(control)), **options)
                if not caught.racy:
                    raise Inconclusive(
                        f"the negative control {step_name(control)} did not race on {caught.device}: a clean verdict "
                        f"on {step_name(step)} would mean nothing"
                    )
            result = fuzz(watched_step(step, step_name(step)), **options)
        if result.racy:
            path, tail = None, ""
            if self.report_dir is not None:
                path, written, note = self._write(result, tuple(watch))
                tail = f"\ntimeline (host issue order): {', '.join(str(p) for p in written)}{note}"
            raise RaceInTrace(render(result, path) + tail)
        return result

    def _write(self, result: TraceResult, watch: tuple[str, ...]) -> tuple[Path | None, list[Path], str]:
        """The replay file (its delays, none for a happens-before race) and timeline, in the report directory, or
        in a fresh temporary one if it cannot be written (the third item says so)."""
        from racefuzz.outputs import fallback_dir
        from racefuzz.trace.report import report_stem, write_replay, write_timeline

        def write(directory: Any) -> tuple[Path | None, list[Path]]:
            replay_path = write_replay(result, directory, watch)  # a happens-before race replays on the CPU
            return replay_path, write_timeline(result, report_stem(result, directory))

        try:
            return (*write(self.report_dir), "")
        except OSError as exc:
            elsewhere = fallback_dir()
            note = f"; {self.report_dir} could not be written ({exc.strerror or exc}), so they went to {elsewhere}"
            return (*write(elsewhere), note)
