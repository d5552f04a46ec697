"""The loop's decode through a CUDA graph (`Workload.cuda_graph`): sglang's own replay path around the fake
worker's graph, recorded with racefuzz's CUDA-graph machinery (`racefuzz.trace.graphs`).

sglang decodes under a graph runner's replay on a GPU. On the CPU its own graph path is another runner:
`capture_decode_graph` builds `CPUGraphRunner` (torch.compile, no graph, no streams) for device "cpu" and
only with `enable_torch_compile` (0.5.23 `model_executor/model_runner_components/cuda_graph_setup.py`
:735, :774; 0.5.15 `model_executor/model_runner.py:ModelRunner.init_decode_cuda_graph`, :2637), and
`DecodeCudaGraphRunner.__init__` / `capture` (0.5.23 `model_executor/runner/decode_cuda_graph_runner.py`
:275, :1249; `capture_one_shape`, :1368) capture the attention backend's capture-time metadata and
`model_runner.model`'s forward, which the fake worker has not (no model, no backend). What does run on
the CPU is the replay path, on a stand-in runner (as `read_done.py` drives it):

* **sglang's**: `DecodeCudaGraphRunner.execute` (0.5.15 :1009, 0.5.23 :1981) and, where the version has
  them, `_resolve_shared_read_ends`, `_replay_attn_backend`, `_publish_read_done`,
  `_process_output_after_replay`, and at the capture `_record_in_graph_metadata_prep_done` (the in-graph
  marker, 0.5.23 :655); the read-done event each version publishes (0.5.15: recorded after `load_batch`,
  before the replay, into `war_fastpath_read_done_event`; 0.5.23: the in-graph marker handed to
  `shared_read_done_event`, as the base `AttentionBackend.shared_read_ends` declares IN_REPLAY for decode,
  `layers/attention/base_attn_backend.py:195`), which `_apply_war_barrier`'s fast path then waits on;
* **the recorder's**: the capture (`torch.cuda.graph`, racefuzz's CPU stand-in) at the worker's init, one
  graph per batch size 1..`pool_rows` (sglang's `capture_bs`), and each replay (its ops again, on the
  forward stream, as graph nodes);
* **fake**: the graph's body (the backend's `req_to_token` read and the model's few ops, into static
  buffers), `load_batch` (the batch's `req_pool_indices` and `seq_lens` copied into the static buffers, as
  sglang's input buffers are filled), the runner object and the backend.

Where the fake backend reads `req_to_token` follows where the version's runner says reads end: a version
with the in-graph marker reads inside the graph before it (0.5.23 FA3's `init_forward_metadata_in_graph`,
`flashattention_backend.py:478`, gathers the page table there); a version without it publishes before the
replay, so its backends read in `load_batch` (FlashInfer's and FA3's `init_forward_metadata_replay_cuda_graph`).
A read inside a capture is recorded as the whole `req_to_token` (`graphs.Capture.kernel_launch`: the
capture's index values are not a replay's): conservative, every row.

Without a marker stand-in, `make_external_event` returns None off CUDA and 0.5.23 falls back to a
post-replay event (`_resolve_shared_read_ends`); the capture runs with `read_done.Sglang.cpu_stand_ins`'
stand-in (`torch.cuda.Event(external=True)`), as a GPU has external events.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

RUNNER_METHODS = (
    "execute",
    "_resolve_shared_read_ends",
    "_replay_attn_backend",
    "_publish_read_done",
    "_record_in_graph_metadata_prep_done",
    "_process_output_after_replay",
)
"""`DecodeCudaGraphRunner`'s replay-path methods the stand-in runner carries (those the version defines)."""


class GraphBackend:
    """The fake attention backend and graph store of one captured batch size: static `req_pool_indices`,
    `seq_lens` and logits, the read of `req_to_token` (in the graph or in `load_batch`), the replay."""

    def __init__(self, worker: Any, bs: int, in_graph: bool) -> None:
        import torch

        self.worker, self.bs, self.in_graph = worker, bs, in_graph
        device, env = worker.device, worker.env

        def static(name: str, made: Any) -> Any:
            return env.name(made, f"graph{bs}.{name}")

        self.req_pool_indices = static("req_pool_indices", torch.zeros(bs, dtype=torch.int64, device=device))
        self.seq_lens = static("seq_lens", torch.ones(bs, dtype=torch.int64, device=device))
        self.table = static("page_table", torch.zeros((bs, worker.context_len), dtype=torch.int32, device=device))
        self.vocab = int(worker.model_config.vocab_size)  # the fake model's (fake_model.VOCAB)
        self.logits = static("logits", torch.zeros((bs, self.vocab), dtype=torch.float32, device=device))
        self.graph: Any = None

    def shared_read_ends(self, forward_mode: Any) -> Any:
        """sglang's own declaration for its base backend (0.5.23 `AttentionBackend.shared_read_ends`)."""
        from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

        return AttentionBackend.shared_read_ends(self, forward_mode)

    def read(self) -> None:
        """The backend's read of the batch's rows into its private page table (the fake forward's read)."""
        self.table.copy_(self.worker.read_kv_indices(self.req_pool_indices, self.seq_lens))

    def load_batch(self, forward_batch: Any, pp_proxy_tensors: Any = None) -> None:
        """The input buffers filled from the batch, then (a version without the marker) the read."""
        self.req_pool_indices.copy_(forward_batch.req_pool_indices)
        self.seq_lens.copy_(forward_batch.seq_lens)
        if not self.in_graph:
            self.read()

    def model(self) -> None:
        """The model's ops over the private table, into the static logits (as the eager fake's forward)."""
        import torch

        hidden = (self.table.to(torch.int64).sum(dim=1) * 31 + self.seq_lens * 7) % self.vocab
        self.logits.zero_()
        self.logits.scatter_(1, hidden[:, None], 1.0)

    def replay_session(self) -> Any:
        return contextlib.nullcontext()

    def replay(self, key: Any, forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        self.graph.replay()
        return LogitsProcessorOutput(next_token_logits=self.logits, hidden_states=None)


class DecodeGraphs:
    """The decode graphs of one fake worker: captured at its init, replayed through sglang's
    `DecodeCudaGraphRunner.execute` on a stand-in runner per batch size."""

    def __init__(self, worker: Any, sizes: range) -> None:
        import torch
        from sglang.srt.model_executor.runner import decode_cuda_graph_runner

        from racefuzz.engines.sglang.read_done import RunnerDeviceModule, sglang_methods

        runner_class = decode_cuda_graph_runner.DecodeCudaGraphRunner
        names = tuple(name for name in RUNNER_METHODS if any(name in k.__dict__ for k in runner_class.__mro__))
        self.methods = names
        self.in_graph = "_record_in_graph_metadata_prep_done" in names
        env = worker.env
        device_module = RunnerDeviceModule(env)
        stand_in = torch.cuda.Event  # racefuzz's CPU stand-in inside a recording
        saved = getattr(decode_cuda_graph_runner, "make_external_event", None)
        if saved is not None:
            decode_cuda_graph_runner.make_external_event = lambda module: stand_in(external=True)
        self.runners: dict[int, Any] = {}
        try:
            for bs in sizes:
                backend = GraphBackend(worker, bs, self.in_graph)
                runner = sglang_methods(runner_class, names, "FakeDecodeCudaGraphRunner")()
                for attr, value in {
                    "model_runner": worker.model_runner,
                    "device_module": device_module,
                    "attn_backend": backend,
                    "backend": backend,
                    "load_batch": backend.load_batch,
                    "enable_pdmux": False,
                    "in_graph_metadata_prep_done": None,
                    "is_dllm": False,
                    "raw_num_token": bs,
                    "bs": bs,
                    "captured_req_width": 1,
                    "_replay_graph_key": SimpleNamespace(size=bs),
                    "model_context": contextlib.nullcontext,
                }.items():
                    setattr(runner, attr, value)
                backend.graph = self._capture(env, backend, runner)
                self.runners[bs] = runner
        finally:
            if saved is not None:
                decode_cuda_graph_runner.make_external_event = saved
        env.synchronize()  # the engine's init ends with the device idle (its graph capture synchronizes it)

    def _capture(self, env: Any, backend: GraphBackend, runner: Any) -> Any:
        import torch

        graph = torch.cuda.CUDAGraph()
        stream = env.stream(f"graph_capture_stream#{backend.bs}")
        stream.wait_stream(env.current_stream())
        with torch.cuda.graph(graph, stream=stream):
            if self.in_graph:  # DecodeCudaGraphRunner._run_in_graph_metadata_prep's body, then the layers
                backend.read()
                runner._record_in_graph_metadata_prep_done()
            backend.model()
        return graph

    def runs(self, batch: Any) -> bool:
        """Whether `batch` decodes through a graph: a decode batch of a captured size."""
        mode = getattr(batch, "forward_mode", None)
        return mode is not None and mode.is_decode() and int(batch.req_pool_indices.shape[0]) in self.runners

    def forward(self, batch: Any) -> Any:
        """sglang's `execute` on the runner of the batch's size: the logits of the replay (a static buffer)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        bs = int(batch.req_pool_indices.shape[0])
        forward_batch = SimpleNamespace(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
        )
        return self.runners[bs].execute(forward_batch).next_token_logits
