"""sglang's read-done publishers, driven: does the event the WAR barrier's fast path trusts follow every read?

Each case is one `racefuzz.trace` step that calls **sglang's own publisher** between fake reads of
`req_to_token` placed where sglang's forward puts them, then **sglang's own**
`Scheduler._apply_war_barrier` (which waits on the published event, or on the whole forward stream when
none was published), then a schedule-stream rewrite of a row the forward read (what
`RadixCache.checkpoint` or a reused row does). The step is judged by happens-before: a race means the
published event does not follow some read. Publishers driven (docs/sglang-read-done.md has the table):

* `DecodeCudaGraphRunner.execute` (`model_executor/runner/decode_cuda_graph_runner.py`, with
  `_resolve_shared_read_ends`, `_publish_read_done`, `_replay_attn_backend` and, at the capture,
  `_record_in_graph_metadata_prep_done`): the decode / target-verify graph replay, for each place a
  backend's `shared_read_ends` can declare (PRE_REPLAY, IN_REPLAY, POST_REPLAY, UNKNOWN). The graph is a
  real capture (`torch.cuda.graph`, racefuzz's CPU stand-in); the in-graph marker is recorded inside it.
* `maybe_publish_prefill_shared_read_done` (`model_executor/runner_utils/shared_read_event.py`) after
  `AttentionBackend.resolve_prefill_shared_read_ends` (`layers/attention/base_attn_backend.py`), in
  `EagerRunner.execute`'s order (`model_executor/runner/eager_runner.py`): metadata init, resolve,
  publish, model forward; for the speculative algorithms whose gate
  (`SpeculativeAlgorithm.supports_prefill_shared_read_done`) lets it publish and one it stops.
* `EAGLEDraftExtendCudaGraphRunner.execute`'s publish (`speculative/eagle_draft_extend_cuda_graph_runner.py`)
  is not driven: see docs/sglang-read-done.md for what it would need.

Controls (each must race, in the same run): a backend that declares PRE_REPLAY but reads `req_to_token`
inside the graph (the shape #31686 fixed), one that declares IN_REPLAY but reads after the in-graph marker,
and a prefill whose first layer reads `req_to_token` lazily after a PRE_REPLAY publish (the DSV4 sparse
prefill before its snapshot). They show that the harness judges what the event claims, not its wiring.

What is fake: the attention backend (its reads are the fake's `req_to_token` gathers into a private
snapshot, where sglang's backends run Triton / FlashInfer kernels), the model (it reads only the snapshot),
and the model runner / graph runner objects (plain objects carrying the attributes sglang's methods read;
sglang's methods are called on them unbound). Two stand-ins for `is_cuda()`, which is False on the CPU:
`decode_cuda_graph_runner.make_external_event` returns `torch.cuda.Event(external=True)` (racefuzz's CPU
stand-in, a record inside a capture is a graph node) instead of None, and `shared_read_event.get_memory`
answers "no hierarchical cache, no storage offload, no LMCache" (the runtime context is not published).
And `logging.Logger.info_once`, which sglang's publisher calls and transformers (stubbed) installs, is
`Logger.info`.

Run in its own process: `python -m racefuzz.engines.sglang.read_done --python-dir DIR [--case NAME]`
prints one JSON object (`cases`: per case the verdict, the barrier path and the race reports).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

ROWS, WIDTH = 4, 16
READ_ROWS = (1, 2)
"""The request rows the fake forward reads; the schedule stream rewrites row 1 after the barrier."""


@dataclass(frozen=True)
class Case:
    """One publisher under one backend behaviour.

    `kind`: "decode_graph" (`DecodeCudaGraphRunner.execute`) or "prefill_eager"
    (`maybe_publish_prefill_shared_read_done`). `declared`: the `SharedReadEnds` name the fake backend's
    `shared_read_ends` returns. `reads`: where the fake backend reads `req_to_token` ("out_graph": its
    out-of-graph metadata init; "in_graph": its in-graph metadata init, before the marker; "after_marker":
    a layer inside the graph, after the marker; "lazy_layer": an eager prefill's first layer, after the
    publish). `spec`: the `SpeculativeAlgorithm` name. `expect`: "clean" or "race" (a control).
    """

    name: str
    kind: str
    declared: str
    reads: tuple[str, ...]
    expect: str
    spec: str = "NONE"
    why: str = ""


CASES: tuple[Case, ...] = (
    Case(
        "decode_in_replay",
        "decode_graph",
        "IN_REPLAY",
        ("out_graph", "in_graph"),
        "clean",
        why="base AttentionBackend.shared_read_ends for DECODE / TARGET_VERIFY: reads end at the in-graph marker",
    ),
    Case(
        "decode_pre_replay",
        "decode_graph",
        "PRE_REPLAY",
        ("out_graph",),
        "clean",
        why="a backend whose reads all happen in init_forward_metadata_out_graph (MiniMaxSparseNvfp4)",
    ),
    Case(
        "decode_post_replay",
        "decode_graph",
        "POST_REPLAY",
        ("out_graph", "in_graph", "after_marker"),
        "clean",
        why="DSV4 breakable-graph verify: reads anywhere in the graph, event after the replay",
    ),
    Case(
        "decode_unknown",
        "decode_graph",
        "UNKNOWN",
        ("out_graph", "in_graph", "after_marker"),
        "clean",
        why="no publish: the barrier waits on the whole forward stream",
    ),
    Case(
        "control_decode_pre_replay_reads_in_graph",
        "decode_graph",
        "PRE_REPLAY",
        ("out_graph", "in_graph"),
        "race",
        why="a wrong declaration: the in-graph metadata kernel re-reads req_to_token at each replay (#31686)",
    ),
    Case(
        "control_decode_in_replay_reads_after_marker",
        "decode_graph",
        "IN_REPLAY",
        ("out_graph", "in_graph", "after_marker"),
        "race",
        why="a wrong declaration: a layer inside the graph reads req_to_token after the marker",
    ),
    Case(
        "prefill_none",
        "prefill_eager",
        "PRE_REPLAY",
        ("out_graph",),
        "clean",
        why="non-speculative prefill, metadata init snapshots every shared read (trtllm_mha EXTEND)",
    ),
    Case(
        "prefill_dspark",
        "prefill_eager",
        "PRE_REPLAY",
        ("out_graph",),
        "clean",
        spec="DSPARK",
        why="#35947: DFLASH-family target prefill publishes after the DSV4 snapshot",
    ),
    Case(
        "prefill_eagle",
        "prefill_eager",
        "PRE_REPLAY",
        ("out_graph", "lazy_layer"),
        "clean",
        spec="EAGLE",
        why="EAGLE's draft prefill reads later: the gate declines, the barrier is coarse",
    ),
    Case(
        "control_prefill_lazy_first_layer",
        "prefill_eager",
        "PRE_REPLAY",
        ("out_graph", "lazy_layer"),
        "race",
        spec="DSPARK",
        why="a wrong declaration: the first layer reads req_to_token after the publish (DSV4 sparse prefill "
        "without the #35947 snapshot)",
    ),
)


class Sglang:
    """sglang's modules the cases call, imported from the sources on `sys.path` (stubs installed)."""

    def __init__(self) -> None:
        from sglang.srt.layers.attention import base_attn_backend
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers import tp_worker
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.runner import decode_cuda_graph_runner
        from sglang.srt.model_executor.runner_utils import shared_read_event
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.SharedReadEnds = base_attn_backend.SharedReadEnds
        self.AttentionBackend = base_attn_backend.AttentionBackend
        self.LogitsProcessorOutput = LogitsProcessorOutput
        self.BaseTpWorker = tp_worker.BaseTpWorker
        self.Scheduler = Scheduler
        self.ForwardMode = ForwardMode
        self.decode_runner_module = decode_cuda_graph_runner
        self.DecodeCudaGraphRunner = decode_cuda_graph_runner.DecodeCudaGraphRunner
        self.shared_read_event = shared_read_event
        self.SpeculativeAlgorithm = SpeculativeAlgorithm

    @contextlib.contextmanager
    def cpu_stand_ins(self) -> Any:
        """The two `is_cuda()` stand-ins of the module docstring, for the block."""
        import torch

        if not hasattr(logging.Logger, "info_once"):  # transformers installs it; it is stubbed here
            logging.Logger.info_once = logging.Logger.info  # type: ignore[attr-defined]
        saved = (self.decode_runner_module.make_external_event, self.shared_read_event.get_memory)
        self.decode_runner_module.make_external_event = lambda device_module: torch.cuda.Event(external=True)
        self.shared_read_event.get_memory = lambda: SimpleNamespace(
            enable_hierarchical_cache=False, hicache_storage_backend=None, enable_lmcache=False
        )
        try:
            yield
        finally:
            self.decode_runner_module.make_external_event, self.shared_read_event.get_memory = saved


class RunnerDeviceModule:
    """The device module the fake runners hand sglang: the harness's `DeviceModule` (env streams and
    events) plus `is_current_stream_capturing`, which sglang's capture marker asks."""

    def __init__(self, env: Any) -> None:
        from racefuzz.engines.sglang.device import DeviceModule

        self._inner = DeviceModule(env)

    def is_current_stream_capturing(self) -> bool:
        import torch

        return bool(torch.cuda.is_current_stream_capturing())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FakeBackend:
    """An attention backend whose shared reads are where the case puts them: `req_to_token` gathered into
    its private `snapshot` (what sglang's backends build: a page table, kv_indices)."""

    def __init__(self, sgl: Sglang, case: Case, req_to_token: Any, snapshot: Any, indices: Any) -> None:
        self._declared = sgl.SharedReadEnds[case.declared]
        self._reads = case.reads
        self.req_to_token, self.snapshot, self.indices = req_to_token, snapshot, indices
        self.prefill_shared_read_ends_calls = 0

    def shared_read_ends(self, forward_mode: Any) -> Any:
        return self._declared

    def _snapshot_prefill_shared_reads(self, forward_batch: Any, *, num_qo_tokens: int) -> Any:
        return self._declared

    def gather(self) -> None:
        """The metadata kernel: the rows the batch reads, into the private snapshot."""
        self.snapshot.copy_(self.req_to_token.index_select(0, self.indices))

    def init_forward_metadata_out_graph(self, forward_batch: Any) -> None:
        if "out_graph" in self._reads:
            self.gather()

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        if "in_graph" in self._reads:
            self.gather()

    def layer_reads(self, out: Any) -> None:
        """A layer: reads the snapshot, or (`after_marker` / `lazy_layer`) `req_to_token` itself."""
        if "after_marker" in self._reads or "lazy_layer" in self._reads:
            out.copy_(self.req_to_token.index_select(0, self.indices).float().sum(dim=1))
        else:
            out.copy_(self.snapshot.float().sum(dim=1))


class _GraphBackend:
    """The runner's `backend` (its graph store): `replay` replays the captured graph."""

    def __init__(self, graph: Any, out: Any, logits_type: Any) -> None:
        self._graph, self._out, self._logits = graph, out, logits_type

    def replay_session(self) -> Any:
        return contextlib.nullcontext()

    def replay(self, key: Any, forward_batch: Any) -> Any:
        self._graph.replay()
        return self._logits(next_token_logits=self._out, hidden_states=None)


def _fake_decode_runner(sgl: Sglang) -> type:
    """A class carrying sglang's own `DecodeCudaGraphRunner` methods that the replay path calls."""
    runner = sgl.DecodeCudaGraphRunner
    names = (
        "execute",
        "_resolve_shared_read_ends",
        "_publish_read_done",
        "_replay_attn_backend",
        "_record_in_graph_metadata_prep_done",
        "_process_output_after_replay",
    )
    return type("FakeDecodeCudaGraphRunner", (), {name: runner.__dict__[name] for name in names})


class _Worker:
    """A plain worker: sglang's own `BaseTpWorker.last_shared_read_runner` property picks the runner."""

    def __init__(self, sgl: Sglang, model_runner: Any) -> None:
        self.model_runner = model_runner
        self._pick = sgl.BaseTpWorker.__dict__["last_shared_read_runner"].fget

    @property
    def last_shared_read_runner(self) -> Any:
        return self._pick(self)


def _setup(env: Any, sgl: Sglang, case: Case) -> SimpleNamespace:
    import torch

    table = torch.arange(ROWS * WIDTH, dtype=torch.int32, device=env.device).view(ROWS, WIDTH)
    req_to_token = env.name(table.clone(), "req_to_token")
    snapshot = env.name(torch.zeros(len(READ_ROWS), WIDTH, dtype=torch.int32, device=env.device), "page_table")
    indices = env.name(torch.tensor(READ_ROWS, dtype=torch.int64, device=env.device), "req_pool_indices")
    out = env.name(torch.zeros(len(READ_ROWS), device=env.device), "logits")
    device_module = RunnerDeviceModule(env)
    schedule_stream = env.stream("schedule_stream")
    forward_stream = env.stream("forward_stream")
    for stream in (schedule_stream, forward_stream):
        stream.wait_stream(env.current_stream())
    backend = FakeBackend(sgl, case, req_to_token, snapshot, indices)
    model_runner = SimpleNamespace(
        shared_read_done_event=None,
        device_timer=None,
        spec_algorithm=sgl.SpeculativeAlgorithm[case.spec],
        attn_backend=backend,
        device=env.device,
    )
    scheduler = SimpleNamespace(
        _war_barrier_enabled=True,
        model_worker=_Worker(sgl, model_runner),
        schedule_stream=schedule_stream,
        forward_stream=forward_stream,
    )
    return SimpleNamespace(
        req_to_token=req_to_token,
        out=out,
        backend=backend,
        model_runner=model_runner,
        scheduler=scheduler,
        device_module=device_module,
        schedule_stream=schedule_stream,
        forward_stream=forward_stream,
    )


def _forward_decode_graph(env: Any, sgl: Sglang, case: Case, s: SimpleNamespace) -> None:
    """Capture (at init, as `init_all_cuda_graphs` does), then one `DecodeCudaGraphRunner.execute`."""
    import torch

    runner = _fake_decode_runner(sgl)()
    runner.model_runner = s.model_runner
    runner.device_module = s.device_module
    runner.attn_backend = s.backend
    runner.enable_pdmux = False
    runner.in_graph_metadata_prep_done = None
    runner.is_dllm = False
    runner.raw_num_token = len(READ_ROWS)
    runner.bs = len(READ_ROWS)
    runner.captured_req_width = 1
    runner._replay_graph_key = SimpleNamespace(size=len(READ_ROWS))
    runner.model_context = contextlib.nullcontext
    runner.load_batch = lambda forward_batch, pp_proxy_tensors: s.backend.init_forward_metadata_out_graph(forward_batch)
    graph = torch.cuda.CUDAGraph()
    capture_stream = env.stream("capture_stream")
    capture_stream.wait_stream(env.current_stream())
    with torch.cuda.graph(graph, stream=capture_stream):
        # DecodeCudaGraphRunner._run_in_graph_metadata_prep's body: the in-graph hook, then sglang's marker.
        s.backend.init_forward_metadata_in_graph(None)
        runner._record_in_graph_metadata_prep_done()
        s.backend.layer_reads(s.out)
    env.synchronize()  # engine init synchronizes after capture
    runner.backend = _GraphBackend(graph, s.out, sgl.LogitsProcessorOutput)
    forward_batch = SimpleNamespace(forward_mode=sgl.ForwardMode.DECODE, batch_size=len(READ_ROWS))
    with env.use(s.forward_stream):
        runner.execute(forward_batch)


def _forward_prefill_eager(env: Any, sgl: Sglang, case: Case, s: SimpleNamespace) -> None:
    """`EagerRunner.execute`'s prefill order: metadata init, resolve, sglang's publish, the model."""
    import torch

    forward_batch = SimpleNamespace(forward_mode=sgl.ForwardMode.EXTEND, input_ids=torch.zeros(8))
    with env.use(s.forward_stream):
        s.backend.init_forward_metadata_out_graph(forward_batch)
        ends = sgl.AttentionBackend.resolve_prefill_shared_read_ends(
            s.backend, forward_batch, num_qo_tokens=len(forward_batch.input_ids)
        )
        sgl.shared_read_event.maybe_publish_prefill_shared_read_done(s.model_runner, ends, s.device_module)
        s.backend.layer_reads(s.out)


def make_step(sgl: Sglang, case: Case, holder: dict[str, Any]) -> Any:
    """The trace step of `case`: the forward with sglang's publisher, sglang's barrier, the rewrite."""

    def step(env: Any) -> dict[str, Any]:
        s = _setup(env, sgl, case)
        with sgl.cpu_stand_ins():
            if case.kind == "decode_graph":
                _forward_decode_graph(env, sgl, case, s)
            else:
                _forward_prefill_eager(env, sgl, case, s)
        holder["fast_path"] = s.model_runner.shared_read_done_event is not None
        with env.use(s.schedule_stream):
            sgl.Scheduler._apply_war_barrier(s.scheduler)
            s.req_to_token[READ_ROWS[0], 0:8] = -1  # a row rewrite (RadixCache.checkpoint, a reused row)
        env.synchronize()
        return {"logits": s.out}

    step.__name__ = f"read_done_{case.name}"
    return step


def run_case(sgl: Sglang, case: Case) -> dict[str, Any]:
    """Record `case`'s step once on the CPU and judge it by happens-before."""
    from racefuzz.trace.convert import find_trace_races
    from racefuzz.trace.search import run_once

    holder: dict[str, Any] = {}
    began = time.perf_counter()
    record = run_once(make_step(sgl, case, holder), "cpu")
    races = find_trace_races(record.trace)
    return {
        "case": case.name,
        "publisher": case.kind,
        "declared": case.declared,
        "reads": list(case.reads),
        "spec": case.spec,
        "why": case.why,
        "expect": case.expect,
        "barrier": "fast path (wait_event on the published event)" if holder["fast_path"] else "coarse (wait_stream)",
        "verdict": "race" if races else "clean",
        "as_expected": bool(races) == (case.expect == "race"),
        "races": [
            {
                "kind": race.race.kind.value,
                "where": list(race.where),
                "first": f"{race.first.kernel} on {race.first.stream} ({race.first.kind}) {race.first.source}",
                "second": f"{race.second.kernel} on {race.second.stream} ({race.second.kind}) {race.second.source}",
                "missing_edge": race.race.missing_edge(),
            }
            for race in races
        ],
        "seconds": round(time.perf_counter() - began, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="racefuzz.engines.sglang.read_done")
    parser.add_argument("--python-dir", required=True, help="sglang's python/ directory (racefuzz sglang fetch)")
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES], help="repeatable; default all")
    parser.add_argument("--traceback", action="store_true")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"python_dir": args.python_dir}
    began = time.perf_counter()
    try:
        from racefuzz.engines.sglang import stubs

        out["stubbed"] = len(stubs.install())
        sys.path.insert(0, args.python_dir)
        os.environ["SGLANG_ENABLE_PREFILL_WAR_READ_DONE"] = "1"  # the prefill publish is opt-in in 0.5.23
        os.environ.pop("SGLANG_FORCE_COARSE_WAR_BARRIER", None)
        sgl = Sglang()
        out["import_seconds"] = round(time.perf_counter() - began, 3)
        chosen = [c for c in CASES if not args.case or c.name in args.case]
        out["cases"] = [run_case(sgl, case) for case in chosen]
        out["status"] = "ok"
    except Exception as exc:  # one line for the parent; the traceback with --traceback
        out["status"] = "error"
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if args.traceback:
            out["traceback"] = traceback.format_exc()
    out["seconds"] = round(time.perf_counter() - began, 3)
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0 if out["status"] == "ok" else 5


if __name__ == "__main__":
    raise SystemExit(main())
