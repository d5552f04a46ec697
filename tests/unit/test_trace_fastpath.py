"""The recorder's C++ fast path (`racefuzz/trace/_fastpath.cpp`) against the Python path it replaces: the
same steps recorded both ways give the same trace, snapshots and outputs; the fast path really records
the in-place ops; and where it cannot be built, recording says why once and goes on in Python."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from racefuzz.trace import example, fastpath  # noqa: E402
from racefuzz.trace.recorder import Recorder  # noqa: E402
from racefuzz.trace.search import run_once  # noqa: E402

if fastpath.load() is None:  # compiled once per torch and Python version (10-60 s)
    pytest.skip(
        "the C++ fast path cannot be built here (Python < 3.11, no compiler or ninja; see stderr)",
        allow_module_level=True,
    )


def table_step(env):
    """In-place and `out=` writes of views (rows, a strided column, a tensor list) on three streams."""
    table = env.name(torch.zeros(4, 16, dtype=torch.int32), "req_to_token")
    scratch = torch.zeros(16, dtype=torch.int32)
    schedule, forward, plan = env.stream("schedule"), env.stream("forward"), env.stream("plan")
    for stream in (schedule, forward, plan):
        stream.wait_stream(env.current_stream())
    with env.use(forward):
        kv = table[1:3].sum(0)
        torch.add(table[0], 1, out=scratch)  # out=: a write of an argument
    with env.use(schedule):
        table[1, 4:8] = 7  # copy_ into a row view
        table[:, 2].add_(1)  # a strided column: the recorder's own interval merging
        table[3].copy_(scratch)
    with env.use(plan):
        torch._foreach_add_([table[0], table[2]], 1)  # returns nothing ("fresh" outputs): the Python path
        torch.cat([table[0], table[1]], out=torch.zeros(32, dtype=torch.int32))  # a tensor list: the fast path bails
        table.t().mul_(2)  # non-contiguous: the recorder's own interval merging
    done = env.event()
    done.record(plan)
    env.current_stream().wait_event(done)
    return {"kv": kv, "table": table}


def storage_step(env):
    """Frees, a storage grown in place by an `out=` op, host syncs before and after launches."""
    side = env.stream("side")
    side.wait_stream(env.current_stream())
    out = torch.zeros(4)
    out.resize_(0)
    torch.add(torch.ones(1 << 12), 1, out=out)  # grown: its old block freed then
    with env.use(side):
        scratch = out * 2
        picked = scratch[scratch > 2]  # a sync before the index launch
        total = picked.sum().item()  # a sync after the copy out
    del scratch  # freed on side
    out.add_(total)
    return {"out": out}


def reads_step(env):
    """Fresh-output ops reading two views: of one storage (overlapping, touching, the same view twice), of
    two storages, strided and empty ones (the recorder merges those itself)."""
    table = env.name(torch.arange(64, dtype=torch.float32).reshape(8, 8), "table")
    other = torch.ones(8)
    side = env.stream("side")
    side.wait_stream(env.current_stream())
    with env.use(side):
        outs = [
            table[0] + table[1],  # touching rows: one merged interval
            table[1:3].sum(0) + table[2],  # overlapping
            table[4] * table[4],
            table[5] + other,  # two storages, in first-seen order
            other + table[5],
            table[:, 0] + table[:, 1],  # strided
            table[0, :0] + table[1, :0],  # empty
            table[6] + 1,  # a wrapped number: one read
        ]
    env.current_stream().wait_stream(side)
    return {f"out{i}": out for i, out in enumerate(outs)}


def frees_step(env):
    """Fresh outputs freed and their blocks reused (the out-of-place workload), and one handed to
    `record_stream` (its free then not modelled)."""
    a, b = torch.ones(64), torch.ones(64)
    side = env.stream("side")
    side.wait_stream(env.current_stream())
    c = a
    for _ in range(4):
        c = a + b  # the previous `c` freed, its block handed to the next
    with env.use(side):
        kept = a * 2
    env._recorder.on_record_stream(kept)  # what `kept.record_stream(stream)` reports (a CUDA-only op)
    del kept
    env.current_stream().wait_stream(side)
    return {"c": c}


def assert_raised_in_the_step(error: BaseException, message: str) -> None:
    """`error` is the ValueError `message` raised inside the step, as itself or as what `run_once` wraps a
    step's exception in (`exception`: an error in user code naming the step)."""
    raised = getattr(error, "exception", error)
    assert isinstance(raised, ValueError) and str(raised) == message


def record(step, fast: bool, monkeypatch, **options):
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(fastpath, "load", lambda: None)
        return run_once(step, "cpu", **options)


@pytest.mark.parametrize(
    "options", [{}, {"serialize": True}, {"snapshot_plan": {}}], ids=["reference", "serial", "trace"]
)
@pytest.mark.parametrize(
    "step",
    [table_step, storage_step, reads_step, example.racy_step, example.synced_step],
    ids=["table", "storages", "reads", "example-racy", "example-synced"],
)
def test_the_fast_path_records_what_the_python_path_records(monkeypatch, options, step):
    options = {"watch_frees": True, **options}  # as on a GPU: frees and reused blocks recorded
    fast, slow = record(step, True, monkeypatch, **options), record(step, False, monkeypatch, **options)
    assert any(getattr(op, "info", {}).get("kind") == "free" for op in slow.program.ops) or step is not storage_step
    assert fast.program.ops == slow.program.ops
    assert fast.program.buffers == slow.program.buffers and fast.program.streams == slow.program.streams
    assert fast.launch_ops == slow.launch_ops
    assert {k: [(s.slot, s.lo, s.hi, s.intervals) for s in v] for k, v in fast.snapshots.items()} == {
        k: [(s.slot, s.lo, s.hi, s.intervals) for s in v] for k, v in slow.snapshots.items()
    }
    for ordinal, snaps in fast.snapshots.items():
        for mine, theirs in zip(snaps, slow.snapshots[ordinal], strict=True):
            assert torch.equal(mine.data, theirs.data)
    assert all(torch.equal(fast.outputs[k], slow.outputs[k]) for k in slow.outputs)


def test_the_fast_path_records_fresh_outputs_new_storages_and_frees_as_the_python_path_does(monkeypatch):
    fast = record(frees_step, True, monkeypatch, watch_frees=True, snapshot_plan={})
    slow = record(frees_step, False, monkeypatch, watch_frees=True, snapshot_plan={})
    assert fast.program.ops == slow.program.ops and fast.program.buffers == slow.program.buffers
    frees = [op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "free"]
    adds = [op for op in fast.program.ops if getattr(op, "kernel", None) == "aten.add.Tensor"]
    # Three of the four `c`s died in the step (`a` and `b` with its locals); `kept` was handed to `record_stream`.
    assert (
        len(adds) == 4
        and sorted(kernel.split(" ")[1] for kernel in frees)
        == ["(aten.add.Tensor))"] * 3 + ["(aten.ones.default))"] * 2
    )
    assert len({cells.buffer.id for op in adds for cells in op.writes}) == 4  # a reused block: a new storage


def test_the_fast_path_records_in_place_ops_without_the_python_launch(monkeypatch):
    calls = []
    original = Recorder.launch_op

    def counted(self, kernel, *args):
        calls.append(kernel)
        return original(self, kernel, *args)

    monkeypatch.setattr(Recorder, "launch_op", counted)
    record(table_step, True, monkeypatch)
    fast_calls = list(calls)
    calls.clear()
    record(table_step, False, monkeypatch)
    # Every in-place or `out=` op of the step (its streams already seen through their waits) is recorded by
    # the fast path; the Python path's own `launch_op` records them when it is off.
    assert fast_calls == ["aten.cat.out"]  # it bailed out, untouched, and the Python path recorded it
    assert sorted(calls) == [
        "aten.add.out",
        "aten.add_.Tensor",
        "aten.cat.out",
        "aten.fill_.Tensor",
        "aten.mul_.Tensor",
    ]


def counting_mode(seen: list[str]) -> type:
    """A step's own dispatch mode that appends each op it sees to `seen` and runs it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    return Counting


def mode_calls(monkeypatch) -> list[str]:
    """The ops that reach racefuzz's dispatch mode from now on (its `__torch_dispatch__` counted)."""
    from racefuzz.trace.torch_mode import trace_mode_class

    mode_class, calls = trace_mode_class(), []
    original = mode_class.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        calls.append(str(func))
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(mode_class, "__torch_dispatch__", counted)
    return calls


def test_in_place_ops_are_recorded_below_the_dispatch_mode(monkeypatch):
    calls = mode_calls(monkeypatch)
    record(table_step, True, monkeypatch)
    # Recorded by the dispatcher entry (in-place, `out=` and fresh outputs), they never reach the mode: nor
    # do the views the step takes.
    below = {"aten.add.out", "aten.add_.Tensor", "aten.mul_.Tensor", "aten.sum.dim_IntList", "aten.slice.Tensor"}
    assert not below & set(calls)
    assert "aten.cat.out" in calls  # a tensor list
    # Of its three factories, the first reaches the mode: the first op on a stream not seen yet (the mode
    # names it); the other two are recorded below it.
    assert calls.count("aten.zeros.default") == 1
    fast_calls = list(calls)
    calls.clear()
    record(table_step, False, monkeypatch)
    assert below <= set(calls)
    assert len(fast_calls) < len(calls)


def test_factories_are_recorded_below_the_dispatch_mode_and_a_meta_one_is_left_to_it(monkeypatch):
    def step(env):
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        with env.use(side):
            made = [torch.zeros(4), torch.arange(8), torch.full((2, 2), 3.0), torch.ones(3, dtype=torch.int64)]
            made += [torch.empty(5), torch.zeros(4, device="meta"), torch.zeros(2, device="cpu")]
            made.append(made[0] + made[1][:4])
        return {f"made{i}": t for i, t in enumerate(made) if not t.is_meta}

    calls = mode_calls(monkeypatch)
    fast = record(step, True, monkeypatch, watch_frees=True)
    # A meta factory is the mode's; the others are recorded below it (`empty` too: an allocation, no launch).
    assert calls.count("aten.zeros.default") == 1 and "aten.empty.memory_format" not in calls
    assert not {"aten.arange.default", "aten.full.default", "aten.ones.default", "aten.add.Tensor"} & set(calls)
    monkeypatch.undo()  # the counting wrapper would be the Python path's source line
    fast = record(step, True, monkeypatch, watch_frees=True)
    slow = record(step, False, monkeypatch, watch_frees=True)
    assert fast.program.ops == slow.program.ops and fast.program.buffers == slow.program.buffers
    kernels = [op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"]
    assert kernels.count("aten.zeros.default") == 3 and "aten.arange.default" in kernels


TRANSFORMED = {
    # A factory inside each transform (no wrapped argument to tell the fast path), and a plain op on
    # tensors captured from outside `grad` (whose output `grad` wraps after the op returns).
    "vmap": lambda x, a, b: torch.vmap(lambda r: r + torch.rand(3), randomness="different")(x),
    "functionalize": lambda x, a, b: torch.func.functionalize(lambda r: r + torch.zeros(3))(x),
    "grad": lambda x, a, b: torch.func.grad(lambda r: (r * torch.ones(3)).sum())(torch.ones(3)),
    "grad-captured": lambda x, a, b: torch.func.grad(lambda r: (r * (a + b)).sum())(torch.ones(3)),
}


@pytest.mark.parametrize("options", [{}, {"snapshot_plan": {}}], ids=["reference", "trace"])
@pytest.mark.parametrize("transform", list(TRANSFORMED))
def test_ops_inside_a_functorch_transform_are_left_to_the_mode(monkeypatch, transform, options):
    def step(env):
        x, a, b = torch.ones(4, 3), torch.ones(3), torch.ones(3)
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        with env.use(side):
            out = TRANSFORMED[transform](x, a, b)
        env.current_stream().wait_stream(side)
        return {"out": out}

    options = {"watch_frees": True, **options}
    fast, slow = record(step, True, monkeypatch, **options), record(step, False, monkeypatch, **options)
    assert fast.program.ops == slow.program.ops and fast.program.buffers == slow.program.buffers


def test_a_truthy_watch_frees_watches_frees_on_both_paths(monkeypatch):
    fast = record(frees_step, True, monkeypatch, watch_frees=1, snapshot_plan={})
    slow = record(frees_step, False, monkeypatch, watch_frees=1, snapshot_plan={})
    assert fast.program.ops == slow.program.ops
    assert any(getattr(op, "info", {}).get("kind") == "free" for op in fast.program.ops)


def test_a_mode_the_step_pushes_sees_every_op_and_the_trace_is_unchanged(monkeypatch):

    seen: list[str] = []
    Counting = counting_mode(seen)

    def step(env):
        with Counting():
            return table_step(env)

    fast, slow = record(step, True, monkeypatch), record(step, False, monkeypatch)
    assert fast.program.ops == slow.program.ops
    # The user's mode is above racefuzz's: the dispatcher entry leaves every op to the modes.
    assert {"aten.add.out", "aten.add_.Tensor", "aten.mul_.Tensor"} <= set(seen)


def test_metadata_ops_and_ops_torch_hides_from_the_mode_are_no_launches_on_either_path(monkeypatch):
    def step(env):
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        with env.use(side):
            rows = torch.tensor([1, 2])  # torch makes it with the mode's key excluded (a `detach_` inside)
            table = torch.zeros(4, 8)
            table.t_().unsqueeze_(0)  # in-place view ops: metadata only
            table.squeeze_(0).t_().detach_()
            with torch._C._DisableTorchDispatch():  # hidden from the mode by the step itself
                table.add_(1)
            table[rows] += 1
        return {"table": table}

    fast, slow = record(step, True, monkeypatch), record(step, False, monkeypatch)
    assert fast.program.ops == slow.program.ops
    launches = [op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"]
    assert not {"aten.detach_.default", "aten.unsqueeze_.default", "aten.t_.default", "aten.squeeze_.default"} & set(
        launches
    )
    assert launches.count("aten.add_.Tensor") == 1  # `table[rows] += 1`'s, not the hidden one


def autograd_step(env):
    """In-place ops where torch issues ops of its own above the mode's key: autograd's saved `clone`, a
    saved-tensors hook's ops, the conjugate fallback's copies."""
    side = env.stream("side")
    side.wait_stream(env.current_stream())
    with env.use(side):
        w = torch.ones(16, requires_grad=True)
        y = torch.ones(16) * w  # requires grad: in-place ops on it are recorded by autograd
        y.mul_(w)  # autograd saves a clone of `y`
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone().mul_(1), lambda t: t):
            y.div_(w)
        z = torch.ones(4, dtype=torch.complex64)
        z.conj().mul_(2)  # a conjugate view: materialized, multiplied, copied back
        y.sum().backward()
    return {"y": y.detach(), "z": z}


def test_ops_torch_issues_above_the_mode_are_recorded_by_both_paths_alike(monkeypatch):
    fast, slow = record(autograd_step, True, monkeypatch), record(autograd_step, False, monkeypatch)
    assert fast.program.ops == slow.program.ops
    launches = [op.kernel for op in slow.program.ops if getattr(op, "info", {}).get("kind") == "torch"]
    assert "aten.clone.default" in launches and "aten.copy_.default" in launches


def test_an_outer_mode_and_an_outer_recording_see_the_ops_of_an_inner_recording(monkeypatch):

    from racefuzz.trace.capture import recording
    from racefuzz.trace.env import TraceEnv

    seen: list[str] = []
    Counting = counting_mode(seen)

    with Counting():
        record(table_step, True, monkeypatch)
    assert {"aten.add.out", "aten.add_.Tensor", "aten.mul_.Tensor"} <= set(seen)

    outer, inner = Recorder("cpu"), Recorder("cpu")
    with recording(outer), recording(inner):
        table_step(TraceEnv(inner, "cpu"))
    for recorder in (outer, inner):
        kernels = {op.kernel for op in recorder.builder.ops if getattr(op, "info", {}).get("kind") == "torch"}
        assert {"aten.add.out", "aten.add_.Tensor", "aten.mul_.Tensor"} <= kernels


def test_an_error_after_a_fast_launch_reaches_the_step_as_itself(monkeypatch):
    original = Recorder.after_launch

    def failing(self, ordinal, writes):
        if self.builder.ops[self.record.launch_ops[ordinal]].kernel == "aten.mul_.Tensor":  # a fast launch
            raise ValueError("the recorder's snapshot failed")
        return original(self, ordinal, writes)

    monkeypatch.setattr(Recorder, "after_launch", failing)
    with pytest.raises(Exception) as raised:
        record(table_step, True, monkeypatch)
    assert_raised_in_the_step(raised.value, "the recorder's snapshot failed")


def test_a_mode_the_step_swaps_in_for_racefuzzs_sees_every_op(monkeypatch):
    from torch.utils._python_dispatch import _disable_current_modes

    seen: list[str] = []
    Counting = counting_mode(seen)

    def step(env):
        x = torch.zeros(8)
        with _disable_current_modes(), Counting():  # racefuzz's mode off the stack, the step's own the only one
            x.add_(1)
        return {"x": x}

    fast = record(step, True, monkeypatch)
    assert seen == ["aten.add_.Tensor"]
    seen.clear()
    assert fast.program.ops == record(step, False, monkeypatch).program.ops and seen == ["aten.add_.Tensor"]


def test_another_librarys_in_place_op_is_left_to_the_mode(monkeypatch):
    # An op outside aten may have kernels above the mode's key that issue ops of their own.
    library = torch.library.Library("racefuzz_test_fastpath", "DEF")
    library.define("bump(Tensor(a!) x) -> Tensor(a!)")

    def bump_autograd(x):  # an Autograd kernel, above the mode, made of two aten ops
        with torch._C._AutoDispatchBelowAutograd():
            x.add_(1)
            x.mul_(2)
        return x

    library.impl("bump", lambda x: x.add_(100), "CPU")
    library.impl("bump", bump_autograd, "Autograd")

    def step(env):
        x = torch.zeros(8)
        torch.ops.racefuzz_test_fastpath.bump(x)
        return {"x": x}

    fast, slow = record(step, True, monkeypatch), record(step, False, monkeypatch)
    assert fast.program.ops == slow.program.ops
    kernels = [op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"]
    assert kernels == ["aten.zeros.default", "aten.add_.Tensor", "aten.mul_.Tensor"]
    assert fast.outputs["x"].tolist() == [2.0] * 8


def test_a_write_torch_rejects_after_its_kernel_ran_is_recorded_by_both_paths(monkeypatch):
    def step(env):
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        with torch.inference_mode():
            cache = torch.zeros(8)  # an inference tensor, written below outside inference mode
        with env.use(side), pytest.raises(RuntimeError, match=r"[Ii]nference"):
            torch.add(torch.ones(8), 1, out=cache)  # written, then ADInplaceOrView raises
        return {"cache": cache.clone()}

    fast, slow = record(step, True, monkeypatch), record(step, False, monkeypatch)
    assert fast.program.ops == slow.program.ops
    assert ("aten.add.out", "side") in [(op.kernel, op.stream.name) for op in fast.program.ops if hasattr(op, "kernel")]


def test_recordings_on_two_threads_may_end_in_any_order(monkeypatch):
    import threading

    from racefuzz.trace.capture import recording
    from racefuzz.trace.env import TraceEnv

    started, first_ended, failures = threading.Event(), threading.Event(), []

    def second():
        try:
            recorder = Recorder("cpu")
            with recording(recorder):
                started.set()
                first_ended.wait(30)
                out = torch.zeros(4)
                out.add_(1)
            assert [op.kernel for op in recorder.builder.ops if getattr(op, "info", {}).get("kind") == "torch"] == [
                "aten.zeros.default",
                "aten.add_.Tensor",
            ]
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    worker = threading.Thread(target=second)
    first = Recorder("cpu")
    with recording(first):
        worker.start()
        started.wait(30)
        table_step(TraceEnv(first, "cpu"))
    first_ended.set()  # the first recording ended before the second, begun later
    worker.join(60)
    assert not failures, failures
    # The first thread records as before after its recording ended out of order.
    assert record(table_step, True, monkeypatch).program.ops == record(table_step, False, monkeypatch).program.ops


def test_a_jagged_nested_tensor_written_in_a_reference_run_is_recorded_without_a_crash(monkeypatch):
    def step(env):
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        with env.use(side):
            nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
            nested.mul_(2)  # its snapshot copied the process into a segfault before
        return {"out": torch.zeros(1)}

    # One recording: a second one of a jagged tensor's op in the same process raises on both paths (torch
    # says its storage is an "invalid python storage"), a known limit.
    fast = record(step, True, monkeypatch)  # a reference run: snapshots of every write
    assert "aten.mul_.Tensor" in [
        op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"
    ]


def test_autocast_casts_and_a_failing_fresh_op_are_recorded_by_both_paths_alike(monkeypatch):
    import gc
    import sys

    def step(env):
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        a, b = torch.ones(4, 4), torch.ones(4, 4)
        with env.use(side):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                product = torch.mm(a, b)  # autocast casts a and b first: launches, storages, frees
            x = torch.ones(4)
            for _ in range(3):
                with pytest.raises(RuntimeError):
                    x.to_mkldnn()  # an output without a storage: the recorder raises, on both paths
            references = sys.getrefcount(x)
            del x  # its free is recorded: nothing the failed ops held keeps it alive
        return {"product": product.float(), "references": torch.tensor(references)}

    fast, slow = record(step, True, monkeypatch), record(step, False, monkeypatch)
    gc.collect()
    assert fast.program.ops == slow.program.ops
    assert fast.outputs["references"] == slow.outputs["references"]
    assert "aten._to_copy.default" in [
        op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"
    ]


def test_ops_on_another_thread_are_not_recorded_by_either_path(monkeypatch):
    import threading

    def step(env):
        side = torch.zeros(8)
        # The worker takes the recording thread's dispatch keys, as torch's own worker threads (autograd's)
        # take a thread's local state: the dispatcher entry's key among them, racefuzz's mode not.
        keys = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()

        def work():
            with torch._C._ForceDispatchKeyGuard(*keys):
                side.add_(1)

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        out = torch.zeros(8)
        out.add_(side)
        return {"out": out}

    fast, slow = record(step, True, monkeypatch), record(step, False, monkeypatch)
    assert fast.program.ops == slow.program.ops
    assert [op.kernel for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"].count(
        "aten.add_.Tensor"
    ) == 1


def test_an_error_in_the_recorder_under_the_dispatcher_entry_reaches_the_step(monkeypatch):
    def failing(self, stream):
        raise ValueError("the recorder's delay failed")

    monkeypatch.setattr(Recorder, "delay", failing)
    with pytest.raises(Exception) as raised:
        record(table_step, True, monkeypatch, delays={("schedule", 0): 1.0})
    assert_raised_in_the_step(raised.value, "the recorder's delay failed")
    # The recording was ended cleanly: the next one records as before.
    monkeypatch.undo()
    assert record(table_step, True, monkeypatch).program.ops == record(table_step, False, monkeypatch).program.ops


@pytest.mark.filterwarnings("ignore::UserWarning")  # Dynamo on the Python path's mode frames
def test_a_torch_compiled_function_in_the_step_is_recorded_by_both_paths_alike(monkeypatch):
    @torch.compile(backend="eager")  # Dynamo's frame callback is on while the compiled code issues ops
    def bump(x, y):
        x.add_(1)
        y.mul_(x)
        return y

    def step(env):
        side = env.stream("side")
        side.wait_stream(env.current_stream())
        x, y = torch.zeros(16), torch.ones(16)
        with env.use(side):
            bump(x, y)
        return {"y": y}

    delays = {("side", 0): 10.0, ("side", 1): 10.0}  # the recorder's Python `_delay` runs from the fast path
    fast, slow = record(step, True, monkeypatch, delays=delays), record(step, False, monkeypatch, delays=delays)
    assert fast.program.ops == slow.program.ops and fast.delays_applied == slow.delays_applied
    launches = [
        (op.kernel, op.stream.name) for op in fast.program.ops if getattr(op, "info", {}).get("kind") == "torch"
    ]
    assert ("aten.add_.Tensor", "side") in launches and ("aten.mul_.Tensor", "side") in launches
    assert len(fast.delays_applied) == 2


def test_delays_on_the_cpu_are_applied_and_recorded_by_both_paths(monkeypatch):
    delays = {("schedule", 1): 100.0, ("plan", 0): 50.0}
    fast = record(table_step, True, monkeypatch, delays=delays)
    slow = record(table_step, False, monkeypatch, delays=delays)
    assert fast.delays_applied == slow.delays_applied and len(slow.delays_applied) == 2


def test_the_recorder_and_the_build_exchange_the_same_named_fields():
    from racefuzz.trace.recorder import fast_constants

    module = fastpath.load()
    assert set(Recorder("cpu").fast_state(object())) == set(module.STATE_FIELDS)
    assert set(fast_constants()) == set(module.CONSTANT_FIELDS)
    state = fastpath.pack_state(module, Recorder("cpu").fast_state(object()))
    assert len(state) == len(module.STATE_FIELDS)


def test_a_field_the_build_does_not_know_or_lacks_is_a_clear_error_not_a_misread_container():
    from racefuzz.trace.recorder import fast_constants

    module = fastpath.load()
    fields = Recorder("cpu").fast_state(object())
    renamed = {("epoch_of" if name == "epochs" else name): value for name, value in fields.items()}
    with pytest.raises(
        fastpath.FieldMismatch, match=r"the recorder's lack \['epochs'\], the build's lack \['epoch_of'\]"
    ):
        fastpath.pack_state(module, renamed)
    with pytest.raises(TypeError, match="are not the fields this build expects"):
        module.pack_state(renamed)  # the C++ checks too, for a caller that skips `fastpath.pack_state`
    fewer = {name: value for name, value in fields.items() if name != "keep"}
    with pytest.raises(TypeError, match="are not the fields this build expects"):
        module.pack_state(fewer)
    constants = fast_constants()
    del constants["kind_copy"]
    with pytest.raises(fastpath.FieldMismatch, match=r"the constants: the recorder's lack \['kind_copy'\]"):
        fastpath.configure(module, None, None, constants)
    with pytest.raises(TypeError, match="are not the fields this build expects"):
        module.configure(None, None, constants)


def test_without_the_fast_path_recording_says_why_once(monkeypatch, capsys):
    monkeypatch.setattr(fastpath, "_loaded", [])
    monkeypatch.setattr(fastpath, "SOURCE", "/nonexistent/_fastpath.cpp")
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent-cache-dir-for-racefuzz")
    assert fastpath.load() is None and fastpath.load() is None
    err = capsys.readouterr().err
    assert err.count("fast path is unavailable") == 1 and "RACEFUZZ_TRACE_FASTPATH=0" in err
    monkeypatch.setattr(fastpath, "_loaded", [])
    monkeypatch.setenv(fastpath.ENV, "0")
    assert fastpath.load() is None and capsys.readouterr().err == ""


def test_a_dispatch_key_already_taken_fails_the_load_not_the_process():
    import subprocess
    import sys

    # A fresh process: a fallback registered on a key stays for the process's life.
    script = """
import torch
taken = torch.library.Library("_", "IMPL", "TESTING_ONLY_GenericMode")  # held: dropped, it deregisters
taken.fallback(lambda *args, **kwargs: None)
from racefuzz.trace import fastpath
from racefuzz.trace.example import racy_step
from racefuzz.trace.search import run_once
assert fastpath.load() is None
print(len(run_once(racy_step, "cpu").program.ops), "ops recorded")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "ops recorded" in out.stdout
    assert "dispatch key TESTING_ONLY_GenericMode is already taken" in out.stderr


def test_a_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path, capsys):
    import os
    import time

    lock = tmp_path / "lock"
    lock.write_text("")
    fastpath._clear_stale_lock(str(lock))
    assert lock.exists() and capsys.readouterr().err == ""  # another process may be building now
    old = time.time() - fastpath.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    fastpath._clear_stale_lock(str(lock))
    assert not lock.exists() and "unfinished build" in capsys.readouterr().err


def test_each_interpreter_prefix_keeps_its_own_build_and_the_first_build_says_where(monkeypatch, capsys, tmp_path):
    import os
    import sys

    import torch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv-a"))
    first = fastpath.build_directory()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv-b"))
    second = fastpath.build_directory()
    assert first != second  # two virtual environments on one host: two builds, neither rebuilt by the other
    assert f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}" in second
    assert second.startswith(str(tmp_path / "racefuzz"))
    # The first build says it is compiling and where, on stderr, whoever asked (here the library's load()).
    built = []
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda name, sources, **options: built.append(options))
    monkeypatch.setattr(fastpath, "_loaded", [])
    fastpath.load()
    (line,) = capsys.readouterr().err.splitlines()
    assert "compiling the trace recorder's C++ fast path" in line and f"cache: {second}" in line
    assert built and built[0]["build_directory"] == second
    monkeypatch.setattr(fastpath, "_loaded", [])  # the next interpreter start, its build there: no line
    (tmp_path / "racefuzz" / os.path.basename(second) / f"{fastpath.NAME}.so").write_text("")
    fastpath.load()
    assert capsys.readouterr().err == ""


def test_two_checkouts_of_one_source_compile_one_path_and_share_the_build(monkeypatch, tmp_path):
    """ninja's build file names its source by absolute path: were each checkout's own `_fastpath.cpp`
    compiled, a tree and its CI clone (or two git worktrees) would rebuild whenever the other ran last. Both
    compile the build directory's copy: one path, one build; the copy is not rewritten when it is current
    (its mtime would make ninja rebuild)."""
    import os
    import shutil

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    compiled = []
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda name, sources, **options: compiled.append(sources))
    original = fastpath.SOURCE
    for checkout in ("tree", "ci-clone"):
        copy = tmp_path / checkout / "_fastpath.cpp"
        copy.parent.mkdir()
        shutil.copyfile(original, copy)
        monkeypatch.setattr(fastpath, "SOURCE", str(copy))
        monkeypatch.setattr(fastpath, "_loaded", [])
        fastpath.load()
    (first,), (second,) = compiled
    assert first == second and first.startswith(fastpath.build_directory())
    with open(first, "rb") as built, open(original, "rb") as source:
        assert built.read() == source.read()
    before = os.stat(first).st_mtime_ns
    fastpath.build_source(os.path.dirname(first))
    assert os.stat(first).st_mtime_ns == before
