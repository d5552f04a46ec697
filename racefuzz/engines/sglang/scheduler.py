"""Building sglang's own `Scheduler` on the CPU around a fake model, and driving its real event loop.

The scheduler is made by sglang's own `Scheduler.__init__`, with only the init steps that need a model,
a tokenizer, sockets or a distributed runtime replaced (`HarnessScheduler`'s overrides, one line each
below saying why). Everything the overlap loop runs afterwards is sglang's code: `run_event_loop` (which
computes `_war_barrier_enabled` with the version's own expression), `event_loop_overlap`,
`get_next_batch_to_run` with its `PrefillAdder`, `ScheduleBatch.init_new` / `prepare_for_extend` /
`prepare_for_decode` and their allocation into the real `ReqToTokenPool`, `run_batch` with the real
`FutureMap` and `resolve_forward_inputs`, `_apply_war_barrier`, the copy stream and `copy_done`, and the
result processing (`process_batch_result_prefill` -> the real, enabled `RadixCache` rewriting a row's
prefix; `release_kv_cache` freeing rows that the next prefill reuses).

Faked: the model worker (`fake_model.FakeTpWorker`), the request source (`WorkloadReceiver`: requests go
into the scheduler's own `_add_request_to_queue` instead of arriving over ZeroMQ, and it stops the loop
when the workload is done), IPC, the tokenizer and the detokenizer's output (mocks that record nothing),
the HF model config (`fake_model.fake_model_config`), and the process groups (mocks: world size 1).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from racefuzz.engines.sglang.adapters import Adapter
from racefuzz.engines.sglang.fake_model import FakeTpWorker, fake_model_config
from racefuzz.engines.sglang.workload import Request, Workload
from racefuzz.trace.host_memory import DEVICE

CONTEXT_LEN = 256
POOL_ROWS = 8
KV_TOKENS = 2048


@dataclass
class LoopRun:
    """What one run of the loop did: iterations, the sglang functions entered, the requests finished."""

    iterations: int = 0
    finished: list[str] = field(default_factory=list)
    functions: set[str] = field(default_factory=set)
    forward_callers: set[str] = field(default_factory=set)
    forwards: int = 0
    draft_forwards: int = 0
    read_sites: list[tuple[int, str]] = field(default_factory=list)


class WorkloadReceiver:
    """Hands `workload`'s requests to the scheduler at their arrival iterations, as the tokenizer manager's
    messages (`TokenizedGenerateReqInput`, through sglang's own `process_input_requests`), and sets the
    loop's own exit flag `gracefully_exit` once nothing is waiting, running or in flight (or the
    iteration budget is spent)."""

    def __init__(self, scheduler: Any, adapter: Adapter, workload: Workload, run: LoopRun) -> None:
        self.scheduler = scheduler
        self.adapter = adapter
        self.workload = workload
        self.run = run
        self.pending = sorted(workload.requests, key=lambda r: r.arrival)

    def idle(self) -> bool:
        s = self.scheduler
        running = getattr(s, "running_batch", None)
        return (
            not self.pending
            and not s.waiting_queue
            and (running is None or running.is_empty())
            and getattr(s, "last_batch", None) is None
            and not getattr(s, "result_queue", ())
            and getattr(s, "chunked_req", None) is None
        )

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        run = self.run
        iteration = run.iterations
        run.iterations += 1
        arrived = []
        while self.pending and self.pending[0].arrival <= iteration:
            arrived.append(self.adapter.make_input(self.scheduler, self.pending.pop(0)))
        if not arrived and (self.idle() or iteration >= self.workload.max_iterations):
            self.scheduler.gracefully_exit = True
        return arrived


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def configure(sgl: Any, adapter: Any, workload: Any, device: str = "cpu") -> None:
    """A fresh server config for one run of `workload`: sglang writes derived values into it (0.5.15
    scheduler.py:910 sets `pp_max_micro_batch_size` from the first run's pool once unset), so a shared one
    would give every later workload the first one's admission bound."""
    sgl.server_args = adapter.server_args(
        None,
        spec=workload.spec,
        radix_cache=workload.radix_cache,
        chunked_prefill=workload.chunked_prefill,
        mixed_chunk=workload.mixed_chunk,
        page_size=workload.page_size,
    )
    if device == "cuda":
        sgl.server_args.device = "cuda"


def build_and_run(
    env: Any,
    sgl: Any,
    adapter: Adapter,
    workload: Workload,
    barrier: bool,
    on_loop: Callable[[], None] = _noop,
    read_done: str = "none",
) -> LoopRun:
    """Build a `Scheduler` with sglang's `__init__` (heavy steps replaced), run its `run_event_loop` on
    `workload` under the trace env, and return what ran. `barrier` False sets `SGLANG_ENABLE_WAR_BARRIER`
    off, which the version's own `_war_barrier_enabled` expression reads (on the CPU `is_cuda()` is False):
    the negative control; on a GPU (`env.on_gpu`) it is the `_apply_war_barrier` override below (gpu.py)."""
    run = LoopRun()
    os.environ["SGLANG_ENABLE_WAR_BARRIER"] = "1" if barrier else "0"
    on_gpu = bool(getattr(env, "on_gpu", False))
    if on_gpu:  # torch.cuda's own streams, named as on the CPU (`gpu.py`)
        from racefuzz.engines.sglang.gpu import CudaDeviceModule as DeviceModule
        from racefuzz.engines.sglang.gpu import installed
    else:  # the CPU's stream shim; host memory split from the device's (`device.host_memory_split`)
        from racefuzz.engines.sglang.device import DeviceModule, host_memory_split, installed

    device_module = sgl.device_module = DeviceModule(env)
    scheduler_cls = adapter.scheduler_class(sgl)
    # On the CPU, sglang's `record_stream`s that a CPU guard skips run (#34076's among them), and its copies of
    # device tensors to the host take the accelerator branch, as on a GPU (`adapters.cuda_host_copies`).
    if not on_gpu:
        adapter.take_cuda_sides()

    worker_holder: dict[str, Any] = {}

    class HarnessScheduler(scheduler_cls):  # type: ignore[misc, valid-type]
        def init_model_config(self) -> None:  # the HF config comes from a model directory: faked
            self.model_config = fake_model_config(sgl, CONTEXT_LEN)
            self.dllm_config = None

        def init_ipc_channels(self, *args: Any, **kwargs: Any) -> None:  # ZeroMQ sockets: mocked
            self.ipc_channels = mock.MagicMock(name="ipc_channels")
            self.recv_from_tokenizer = None
            self.load_snapshot_writer = None
            adapter.after_ipc(self)

        def init_tokenizer(self) -> None:  # a tokenizer needs a model directory: none (skip_tokenizer_init)
            self.is_generation = True
            self.tokenizer = self.processor = None
            self._mm_processor = None

        def init_tp_model_worker(self) -> None:  # the model: the fake worker over sglang's real pools
            worker = FakeTpWorker(
                sgl,
                adapter,
                self,
                env,
                CONTEXT_LEN,
                workload.pool_rows,
                KV_TOKENS,
                read_done=read_done,
                attention=workload.attention,
                radix_cache=workload.radix_cache,
                page_size=workload.page_size,
                cuda_graph=workload.cuda_graph,
            )
            worker_holder["worker"] = worker
            self.tp_worker = worker

        def init_memory_pools(self) -> None:  # the fake worker made the pools (sglang's classes)
            if self.draft_worker is not None:  # as sglang's init_memory_pools: the draft aliases the target's
                pool, allocator = self.tp_worker.get_memory_pool()
                self.draft_worker.alloc_memory_pool(
                    memory_pool_config=None, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator
                )

        def init_all_attention_backends(self) -> None:  # no attention backend: the fake forward reads
            pass

        def init_all_cuda_graphs(self) -> None:  # no CUDA graphs on the CPU
            pass

        def init_startup_timing_summary(self, *args: Any, **kwargs: Any) -> None:  # a startup log line: skipped
            pass

        def init_profiler(self, *args: Any, **kwargs: Any) -> None:  # torch profiler: mocked
            self.profiler_manager = mock.MagicMock(name="profiler_manager")
            self.profiler_manager._profile_batch_predicate = _noop

        if on_gpu and not barrier:

            def _apply_war_barrier(self) -> None:  # the GPU's control: the flag off, the version's own guard
                # is_cuda() is True on a GPU, so SGLANG_ENABLE_WAR_BARRIER=0 cannot turn it off (gpu.py says
                # why this override and not a patched is_cuda, with the versions' lines).
                self._war_barrier_enabled = False
                super()._apply_war_barrier()

    receiver_holder: dict[str, WorkloadReceiver] = {}
    dflash = workload.spec == "dflash"
    spec_runtime = (
        adapter.dflash_runtime(env, worker_holder, workload.plan_stream, fence=barrier)
        if dflash
        else contextlib.nullcontext()
    )
    host_memory = contextlib.nullcontext() if on_gpu else host_memory_split()
    with host_memory, installed(device_module), adapter.patched_runtime(sgl, env, worker_holder), spec_runtime:
        if dflash and workload.plan_stream:  # keyed by the batch's device, the worker's
            adapter.install_plan_stream(env, "cuda" if on_gpu else DEVICE)
        scheduler = HarnessScheduler(*adapter.init_args(sgl))
        if dflash:
            adapter.prepare_dflash_worker(scheduler.draft_worker, on_gpu)
        receiver = WorkloadReceiver(scheduler, adapter, workload, run)
        receiver_holder["r"] = receiver
        adapter.install_receiver(scheduler, receiver)
        # The engine's init ends with the device idle (its memory profiling, warmups and graph capture
        # synchronize it): what init enqueued on the default stream is done before the loop starts.
        env.synchronize()
        on_loop()
        scheduler.run_event_loop()
    worker = worker_holder["worker"]
    run.forward_callers, run.forwards = set(worker.callers), worker.forwards
    run.read_sites = list(worker.read_sites)
    draft = getattr(scheduler, "draft_worker", None)
    if dflash and draft is not None:
        run.draft_forwards = draft.draft_model_runner.forwards
    return run


SYNC_CALLS = frozenset({"synchronize", "wait_event", "wait_stream", "wait", "query"})
"""The stream and event methods whose calls from sglang's code `profile_functions` counts, by call site."""
_SYNC_FILES = (os.path.join("racefuzz", "trace", "env.py"), os.path.join("torch", "cuda", "streams.py"))
_GPU_WRAPPERS = {
    "event_wait": "wait",
    "event_sync": "synchronize",
    "event_done": "query",
    "stream_sync": "synchronize",
    "stream_done": "query",
    "pooled_wait_stream": "wait_stream",
}
"""On a GPU the recorder replaces torch.cuda's methods with these (`racefuzz/trace/cuda_api.py`): a call
of one from sglang's code is a call of the method it stands for."""
_CUDA_API_FILE = os.path.join("racefuzz", "trace", "cuda_api.py")


def _sync_method(code: Any) -> str | None:
    """The stream/event method `code` is (see `SYNC_CALLS`), or None."""
    if code.co_name in SYNC_CALLS and code.co_filename.endswith(_SYNC_FILES):
        return code.co_name
    if code.co_filename.endswith(_CUDA_API_FILE):
        return _GPU_WRAPPERS.get(code.co_name)
    return None


def profile_functions(
    root: str, syncs: dict[str, int] | None = None
) -> tuple[Callable[[], None], Callable[[], tuple[set[str], list[tuple[int, str]]]]]:
    """A `sys.setprofile` hook collecting every sglang function called (`file:function`), and for each
    call of a `write` method of sglang's memory pools, the trace position at the call and the chain of
    sglang callers above it (the recorder keeps only a launch's innermost line; a race report names the
    path that reached the writer: the last call before the launch). `start()`, then `stop()` ->
    (functions, [(trace position, caller chain)]).

    With `syncs`, it also counts every call sglang's code makes to a stream's or event's `synchronize`,
    `wait_event`, `wait_stream`, `wait` or `query` (the trace env's virtual streams and events on the
    CPU, torch.cuda's on a GPU), keyed `method at sglang/file.py:line (function)`: the counts that set a
    design's cost (host blocks, stream waits), independent of the machine's timing.

    The hook stands aside while racefuzz's recorder handles a torch op (`recorder_stands_aside`): no
    sglang code runs there, and on Python 3.11 a profile hook runs every instruction on the interpreter's
    unspecialized path, so the recorder's own Python was most of what the hook cost."""
    from racefuzz.trace.capture import active

    seen: set[tuple[str, str]] = set()
    calls: list[tuple[int, str]] = []
    prefix = os.path.join(root, "sglang") + os.sep
    cut = len(root) + 1

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        filename = code.co_filename
        method = _sync_method(code) if syncs is not None else None
        if method is not None:
            caller = frame.f_back
            if syncs is not None and caller is not None and caller.f_code.co_filename.startswith(prefix):
                where = f"{caller.f_code.co_filename[cut:]}:{caller.f_lineno} ({caller.f_code.co_name})"
                site = f"{method} at {where}"
                syncs[site] = syncs.get(site, 0) + 1
            return
        if not filename.startswith(prefix):
            return
        seen.add((filename, code.co_name))
        if code.co_name == "write" and filename.endswith(("memory_pool.py", "allocation.py")):
            links = []
            caller = frame.f_back
            while caller is not None and len(links) < 5:
                name = caller.f_code.co_filename
                if name.startswith(prefix) and not name.endswith("nvtx_utils.py"):
                    links.append(f"{name[cut:]}:{caller.f_lineno} ({caller.f_code.co_name})")
                caller = caller.f_back
            recorder = active()
            position = len(recorder.builder.ops) if recorder is not None else -1
            calls.append((position, " <- ".join(links)))

    restore: list[Callable[[], None]] = []

    def start() -> None:
        restore.append(recorder_stands_aside())
        sys.setprofile(hook)

    def stop() -> tuple[set[str], list[tuple[int, str]]]:
        sys.setprofile(None)
        while restore:
            restore.pop()()
        return {f"{file[cut:]}:{name}" for file, name in seen}, calls

    return start, stop


def recorder_stands_aside() -> Callable[[], None]:
    """While the recorder's torch dispatch modes that are active now (racefuzz.trace's classes on torch's
    mode stack: the recording's, and on the CPU the host-memory split's) handle an op, no profile hook is
    set (the one set before is restored after, so nested modes nest): the classes' `__torch_dispatch__` is
    replaced. Returns the function that puts their own back (`profile_functions`' `stop()` calls it)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    replaced: list[tuple[type, Any]] = []
    for mode in _get_current_dispatch_mode_stack():
        cls = type(mode)
        own = cls.__dict__.get("__torch_dispatch__")
        if own is None or not cls.__module__.startswith("racefuzz.trace.") or any(c is cls for c, _ in replaced):
            continue
        cls.__torch_dispatch__ = _unprofiled(own)  # type: ignore[attr-defined]
        replaced.append((cls, own))

    def put_back() -> None:
        for cls, own in replaced:
            cls.__torch_dispatch__ = own  # type: ignore[attr-defined]

    return put_back


def _unprofiled(dispatch: Callable[..., Any]) -> Callable[..., Any]:
    """`dispatch` with no profile hook set while it runs; its frame is the recorder's (a launch is still
    named by the engine's line that made it, not by this one)."""
    from racefuzz.trace.sources import count_as_recorder

    def unprofiled(*args: Any, **kwargs: Any) -> Any:
        hook = sys.getprofile()
        sys.setprofile(None)
        try:
            return dispatch(*args, **kwargs)
        finally:
            sys.setprofile(hook)

    count_as_recorder(unprofiled.__code__)
    return unprofiled


def caller_chain(calls: list[tuple[int, str]], op_index: int) -> str | None:
    """The caller chain of the last pool `write` call made before trace op `op_index`."""
    chosen = None
    for position, chain in calls:
        if position <= op_index:
            chosen = chain
        else:
            break
    return chosen


__all__ = ["LoopRun", "Request", "WorkloadReceiver", "build_and_run", "caller_chain"]
