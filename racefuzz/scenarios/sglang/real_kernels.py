"""sglang's own code under `racefuzz trace`: one overlap iteration pair on its real kernels (sglang 0.5.23).

The scenario's real-code step, beside its model (`loop.py`): the same designs, run on sglang's own pool
and Triton kernels and recorded by `racefuzz.trace` instead of built as a `Program`.

The pieces are sglang's, loaded from the installed wheel (`pip install racefuzz[sglang]`, which installs
`sglang==0.5.23` without its dependencies) without importing the `sglang` package (whose `__init__`
pulls in the server's dependencies):

* `ReqToTokenPool` (srt/mem_cache/memory_pool.py), the table `req_to_token` (row 0 is padding);
* writers: `write_req_to_token_pool_triton` (kernels/ops/memory/common.py, the extend write) and
  `assign_req_to_token_pool` (srt/mem_cache/allocation.py; DFLASH's over-allocation on the plan stream);
* readers: `create_flashinfer_kv_indices_triton` (kernels/ops/attention/kv_indices.py), `get_last_loc_triton`
  (kernels/ops/memory/common.py) and a torch gather of `req_to_token`.

Modules that import only torch and Triton are loaded whole from their files; from the two that import the
server, only the named definitions are taken (by their source, into a generated module whose header says
where each came from). Each design is the sync of sglang's scheduler written in its own terms:

* `none`: no WAR barrier (the negative control);
* `global-war`: `schedule_stream.wait_stream(forward_stream)` at the top of the next iteration, before
  the scheduler writes `req_to_token`;
* `war-after-launch`: `Scheduler._apply_war_barrier` right after `run_batch` launched the forward
  (sglang 0.5.23 srt/managers/scheduler.py, `event_loop_normal` and `_apply_war_barrier`; its coarse path
  `self.schedule_stream.wait_stream(self.forward_stream)`);
* `self-event`: DFLASH's `verify_done`: the forward records an event right after its reads of
  `req_to_token`, and the scheduler waits on that event before writing (the model's compute after the
  reads still overlaps).

The step: iteration 1 prefills a batch (scheduler writes rows on the schedule stream), the forward
stream waits for the schedule stream and reads the rows (kv indices, last locations, a gather) and then
computes; iteration 2 is prepared on the schedule stream while that forward runs: request 1 finished, its
row is reused by a new request and written, and the plan stream over-allocates draft slots of a running
request. The value the oracle watches is `kv_indices` of iteration 1.

`python -m ci.bench proof proof` (from the repository root, on a GPU) is the run of the committed results.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from racefuzz.trace.annotations import WHOLE, annotate, rows

SGLANG_VERSION = "0.5.23"
DESIGNS = ("none", "global-war", "war-after-launch", "self-event")
CONTROL = "none"

_LOADED: dict[str, Any] = {}


def sglang_root() -> Path:
    """The installed sglang package directory, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"sglang is not installed: pip install 'racefuzz[sglang]' "
            f"(sglang=={SGLANG_VERSION}, installed with --no-deps)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _extract(name: str, sources: list[tuple[Path, list[str]]], header: str) -> ModuleType:
    """A module made of the named top-level definitions of `sources`, each preceded by where it came from."""
    parts = [header]
    for path, names in sources:
        text = path.read_text()
        tree = ast.parse(text)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
                segment = "\n".join(text.splitlines()[start : node.end_lineno])
                parts.append(
                    f"# sglang {SGLANG_VERSION} {path.relative_to(path.parents[3])}:{start + 1} {node.name}\n"
                    f"{segment}\n"
                )
    directory = Path(tempfile.gettempdir()) / "racefuzz-sglang"
    directory.mkdir(exist_ok=True)
    target = directory / f"{name}.py"
    target.write_text("\n\n".join(parts))
    return _load_file(f"racefuzz_sglang_{name}", target)


def load_sglang() -> dict[str, Any]:
    """sglang's real pieces (see the module doc), loaded once."""
    if _LOADED:
        return _LOADED
    root = sglang_root()
    common = _load_file("racefuzz_sglang_memory_common", root / "kernels/ops/memory/common.py")
    kv = _load_file("racefuzz_sglang_kv_indices", root / "kernels/ops/attention/kv_indices.py")
    header = (
        "from __future__ import annotations\n"
        "import contextlib\nfrom typing import Any, Callable, List, Optional\n"
        "import torch\nimport triton\nimport triton.language as tl\n\n"
        "GPU_MEMORY_TYPE_KV_CACHE = 'kv_cache'\nReq = Any\n\n"
        "class TorchMemorySaverAdapter:  # racefuzz stub: the memory saver is off (enable_memory_saver=False)\n"
        "    @staticmethod\n    def create(enable):\n        return TorchMemorySaverAdapter()\n"
        "    def region(self, *args, **kwargs):\n        return contextlib.nullcontext()\n"
    )
    extracted = _extract(
        "pool_and_alloc",
        [
            (root / "srt/mem_cache/memory_pool.py", ["ReqToTokenPool"]),
            (root / "srt/mem_cache/allocation.py", ["assign_req_to_token_pool"]),
        ],
        header,
    )
    _LOADED.update(
        ReqToTokenPool=extracted.ReqToTokenPool,
        assign_req_to_token_pool=extracted.assign_req_to_token_pool,
        write_req_to_token_pool_triton=common.write_req_to_token_pool_triton,
        get_last_loc_triton=common.get_last_loc_triton,
        create_flashinfer_kv_indices_triton=kv.create_flashinfer_kv_indices_triton,
    )
    return _LOADED


def _last_loc_cells(args: dict[str, Any]) -> list[Any]:
    """`get_last_loc_kernel` loads `req_to_token[req_pool_indices[i], prefix_lens[i] - 1]` where prefix_lens > 0."""
    table = args["req_to_token"]
    pairs = zip(args["req_pool_indices_tensor"].tolist(), args["prefix_lens_tensor"].tolist(), strict=True)
    return [table[int(r), int(p) - 1 : int(p)] for r, p in pairs if int(p) > 0]


def register_annotations() -> None:
    """racefuzz's read/write sets of the sglang kernels this example launches (by their Triton names)."""
    annotate(
        "write_req_to_token_pool_triton",
        # The prefix is copied through data_ptr() values packed in `prefix_tensors`: no per-argument set
        # sees those reads; the pointer table itself is read.
        reads={
            name: WHOLE
            for name in ("req_pool_indices", "prefix_tensors", "pre_lens", "seq_lens", "extend_lens", "out_cache_loc")
        },
        writes={"req_to_token_ptr": rows("req_to_token_ptr", "req_pool_indices", lengths="seq_lens")},
    )
    annotate(
        "assign_req_to_token_pool",
        reads={name: WHOLE for name in ("req_pool_indices", "start_offset", "end_offset", "out_cache_loc")},
        writes={"req_to_token": rows("req_to_token", "req_pool_indices", starts="start_offset", ends="end_offset")},
    )
    annotate(
        "create_flashinfer_kv_indices_triton",
        reads={
            "req_to_token_ptr": rows(
                "req_to_token_ptr", "req_pool_indices_ptr", lengths="page_kernel_lens_ptr", starts="kv_start_idx"
            ),
            "req_pool_indices_ptr": WHOLE,
            "page_kernel_lens_ptr": WHOLE,
            "kv_indptr": WHOLE,
            "kv_start_idx": WHOLE,
        },
        writes={"kv_indices_ptr": WHOLE},
    )
    annotate(
        "get_last_loc_kernel",
        reads={"req_to_token": _last_loc_cells, "req_pool_indices_tensor": WHOLE, "prefix_lens_tensor": WHOLE},
        writes={"result": WHOLE},
    )


BATCH = 4
CONTEXT = 256
MODEL_MATMUL = 2048
"""The forward's compute after its reads (a square matmul of this size): what `self-event` overlaps."""


def overlap_step(env: Any, design: str = CONTROL) -> dict[str, Any]:
    """One overlap iteration pair on sglang's real pool and kernels under `design` (see the module doc)."""
    import torch

    sgl = load_sglang()
    register_annotations()
    device = env.device
    schedule, forward, plan = env.stream("schedule_stream"), env.stream("forward_stream"), env.stream("plan_stream")
    i32, i64 = torch.int32, torch.int64

    with env.use(schedule):
        pool = sgl["ReqToTokenPool"](BATCH + 2, CONTEXT, device, False)
        env.name(pool.req_to_token, "req_to_token")
        weights = torch.ones(MODEL_MATMUL, MODEL_MATMUL, device=device) / MODEL_MATMUL
        # Iteration 1, scheduler: prefill requests in rows 1..BATCH (row 0 is padding), extend only.
        req_pool_indices = torch.arange(1, BATCH + 1, dtype=i64, device=device)
        seq_lens = torch.tensor([64, 96, 32, 128], dtype=i64, device=device)
        pre_lens = torch.zeros(BATCH, dtype=i64, device=device)
        out_cache_loc = torch.arange(1000, 1000 + int(sum([64, 96, 32, 128])), dtype=i64, device=device)
        prefix_tensors = torch.zeros(BATCH, dtype=torch.uint64, device=device)
        sgl["write_req_to_token_pool_triton"][(BATCH,)](
            pool.req_to_token, req_pool_indices, prefix_tensors, pre_lens, seq_lens, seq_lens, out_cache_loc,
            pool.req_to_token.shape[1],
        )  # fmt: skip
        kv_indptr = torch.zeros(BATCH + 1, dtype=i32, device=device)
        kv_indptr[1:] = torch.cumsum(seq_lens, 0).to(i32)
        kv_indices = torch.empty(int(sum([64, 96, 32, 128])), dtype=i32, device=device)
        prefix_lens = seq_lens.clone()
    verify_done = env.event()

    # Iteration 1, forward (run_batch): the forward stream waits for the scheduler's writes, then reads.
    forward.wait_stream(schedule)
    with env.use(forward):
        sgl["create_flashinfer_kv_indices_triton"][(BATCH,)](
            pool.req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices, pool.req_to_token.shape[1]
        )
        last_loc = sgl["get_last_loc_triton"](pool.req_to_token, req_pool_indices, prefix_lens)
        gathered = pool.req_to_token[req_pool_indices, :32].to(i64)
        if design == "self-event":
            verify_done.record(forward)
        hidden = weights @ weights  # the model's compute, after the reads
        hidden_sum = hidden.sum()
    if design == "war-after-launch":
        schedule.wait_stream(forward)  # Scheduler._apply_war_barrier (coarse path), right after run_batch

    # Iteration 2, scheduler, overlapped with the forward above.
    if design == "global-war":
        schedule.wait_stream(forward)
    if design == "self-event":
        schedule.wait_event(verify_done)
    with env.use(schedule):
        # Request 1 finished; its row 1 is reused by a new request with different token locations.
        new_rows = torch.tensor([1], dtype=i64, device=device)
        new_lens = torch.tensor([48], dtype=i64, device=device)
        new_locs = torch.arange(5000, 5048, dtype=i64, device=device)
        sgl["write_req_to_token_pool_triton"][(1,)](
            pool.req_to_token, new_rows, torch.zeros(1, dtype=torch.uint64, device=device),
            torch.zeros(1, dtype=i64, device=device), new_lens, new_lens, new_locs, pool.req_to_token.shape[1],
        )  # fmt: skip
    plan.wait_stream(schedule)
    with env.use(plan):
        # DFLASH over-allocation (alloc_for_spec_decode): draft slots after the running request in row 4.
        start = torch.tensor([128], dtype=i64, device=device)
        end = torch.tensor([136], dtype=i64, device=device)
        sgl["assign_req_to_token_pool"][(1,)](
            torch.tensor([4], dtype=i64, device=device), pool.req_to_token, start, end,
            torch.arange(7000, 7008, dtype=i64, device=device), pool.req_to_token.shape[1], 1,
        )  # fmt: skip
    schedule.wait_stream(plan)
    forward.wait_stream(schedule)
    env.synchronize()
    return {"kv_indices": kv_indices, "last_loc": last_loc, "gathered": gathered, "hidden_sum": hidden_sum}


def step_for(design: str):
    """The step of `design`, importable as `racefuzz.scenarios.sglang.real_kernels:step_<design>`."""

    def step(env: Any) -> dict[str, Any]:
        return overlap_step(env, design)

    step.__name__ = step.__qualname__ = "step_" + design.replace("-", "_")
    return step


step_none = step_for("none")
step_global_war = step_for("global-war")
step_war_after_launch = step_for("war-after-launch")
step_self_event = step_for("self-event")
