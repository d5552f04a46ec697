"""CUDA graphs in a recording: a capture is the launches and fences it recorded, a replay is those again.

In CUDA, work issued to a capturing stream does not run: it becomes the nodes of a graph, and each
`replay()` launches the whole graph on the stream current at the replay, after that stream's earlier work
and before its later work. A delay can be enqueued before or after a replay, never between its nodes. So:

* **Capture** (`begin` .. `end`: `CUDAGraph.capture_begin` / `capture_end`, which `torch.cuda.graph`
  calls). The step's launches, records and waits are recorded as usual, except that the recorder applies
  no delay, takes no snapshot and does not synchronize (a spin or a copy would become a node of the graph;
  a sync is refused by CUDA while a stream captures), and index ops and annotated kernels get their whole
  views (their index values at the capture are not those of a replay: a graph's inputs are refilled before
  each). The C++ fast path, which applies delays and snapshots itself, is off (the capture's dispatch
  mode on the stack sends every op to the recorder's mode). At `end` those ops leave the program (the
  builder takes them back: `ProgramBuilder.rewind`) and become the graph's template; frees and the host's own
  accesses during the capture happened then and stay (emitted again: `ProgramBuilder.replay`).
  A host sync inside a capture is refused with a `UserCodeError`, as CUDA refuses it. Tensors allocated
  inside the capture are kept until the recording ends: their blocks are the graph's pool's, which a
  replay writes again (their free is no write on a stream), and no reuse of a block freed on the capture's
  streams (`Allocation.allocated_on` cleared).
* **On the CPU** (`racefuzz.trace.torch_patches` gives a CPU recording `torch.cuda.CUDAGraph` and
  `torch.cuda.graph`) a captured torch op does not run either: its outputs are made from its meta kernel
  (`_outputs_without_running`), and the op runs at each replay on the same tensors (CUDA graphs' static
  buffers), its fresh outputs copied into those the capture returned. A captured Triton, CuPy or
  `launch_kernel` launch runs at each replay too.
* **Replay** (`start_replay` .. `replayed`). A boundary launch (kind `REPLAY`, no accesses) before and one
  after: those are the replay's delay points (the replay stream's n-th launch, as any launch), and the
  serialized reference run synchronizes after the first. In between, the template's ops: its launches
  as kind `GRAPH_NODE` (no delay point, no ordinal: the graph ran them), its records and waits as they
  were (a record inside the capture is a node the replay executes; a wait inside it orders the graph's
  later nodes after the event's latest record at the replay). The capture stream's ops go on the replay
  stream; another stream that joined the capture becomes a stream of its own per replay
  (`graph#1/stream#4 replay 2`), which only the graph's own records and waits order.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from racefuzz.errors import UserCodeError
from racefuzz.program import Launch, Record, WaitEvent
from racefuzz.trace import fastpath
from racefuzz.trace.annotations import WHOLE, annotation
from racefuzz.trace.builder import HOST, launch_kind, launch_source, sets_assumed

GRAPH_NODE = "graph"
"""The kind of a launch a replay ran (a node of the graph): no delay point of its own."""
REPLAY = "replay"
"""The kind of a replay's two boundary launches (no accesses): its delay points, before and after it."""


@dataclass
class Template:
    """What one capture recorded: the graph's nodes, in capture order.

    Args:
        name: `graph#k` (the k-th capture of the run).
        recorder: the recorder that captured it (a weak reference): a replay in another run is refused.
        stream: the capture stream (its ops go on the replay stream).
        ops: the captured launches, records and waits (program ops; no host-order op).
        calls: a CPU run's captured calls, run at each replay in order.
        kept: what the capture allocated (kept alive: see the module doc).
        replays: how many replays were recorded so far.
    """

    name: str
    recorder: Callable[[], Any]
    stream: str
    ops: list[Any] = field(default_factory=list)
    calls: list[Callable[[], None]] = field(default_factory=list)
    kept: list[Any] = field(default_factory=list)
    replays: int = 0


@dataclass
class _RecorderGraphs:
    """One recorder's graphs: how many were captured, their templates, a CPU run's default capture stream."""

    captured: int = 0
    templates: list[Template] = field(default_factory=list)
    capture_stream: Any = None


_GRAPHS: weakref.WeakKeyDictionary[Any, _RecorderGraphs] = weakref.WeakKeyDictionary()
_TEMPLATES: weakref.WeakKeyDictionary[Any, Template] = weakref.WeakKeyDictionary()
"""Graph object (a `torch.cuda.CUDAGraph`, or a CPU run's stand-in) -> its latest capture's template."""


def _graphs(recorder: Any) -> _RecorderGraphs:
    found = _GRAPHS.get(recorder)
    if found is None:
        found = _GRAPHS[recorder] = _RecorderGraphs()
    return found


class Capture:
    """A capture in progress (see the module doc): what `begin` changed on the recorder, restored by `end`."""

    def __init__(self, recorder: Any, template: Template, capture_mode: Callable[[list[Any]], Any]) -> None:
        self.recorder = recorder
        self.template = template
        self.start = recorder.builder.mark()
        self.start_ordinal = len(recorder.record.launch_ops)
        self.start_storage = len(recorder.builder.buffers)  # keys are 0, 1, ... in order of first sight
        self.saved = (recorder.delays, recorder.snapshot_plan, recorder.serialize, recorder.exact_indexing)
        recorder.delays, recorder.snapshot_plan, recorder.serialize, recorder.exact_indexing = {}, {}, False, False
        self.mode = capture_mode(template.kept)
        self.mode.__enter__()
        # A scope of the fast path begun with two modes on torch's stack routes every op to the mode.
        self.fast = fastpath.load()
        if self.fast is not None:
            self.fast.begin(fastpath.pack_state(self.fast, recorder.fast_state(object())))

    def close(self) -> None:
        """Undo what `__init__` changed (the fast path's scope, the mode, the recorder's settings)."""
        if self.fast is not None:
            self.fast.end()
        self.mode.__exit__(None, None, None)
        recorder = self.recorder
        recorder.delays, recorder.snapshot_plan, recorder.serialize, recorder.exact_indexing = self.saved
        CAPTURES.remove(self)

    def refused(self, what: str) -> UserCodeError:
        return UserCodeError(
            f"{what} inside the capture of CUDA graph {self.template.name}: the host cannot wait for a stream "
            "while it captures (CUDA refuses it: cudaErrorStreamCaptureUnsupported); move it out of the capture"
        )

    def deferred(self, func: Any) -> Callable[..., Any]:
        """`func` (a torch op) as a CPU capture records it: not run now, run at each replay (module doc)."""

        def captured(*args: Any, **kwargs: Any) -> Any:
            recorder = self.recorder
            recorder.paused += 1
            try:
                out = _outputs_without_running(func, args, kwargs)
            finally:
                recorder.paused -= 1
            self.template.calls.append(functools.partial(_run_into, func, args, kwargs, out))
            return out

        return captured

    def deferred_call(self, call: Callable[[], Any]) -> Callable[[], None]:
        """A kernel launch's `call` in a CPU capture: kept for the replays, not run now."""

        def captured() -> None:
            self.template.calls.append(call)

        return captured

    def kernel_launch(self, kernel: str, kind: str, bound: dict[str, Any], call: Callable[[], Any]) -> Any:
        """`Recorder.kernel_launch` inside a capture: an annotation's function of the arguments (index values
        at the capture) gives way to the argument's whole view, said in the trace (`Recorder.whole_view`)."""
        import torch

        recorder = self.recorder
        if not recorder.run_kernels:
            call = nothing
        if not recorder.on_gpu:
            call = self.deferred_call(call)
        tensors = {name: value for name, value in bound.items() if isinstance(value, torch.Tensor)}
        spec = annotation(kernel)
        if spec is None:
            recorder.assumed(kernel)
            return recorder.launch(kernel, kind, call, list(tensors.values()), list(tensors.items()), assumed=True)
        if any(how != WHOLE for how in (*spec.reads.values(), *spec.writes.values())):
            recorder.whole_view(kernel)
        reads = [tensors[name] for name in spec.reads if name in tensors]
        writes = [(name, tensors[name]) for name in spec.writes if name in tensors]
        return recorder.launch(kernel, kind, call, reads, writes)


CAPTURES: list[Capture] = []
"""The captures in progress (of any recorder; empty nearly always: the mode checks it per op)."""


def capture_of(recorder: Any) -> Capture | None:
    """The capture `recorder` is recording, if any."""
    for capture in CAPTURES:
        if capture.recorder is recorder:
            return capture
    return None


def begin(recorder: Any, capture_mode: Callable[[list[Any]], Any]) -> None:
    """A graph's `capture_begin()` ran on the recorder's thread, on its current stream: a capture starts (its
    graph is named at `end`). `capture_mode(kept)` makes the dispatch mode the capture puts on top of the
    recorder's, which keeps what each op allocates in `kept` (`racefuzz.trace.torch_mode.capture_mode`, whose
    frames the recorder knows as its own: a launch names the step's line, not the mode's)."""
    open_capture = capture_of(recorder)
    if open_capture is not None:
        raise UserCodeError(
            f"capture_begin of a CUDA graph inside the capture of {open_capture.template.name}: "
            "racefuzz records one capture at a time"
        )
    graphs = _graphs(recorder)
    graphs.captured += 1
    template = Template(f"graph#{graphs.captured}", weakref.ref(recorder), recorder.current_stream())
    graphs.templates.append(template)
    CAPTURES.append(Capture(recorder, template, capture_mode))


def end(recorder: Any, graph: Any) -> None:
    """`graph.capture_end()`: the ops since `begin` become the graph's template (see the module doc)."""
    capture = capture_of(recorder)
    if capture is None:
        return  # not begun in this recording: torch's own capture_end has said what is wrong, if anything
    capture.close()
    template = capture.template
    builder = recorder.builder
    recorded = builder.rewind(capture.start)
    del recorder.record.launch_ops[capture.start_ordinal :]
    for op in recorded:
        if type(op) is Launch and (launch_kind(op) == "free" or op.stream.name == HOST):
            builder.replay(op)  # it happened at the capture: not a node
        elif type(op) is Launch or type(op) is Record or type(op) is WaitEvent:
            template.ops.append(op)
        else:
            raise capture.refused(f"a host sync ({type(op).__name__})")
    # A block the capture allocated is the graph pool's: no reuse of a block freed on its stream
    # (`racefuzz.trace.lifetime` takes a later allocation on a free's stream for one).
    streams = {template.stream} | {op.stream.name for op in template.ops}
    for buffer in builder.buffers[capture.start_storage :]:
        allocation = buffer.allocation
        if allocation is not None and allocation.allocated_on in streams:
            builder.replace_buffer(buffer.id, buffer.name, allocation._replace(allocated_on=""))
    unjoined = _unjoined(template)
    if unjoined is not None:
        raise UserCodeError(
            f"stream {unjoined} joined the capture of CUDA graph {template.name} and was not joined back into its "
            f"capture stream {template.stream} before capture_end: CUDA refuses such a capture "
            "(cudaErrorStreamCaptureUnjoined); end the side work with capture_stream.wait_stream(side)"
        )
    _TEMPLATES[graph] = template


def _unjoined(template: Template) -> str | None:
    """A stream of the capture whose last op is not a record that the capture stream (or a stream joined
    into it) waits on later, if any: a branch CUDA's `capture_end` refuses."""
    ops = template.ops
    joined = {template.stream}
    branches = {op.stream.name for op in ops} - joined
    grew = True
    while grew:
        grew = False
        for branch in sorted(branches - joined):
            last = max(i for i, op in enumerate(ops) if op.stream.name == branch)
            end = ops[last]
            if type(end) is Record and any(
                type(op) is WaitEvent and op.event == end.event and op.stream.name in joined for op in ops[last + 1 :]
            ):
                joined.add(branch)
                grew = True
    return min(branches - joined, default=None)


class Replay(NamedTuple):
    """One replay of a template: `label` and `end_label` name its boundary launches."""

    template: Template
    number: int
    label: str
    end_label: str


def start_replay(recorder: Any, graph: Any) -> Replay:
    """A replay of `graph` starts; the caller then records `label`'s boundary launch (the replay itself
    runs in it, on a GPU), `replayed`, and `end_label`'s."""
    template = _TEMPLATES.get(graph)
    if template is None or template.recorder() is not recorder:
        raise UserCodeError(
            "replay() of a CUDA graph captured outside this run of the step: racefuzz records a graph's "
            "kernels at its capture, so capture it inside the step (torch.cuda.graph(g) there) to have its "
            "replays recorded"
        )
    inside = capture_of(recorder)
    if inside is not None:
        raise UserCodeError(
            f"replay() of {template.name} inside the capture of {inside.template.name}: not modelled by racefuzz"
        )
    template.replays += 1
    label = f"{template.name}.replay()"
    return Replay(template, template.replays, label, f"{label} done")


def replayed(recorder: Any, replay: Replay) -> None:
    """The graph's nodes, after the replay's first boundary launch (see the module doc); a CPU run runs them."""
    import torch

    template = replay.template
    if template.calls:
        recorder.paused += 1
        try:
            with torch._C._DisableTorchDispatch():
                for call in template.calls:
                    call()
        finally:
            recorder.paused -= 1
    builder = recorder.builder
    stream = recorder.current_stream()
    # The first boundary launch: the replay's own line.
    where = launch_source(builder.ops[recorder.record.launch_ops[-1]])  # type: ignore[arg-type]
    suffix = f"{template.name} replay {replay.number}"
    at = f", in {suffix}" + (f" at {where}" if where else "")
    streams = {template.stream: stream}
    for op in template.ops:
        on = streams.get(op.stream.name)
        if on is None:
            on = streams[op.stream.name] = f"{template.name}/{op.stream.name} replay {replay.number}"
        if type(op) is Launch:
            source = launch_source(op) + at
            builder.launch(on, op.kernel, GRAPH_NODE, op.reads, op.writes, source, sets_assumed(op))
        elif type(op) is Record:
            recorder.on_record(op.event.name, on)
        else:
            recorder.on_wait(op.event.name, on)  # a stream that joined the capture begins with one: it is named here


def forget(graph: Any) -> None:
    """`graph.reset()`: its template is gone (a replay before another capture is refused)."""
    _TEMPLATES.pop(graph, None)


def nothing() -> None:
    """The call of a boundary launch that runs nothing (the CPU's, the second one)."""


def default_capture_stream(recorder: Any, make: Callable[[], Any]) -> Any:
    """A CPU run's `torch.cuda.graph` capture stream when none is given: one per run, made by `make()` at
    the first capture (torch's own is one per process, made at the first `torch.cuda.graph`)."""
    graphs = _graphs(recorder)
    if graphs.capture_stream is None:
        graphs.capture_stream = make()
    return graphs.capture_stream


def capturing(recorder: Any) -> bool:
    """`torch.cuda.is_current_stream_capturing()` of a CPU run: a capture is in progress."""
    return capture_of(recorder) is not None


def abandon(recorder: Any) -> None:
    """The step returned or raised: a capture it left open is undone (its ops stay in the trace)."""
    capture = capture_of(recorder)
    if capture is not None:
        capture.close()


def release(recorder: Any) -> None:
    """The recording has ended (its frees are no longer recorded): what the recorder's graphs kept alive
    (the captures' tensors, a CPU run's calls) is let go."""
    graphs = _GRAPHS.pop(recorder, None)
    if graphs is not None:
        for template in graphs.templates:
            template.kept.clear()
            template.calls.clear()


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value)


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat(v)]
    return [value]


def _outputs_without_running(func: Any, args: tuple, kwargs: dict) -> Any:
    """What `func(*args, **kwargs)` returns, without running it: an argument it writes and returns is that
    argument; a fresh output is a new tensor of the meta kernel's shape, strides and dtype (its contents are
    what a replay writes into it). A UserCodeError where the op has no meta kernel."""
    import torch

    def to_meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="meta")
        if isinstance(value, torch.device):
            return torch.device("meta")
        return value

    with torch._C._DisableTorchDispatch():
        try:
            meta_kwargs = {
                name: "meta" if name == "device" and value is not None else _map(value, to_meta)
                for name, value in kwargs.items()
            }
            meta = func(*_map(args, to_meta), **meta_kwargs)
        except Exception as error:
            raise UserCodeError(
                f"{func} inside a CUDA graph capture of a CPU recording: racefuzz makes a captured op's outputs "
                f"from its meta kernel without running it, and this one has none usable "
                f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
            ) from None
        schema = func._schema
        returns = schema.returns
        if not returns:
            return None
        results = list(meta) if len(returns) > 1 else [meta]
        made = []
        for i, (ret, value) in enumerate(zip(returns, results, strict=True)):
            if ret.alias_info is not None:
                made.append(_aliased_argument(schema, ret.alias_info, args, kwargs, i))
            else:
                made.append(
                    _map(
                        value,
                        lambda m: (
                            torch.empty_strided(m.size(), m.stride(), dtype=m.dtype)
                            if isinstance(m, torch.Tensor)
                            else m
                        ),
                    )
                )
    return tuple(made) if len(returns) > 1 else made[0]


def _aliased_argument(schema: Any, alias: Any, args: tuple, kwargs: dict, position: int) -> Any:
    """The argument a return of `schema` aliases (`Tensor(a!)`: an in-place op's `self`, an `out=`)."""
    for i, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.before_set == alias.before_set:
            if not argument.kwarg_only and i < len(args):
                return args[i]
            if argument.name in kwargs:
                return kwargs[argument.name]
    raise UserCodeError(
        f"{schema.name} inside a CUDA graph capture of a CPU recording: its return {position} "
        "aliases no argument racefuzz can find"
    )


def _run_into(func: Any, args: tuple, kwargs: dict, captured: Any) -> None:
    """A captured op at a replay (CPU): run on the captured tensors, fresh outputs copied into the captured ones."""
    result = func(*args, **kwargs)
    for into, value in zip(_flat(captured), _flat(result), strict=True):
        if into is not value and hasattr(into, "copy_"):
            into.copy_(value)
