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
* `EAGLEDraftExtendCudaGraphRunner.execute` (`speculative/eagle_draft_extend_cuda_graph_runner.py`, with
  `_replay_graph` and the inherited `_publish_read_done`): single-layer EAGLE's draft extend, #37988's
  site, for each declaration: its static-buffer fill, out-of-graph metadata init, the publish before the
  replay (PRE_REPLAY) or after it (IN_REPLAY / POST_REPLAY), and the replay of a captured draft graph.

Controls (each must race, in the same run): a backend that declares PRE_REPLAY but reads `req_to_token`
inside the graph (the shape #31686 fixed, in the decode runner and in EAGLE's draft-extend runner), one
that declares IN_REPLAY but reads after the in-graph marker, a prefill whose first layer reads
`req_to_token` lazily after a PRE_REPLAY publish (the DSV4 sparse prefill before its snapshot), an EAGLE
step whose scheduler asks the target runner (the owner before #35057) while the draft extend reads later,
and a multi-layer EAGLE step marked staged whose draft graph still reads `req_to_token`. They show that
the harness judges what the event claims, not its wiring.

What is fake: the attention backend (its reads are the fake's `req_to_token` gathers into a private
snapshot, where sglang's backends run Triton / FlashInfer kernels), the model (it reads only the snapshot),
and the model runner / graph runner objects (plain objects carrying the attributes sglang's methods read;
sglang's methods are called on them unbound). Two stand-ins for `is_cuda()`, which is False on the CPU:
`decode_cuda_graph_runner.make_external_event` returns `torch.cuda.Event(external=True)` (racefuzz's CPU
stand-in, a record inside a capture is a graph node) instead of None (sglang's own in the case without
external events), and `shared_read_event.get_memory`
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

    `kind`: "decode_graph" (`DecodeCudaGraphRunner.execute`), "prefill_eager"
    (`maybe_publish_prefill_shared_read_done`), "eagle_draft_extend" (`EAGLEDraftExtendCudaGraphRunner.execute`)
    or "eagle_step" (a target verify through `DecodeCudaGraphRunner.execute`, then the draft extend through
    `EAGLEDraftExtendCudaGraphRunner.execute`, on two runners: `reads` and `declared` are the draft's).
    `worker`: the sglang class whose `last_shared_read_runner` the scheduler asks. `staged`: the draft's
    reads are copied into its own buffers before the verify, and the worker's staged flag is set.
    `external_events`: whether the in-graph marker can be made (the `make_external_event` stand-in).
    `declared`: the `SharedReadEnds` name the fake backend's `shared_read_ends` returns. `reads`: where the fake
    backend reads `req_to_token` ("out_graph": its out-of-graph metadata init; "in_graph": its in-graph metadata
    init, before the marker; "after_marker": a layer inside the graph, after the marker; "lazy_layer": an eager
    prefill's first layer, after the publish). `spec`: the `SpeculativeAlgorithm` name. `expect`: "clean" or
    "race" (a control).
    """

    name: str
    kind: str
    declared: str
    reads: tuple[str, ...]
    expect: str
    spec: str = "NONE"
    why: str = ""
    worker: str = "BaseTpWorker"
    staged: bool = False
    external_events: bool = True


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
        "decode_in_replay_no_marker",
        "decode_graph",
        "IN_REPLAY",
        ("out_graph", "in_graph", "after_marker"),
        "clean",
        external_events=False,
        why="no external events (make_external_event is None, as on HIP): IN_REPLAY resolves to POST_REPLAY",
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
    Case(
        "eagle_draft_extend_unknown",
        "eagle_draft_extend",
        "UNKNOWN",
        ("out_graph", "in_graph"),
        "clean",
        spec="EAGLE",
        worker="EAGLEWorkerV2",
        why="base AttentionBackend.shared_read_ends(DRAFT_EXTEND_V2) is UNKNOWN: the event is cleared, coarse",
    ),
    Case(
        "eagle_draft_extend_in_replay",
        "eagle_draft_extend",
        "IN_REPLAY",
        ("out_graph", "in_graph"),
        "clean",
        spec="EAGLE",
        worker="EAGLEWorkerV2",
        why="IN_REPLAY / POST_REPLAY: no in-graph marker in this runner, the event is recorded after the replay",
    ),
    Case(
        "eagle_draft_extend_pre_replay",
        "eagle_draft_extend",
        "PRE_REPLAY",
        ("out_graph",),
        "clean",
        spec="EAGLE",
        worker="EAGLEWorkerV2",
        why="PRE_REPLAY with every read in init_forward_metadata_out_graph: the event before the replay holds",
    ),
    Case(
        "control_eagle_draft_extend_pre_replay_reads_in_graph",
        "eagle_draft_extend",
        "PRE_REPLAY",
        ("out_graph", "in_graph"),
        "race",
        spec="EAGLE",
        worker="EAGLEWorkerV2",
        why="#37988's shape: the event published before the replay while the captured draft graph reads "
        "req_to_token (a backend declaring PRE_REPLAY for DRAFT_EXTEND_V2 with an in-graph metadata read)",
    ),
    Case(
        "eagle_step",
        "eagle_step",
        "UNKNOWN",
        ("out_graph", "in_graph"),
        "clean",
        spec="EAGLE",
        worker="EAGLEWorkerV2",
        why="verify publishes into the target runner; the scheduler asks the draft runner, whose draft extend "
        "cleared its event: coarse",
    ),
    Case(
        "control_eagle_step_target_fence",
        "eagle_step",
        "UNKNOWN",
        ("out_graph", "in_graph"),
        "race",
        spec="EAGLE",
        worker="BaseSpecWorker",
        why="the owner before #35057 (BaseSpecWorker's target runner): the verify's event trusted while the "
        "draft extend reads later",
    ),
    Case(
        "multi_layer_staged",
        "eagle_step",
        "UNKNOWN",
        (),
        "clean",
        spec="EAGLE",
        worker="MultiLayerEagleWorkerV2",
        staged=True,
        why="#38169 / #35289: draft reads staged before the verify, the scheduler takes the verify's event",
    ),
    Case(
        "control_multi_layer_staged_reads_in_graph",
        "eagle_step",
        "UNKNOWN",
        ("in_graph",),
        "race",
        spec="EAGLE",
        worker="MultiLayerEagleWorkerV2",
        staged=True,
        why="staged flag set while the draft graph still reads req_to_token: the verify's event is early",
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
        from sglang.srt.speculative import (
            base_spec_worker,
            eagle_draft_extend_cuda_graph_runner,
            eagle_worker_v2,
            multi_layer_eagle_worker_v2,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.SharedReadEnds = base_attn_backend.SharedReadEnds
        self.AttentionBackend = base_attn_backend.AttentionBackend
        self.LogitsProcessorOutput = LogitsProcessorOutput
        self.BaseTpWorker = tp_worker.BaseTpWorker
        self.BaseSpecWorker = base_spec_worker.BaseSpecWorker
        self.EAGLEWorkerV2 = eagle_worker_v2.EAGLEWorkerV2
        self.MultiLayerEagleWorkerV2 = multi_layer_eagle_worker_v2.MultiLayerEagleWorkerV2
        self.Scheduler = Scheduler
        self.ForwardMode = ForwardMode
        self.decode_runner_module = decode_cuda_graph_runner
        self.DecodeCudaGraphRunner = decode_cuda_graph_runner.DecodeCudaGraphRunner
        self.shared_read_event = shared_read_event
        self.SpeculativeAlgorithm = SpeculativeAlgorithm
        self.EAGLEDraftExtendCudaGraphRunner = eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner

    @contextlib.contextmanager
    def cpu_stand_ins(self, external_events: bool = True) -> Any:
        """The stand-ins of the module docstring, for the block. Without `external_events`,
        `make_external_event` is sglang's own (None off CUDA, as on a platform without external events)."""
        import torch

        if not hasattr(logging.Logger, "info_once"):  # transformers installs it; it is stubbed here
            logging.Logger.info_once = logging.Logger.info  # type: ignore[attr-defined]
        saved = (self.decode_runner_module.make_external_event, self.shared_read_event.get_memory)
        if external_events:
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
    """An attention backend whose shared reads are where `reads` puts them: `req_to_token` gathered into
    its private `snapshot` (what sglang's backends build: a page table, kv_indices). `declared` is what its
    `shared_read_ends` answers (a `SharedReadEnds`)."""

    def __init__(self, declared: Any, reads: tuple[str, ...], req_to_token: Any, snapshot: Any, indices: Any) -> None:
        self._declared = declared
        self._reads = reads
        self.req_to_token, self.snapshot, self.indices = req_to_token, snapshot, indices

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

    def __init__(self, graph: Any, out: Any, hidden: Any, logits_type: Any) -> None:
        self._graph, self._out, self._hidden, self._logits = graph, out, hidden, logits_type

    def replay_session(self) -> Any:
        return contextlib.nullcontext()

    def replay(self, key: Any, forward_batch: Any) -> Any:
        self._graph.replay()
        return self._logits(next_token_logits=self._out, hidden_states=self._hidden)


def sglang_methods(cls: type, names: tuple[str, ...], label: str) -> type:
    """A class carrying `cls`'s own methods `names` (each as `cls`'s MRO defines it, staticmethods kept),
    and nothing else: a runner whose attributes the case sets, whose code is sglang's."""
    found = {}
    for name in names:
        owner = next(klass for klass in cls.__mro__ if name in klass.__dict__)
        found[name] = owner.__dict__[name]
    return type(label, (), found)


class _Worker:
    """The scheduler's `model_worker`: sglang's own `last_shared_read_runner` property of the case's worker
    class (`BaseTpWorker`, `EAGLEWorkerV2`, `MultiLayerEagleWorkerV2`, `BaseSpecWorker`) picks the runner."""

    def __init__(self, worker_class: type, target_runner: Any, draft_runner: Any, staged: bool) -> None:
        self.model_runner = target_runner
        self.target_worker = self._target_worker = SimpleNamespace(model_runner=target_runner)
        draft = SimpleNamespace(draft_runner=draft_runner, last_draft_extend_staged=staged)
        self.draft_worker = self._draft_worker = draft
        self._pick = worker_class.__dict__["last_shared_read_runner"].fget

    @property
    def last_shared_read_runner(self) -> Any:
        return self._pick(self)


@dataclass
class _Runner:
    """One model runner of the step (target or draft): sglang's mailbox and the fake backend's buffers."""

    model_runner: Any
    backend: FakeBackend
    out: Any
    hidden: Any


def _runner(env: Any, sgl: Sglang, name: str, declared: str, reads: tuple[str, ...], req_to_token: Any, case: Case):
    import torch

    device = env.device
    snapshot = env.name(torch.zeros(len(READ_ROWS), WIDTH, dtype=torch.int32, device=device), f"{name}.page_table")
    indices = env.name(torch.tensor(READ_ROWS, dtype=torch.int64, device=device), f"{name}.req_pool_indices")
    backend = FakeBackend(sgl.SharedReadEnds[declared], reads, req_to_token, snapshot, indices)
    model_runner = SimpleNamespace(
        shared_read_done_event=None,
        device_timer=None,
        spec_algorithm=sgl.SpeculativeAlgorithm[case.spec],
        attn_backend=backend,
        device=device,
        model_config=SimpleNamespace(model_is_mrope=False),
    )
    out = env.name(torch.zeros(len(READ_ROWS), device=device), f"{name}.logits")
    hidden = env.name(torch.zeros(len(READ_ROWS), 4, device=device), f"{name}.hidden_states")
    return _Runner(model_runner, backend, out, hidden)


def _setup(env: Any, sgl: Sglang, case: Case) -> SimpleNamespace:
    import torch

    table = torch.arange(ROWS * WIDTH, dtype=torch.int32, device=env.device).view(ROWS, WIDTH)
    req_to_token = env.name(table.clone(), "req_to_token")
    if case.kind == "eagle_step":  # the target verify reads as the base backend declares: up to the marker
        target = _runner(env, sgl, "target", "IN_REPLAY", ("out_graph", "in_graph"), req_to_token, case)
        draft = _runner(env, sgl, "draft", case.declared, case.reads, req_to_token, case)
    else:
        target = draft = _runner(env, sgl, "runner", case.declared, case.reads, req_to_token, case)
    schedule_stream = env.stream("schedule_stream")
    forward_stream = env.stream("forward_stream")
    for stream in (schedule_stream, forward_stream):  # after the tables' and buffers' allocation and filling
        stream.wait_stream(env.current_stream())
    worker = _Worker(getattr(sgl, case.worker), target.model_runner, draft.model_runner, case.staged)
    scheduler = SimpleNamespace(
        _war_barrier_enabled=True, model_worker=worker, schedule_stream=schedule_stream, forward_stream=forward_stream
    )
    return SimpleNamespace(
        req_to_token=req_to_token,
        target=target,
        draft=draft,
        scheduler=scheduler,
        device_module=RunnerDeviceModule(env),
        schedule_stream=schedule_stream,
        forward_stream=forward_stream,
    )


def _capture(env: Any, name: str, body: Any) -> Any:
    """A graph captured at init (as `init_all_cuda_graphs` does), then the init's device sync."""
    import torch

    graph = torch.cuda.CUDAGraph()
    capture_stream = env.stream(f"{name}_capture_stream")
    capture_stream.wait_stream(env.current_stream())
    with torch.cuda.graph(graph, stream=capture_stream):
        body()
    env.synchronize()
    return graph


def _decode_graph_runner(env: Any, sgl: Sglang, s: SimpleNamespace, r: _Runner, name: str) -> Any:
    """A `DecodeCudaGraphRunner` carrying sglang's replay-path methods, its graph captured."""
    names = (
        "execute",
        "_resolve_shared_read_ends",
        "_publish_read_done",
        "_replay_attn_backend",
        "_record_in_graph_metadata_prep_done",
        "_process_output_after_replay",
    )
    runner = sglang_methods(sgl.DecodeCudaGraphRunner, names, "FakeDecodeCudaGraphRunner")()
    for attr, value in {
        "model_runner": r.model_runner,
        "device_module": s.device_module,
        "attn_backend": r.backend,
        "enable_pdmux": False,
        "in_graph_metadata_prep_done": None,
        "is_dllm": False,
        "raw_num_token": len(READ_ROWS),
        "bs": len(READ_ROWS),
        "captured_req_width": 1,
        "_replay_graph_key": SimpleNamespace(size=len(READ_ROWS)),
        "model_context": contextlib.nullcontext,
        "load_batch": lambda forward_batch, pp_proxy_tensors: r.backend.init_forward_metadata_out_graph(forward_batch),
    }.items():
        setattr(runner, attr, value)

    def body() -> None:
        # DecodeCudaGraphRunner._run_in_graph_metadata_prep's body: the in-graph hook, then sglang's marker.
        r.backend.init_forward_metadata_in_graph(None)
        runner._record_in_graph_metadata_prep_done()
        r.backend.layer_reads(r.out)

    runner.backend = _GraphBackend(_capture(env, name, body), r.out, r.hidden, sgl.LogitsProcessorOutput)
    return runner


def _draft_extend_runner(env: Any, sgl: Sglang, s: SimpleNamespace, r: _Runner) -> Any:
    """An `EAGLEDraftExtendCudaGraphRunner` carrying sglang's `execute` and what it calls, its static
    buffers and its draft graph captured (the graph reads the static `req_pool_indices` buffer)."""
    import torch

    names = ("execute", "_replay_graph", "_make_graph_key", "_pad_to_bucket", "_publish_read_done")
    runner = sglang_methods(sgl.EAGLEDraftExtendCudaGraphRunner, names, "FakeEAGLEDraftExtendCudaGraphRunner")()
    bs, width = len(READ_ROWS), 1

    def zeros(name: str, n: int) -> Any:
        return env.name(torch.zeros(n, dtype=torch.int64, device=env.device), f"draft_buffers.{name}")

    buffers = SimpleNamespace(
        **{name: zeros(name, bs * width) for name in ("input_ids", "out_cache_loc", "positions")},
        **{
            name: zeros(name, bs)
            for name in (
                "seq_lens",
                "req_pool_indices",
                "num_correct_drafts",
                "num_accept_tokens",
                "extend_seq_lens",
                "select_index",
            )
        },
        mamba_track_indices=None,
        hidden_states=None,
        seq_lens_cpu=None,
    )
    r.backend.indices = buffers.req_pool_indices  # the graph's static input, as execute's fb_view hands it
    for attr, value in {
        "buffers": buffers,
        "model_runner": r.model_runner,
        "device_module": s.device_module,
        "draft_extend_attn_backend": r.backend,
        "deepep_adapter": SimpleNamespace(replay=lambda: None),
        "require_mlp_tp_gather": False,
        "require_gathered_buffer": False,
        "capture_bs": [bs],
        "captured_req_width": width,
        "seq_len_fill_value": 1,
        "extend_seq_lens_cpu": [width] * bs,
        "forward_mode": sgl.ForwardMode.DRAFT_EXTEND_V2,
        "model_context": contextlib.nullcontext,
    }.items():
        setattr(runner, attr, value)

    def body() -> None:
        r.backend.init_forward_metadata_in_graph(None)
        r.backend.layer_reads(r.out)
        r.hidden.copy_(r.out.view(bs, 1).expand(bs, 4))

    runner.backend = _GraphBackend(_capture(env, "draft", body), r.out, r.hidden, sgl.LogitsProcessorOutput)
    return runner


def _draft_extend_batch(env: Any) -> tuple[Any, Any]:
    """The draft-extend `ForwardBatch` fields `EAGLEDraftExtendCudaGraphRunner.execute` reads, and its
    `select_index`, made on the forward stream."""
    import torch

    bs, device = len(READ_ROWS), env.device
    batch = SimpleNamespace(
        batch_size=bs,
        input_ids=torch.zeros(bs, dtype=torch.int64, device=device),
        seq_lens=torch.full((bs,), 8, dtype=torch.int64, device=device),
        out_cache_loc=torch.zeros(bs, dtype=torch.int64, device=device),
        positions=torch.zeros(bs, dtype=torch.int64, device=device),
        req_pool_indices=torch.tensor(READ_ROWS, dtype=torch.int64, device=device),
        spec_info=SimpleNamespace(num_correct_drafts=None, hidden_states=None),
        **dict.fromkeys(
            (
                "mrope_positions",
                "extend_seq_lens",
                "mamba_track_indices",
                "seq_lens_cpu",
                "extend_seq_lens_cpu",
                "seq_lens_sum",
                "out_cache_loc_virtual",
                "kv_loc_plan",
                "kv_loc_cols",
            )
        ),
    )
    return batch, torch.arange(bs, dtype=torch.int64, device=device)


def _forward(env: Any, sgl: Sglang, case: Case, s: SimpleNamespace) -> None:
    """The case's forward on the forward stream, its graphs captured first (engine init)."""
    import torch

    if case.kind == "decode_graph":
        runner = _decode_graph_runner(env, sgl, s, s.target, "decode")
        with env.use(s.forward_stream):
            runner.execute(SimpleNamespace(forward_mode=sgl.ForwardMode.DECODE, batch_size=len(READ_ROWS)))
    elif case.kind == "prefill_eager":  # EagerRunner.execute's order: metadata init, resolve, publish, model
        r = s.target
        batch = SimpleNamespace(forward_mode=sgl.ForwardMode.EXTEND, input_ids=torch.zeros(8))
        with env.use(s.forward_stream):
            r.backend.init_forward_metadata_out_graph(batch)
            ends = sgl.AttentionBackend.resolve_prefill_shared_read_ends(
                r.backend, batch, num_qo_tokens=len(batch.input_ids)
            )
            sgl.shared_read_event.maybe_publish_prefill_shared_read_done(r.model_runner, ends, s.device_module)
            r.backend.layer_reads(r.out)
    elif case.kind == "eagle_draft_extend":
        runner = _draft_extend_runner(env, sgl, s, s.draft)
        with env.use(s.forward_stream):
            runner.execute(*_draft_extend_batch(env))
    else:  # eagle_step: (staging,) the target verify, then the draft extend, in one forward
        verify = _decode_graph_runner(env, sgl, s, s.target, "verify")
        extend = _draft_extend_runner(env, sgl, s, s.draft)
        with env.use(s.forward_stream):
            if case.staged:  # the draft's shared reads copied into its own buffers before the verify
                s.draft.backend.gather()
            verify.execute(SimpleNamespace(forward_mode=sgl.ForwardMode.TARGET_VERIFY, batch_size=len(READ_ROWS)))
            extend.execute(*_draft_extend_batch(env))


def make_step(sgl: Sglang, case: Case, holder: dict[str, Any]) -> Any:
    """The trace step of `case`: the forward with sglang's publisher, sglang's barrier, the rewrite."""

    def step(env: Any) -> dict[str, Any]:
        s = _setup(env, sgl, case)
        with sgl.cpu_stand_ins(case.external_events):
            _forward(env, sgl, case, s)
        picked = s.scheduler.model_worker.last_shared_read_runner
        holder["fast_path"] = picked.shared_read_done_event is not None
        if s.draft is s.target:
            holder["runner"] = "the one"
        else:
            holder["runner"] = "draft" if picked is s.draft.model_runner else "target"
        with env.use(s.schedule_stream):
            sgl.Scheduler._apply_war_barrier(s.scheduler)
            s.req_to_token[READ_ROWS[0], 0:8] = -1  # a row rewrite (RadixCache.checkpoint, a reused row)
        env.synchronize()
        return {"target_logits": s.target.out, "draft_logits": s.draft.out}

    step.__name__ = f"read_done_{case.name}"
    return step


STREAM_CALLS = frozenset({"record", "wait_event", "wait_stream"})
"""The event and stream calls `sglang_sites` lists, by the sglang line that makes them."""


@contextlib.contextmanager
def sglang_sites(python_dir: str, sites: list[str]) -> Any:
    """Appends to `sites`, in call order, each sglang function entered (`function at file`, once each) and
    each `record` / `wait_event` / `wait_stream` call made from sglang's code (`record at file:line
    (function)`): which sglang line published the event and how the barrier waited on it."""
    root = os.path.join(python_dir, "sglang") + os.sep
    cut = len(python_dir) + 1
    entered: set[tuple[str, str]] = set()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        caller = frame.f_back
        if code.co_name in STREAM_CALLS and caller is not None and caller.f_code.co_filename.startswith(root):
            where = f"{caller.f_code.co_filename[cut:]}:{caller.f_lineno} ({caller.f_code.co_name})"
            sites.append(f"{code.co_name} at {where}")
        elif code.co_filename.startswith(root) and (code.co_filename, code.co_name) not in entered:
            entered.add((code.co_filename, code.co_name))
            sites.append(f"{code.co_name} in {code.co_filename[cut:]}")

    sys.setprofile(hook)
    try:
        yield sites
    finally:
        sys.setprofile(None)


def run_case(sgl: Sglang, case: Case, python_dir: str) -> dict[str, Any]:
    """Record `case`'s step once on the CPU and judge it by happens-before."""
    from racefuzz.trace.builder import launch_kind, launch_source
    from racefuzz.trace.judge import trace_races
    from racefuzz.trace.search import run_once

    holder: dict[str, Any] = {}
    sites: list[str] = []
    began = time.perf_counter()
    with sglang_sites(python_dir, sites):
        record = run_once(make_step(sgl, case, holder), "cpu")
    races = trace_races(record.program)
    return {
        "case": case.name,
        "publisher": case.kind,
        "declared": case.declared,
        "reads": list(case.reads),
        "spec": case.spec,
        "why": case.why,
        "expect": case.expect,
        "worker": f"{case.worker}.last_shared_read_runner -> {holder['runner']} runner",
        "barrier": "fast path (wait_event on the published event)" if holder["fast_path"] else "coarse (wait_stream)",
        "verdict": "race" if races else "clean",
        "as_expected": bool(races) == (case.expect == "race"),
        "races": [
            {
                "kind": race.race.kind.value,
                "where": list(race.where),
                "first": f"{race.first.kernel} on {race.first.stream} ({launch_kind(race.first)}) "
                f"{launch_source(race.first)}",
                "second": f"{race.second.kernel} on {race.second.stream} ({launch_kind(race.second)}) "
                f"{launch_source(race.second)}",
                "missing_edge": race.race.missing_edge(),
            }
            for race in races
        ],
        "sglang_calls": sites,
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
        from racefuzz.trace import fastpath

        # A few dozen ops a case: the C++ fast path (compiled on first use) buys nothing here.
        os.environ.setdefault(fastpath.ENV, "0")
        out["stubbed"] = len(stubs.install())
        sys.path.insert(0, args.python_dir)
        os.environ["SGLANG_ENABLE_PREFILL_WAR_READ_DONE"] = "1"  # the prefill publish is opt-in in 0.5.23
        os.environ.pop("SGLANG_FORCE_COARSE_WAR_BARRIER", None)
        sgl = Sglang()
        out["import_seconds"] = round(time.perf_counter() - began, 3)
        chosen = [c for c in CASES if not args.case or c.name in args.case]
        out["cases"] = [run_case(sgl, case, args.python_dir) for case in chosen]
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
