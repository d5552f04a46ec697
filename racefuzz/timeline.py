"""The timeline of a counterexample: a Chrome/Perfetto trace and a PNG.

Tracks are the host and each stream; spans are the kernels, the injected delays (spins), host delays
and blocking syncs of the run (simulated, or measured with CUDA events on the GPU). The two accesses of
the reported race are flagged: red in the PNG, `"conflict"` in the trace's args and a distinct colour
(`cname`) in Perfetto / chrome://tracing.
"""

from __future__ import annotations

import json
from pathlib import Path

from racefuzz.execution import HOST, Execution, Span
from racefuzz.hb import Race
from racefuzz.results import Outcome
from racefuzz.sim import simulate

_KIND_COLOURS = {"kernel": "#4C72B0", "spin": "#BBBBBB", "host_delay": "#DDAA33", "sync": "#55A868", "gate": "#8C564B"}
"""Span kinds' colours; a `gate` is a forced order's wait before the launch it holds back (its label names
the launch it waits for)."""
_CONFLICT_COLOUR = "#C44E52"


def _tracks(spans: list[Span]) -> list[str]:
    streams = sorted({s.track for s in spans if s.track != HOST})
    return [HOST, *streams]


def _conflict(span: Span, race: Race | None) -> str | None:
    if race is None or span.kind != "kernel":
        return None
    if span.op_index == race.first.index:
        return "first (issued earlier)"
    if span.op_index == race.second.index:
        return "second (issued later)"
    return None


def timeline_of(outcome: Outcome, backend: str) -> Execution:
    """An execution of the counterexample with its timeline: the one it has, else a re-run that records it
    (on the GPU with timing events; a happens-before-only counterexample on the backend, unperturbed)."""
    execution = outcome.execution
    if execution is not None and execution.timeline:
        return execution
    if backend == "cuda":
        from racefuzz.backends.cuda import CudaConfig, execute

        return execute(outcome.program, outcome.schedule, CudaConfig(timeline=True))
    return simulate(outcome.program, outcome.schedule)


def write_timeline(outcome: Outcome, backend: str, race: Race | None, stem: Path, title: str) -> list[Path]:
    """Write `<stem>.trace.json` and `<stem>.png` (when matplotlib is installed); returns what was written."""
    execution = timeline_of(outcome, backend)
    # Names are built as strings: a stem such as "mypkg.sync-1a2b" has a dot that with_suffix would eat.
    written = [write_trace(stem.parent / f"{stem.name}.trace.json", execution, race, title)]
    png = write_png(stem.parent / f"{stem.name}.png", execution, race, title, dict(outcome.schedule.read_spins))
    if png is not None:
        written.append(png)
    return written


def chrome_trace(execution: Execution, race: Race | None, title: str) -> dict[str, object]:
    """The run as Chrome trace JSON (load it in ui.perfetto.dev or chrome://tracing)."""
    tracks = _tracks(execution.timeline)
    events: list[dict[str, object]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": title}},
    ]
    for tid, track in enumerate(tracks):
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    for span in execution.timeline:
        event: dict[str, object] = {
            "name": span.label,
            "cat": span.kind,
            "ph": "X",
            "pid": 1,
            "tid": tracks.index(span.track),
            "ts": span.start_us,
            "dur": max(span.end_us - span.start_us, 0.001),
            "args": {"op": span.op_index},
        }
        conflict = _conflict(span, race)
        if conflict is not None:
            event["cname"] = "terrible"
            event["args"] = {"op": span.op_index, "conflict": conflict}
        events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_trace(path: Path, execution: Execution, race: Race | None, title: str) -> Path:
    path.write_text(json.dumps(chrome_trace(execution, race, title)) + "\n")
    return path


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def draw(ax, execution: Execution, race: Race | None = None, read_spins: dict[int, float] | None = None) -> None:
    """Draw `execution`'s timeline on a matplotlib axis: a row per track, the race's accesses in red.

    `read_spins` (op index -> us) hatches the spinning head of those readers' spans; dotted lines mark
    when the two conflicting accesses took effect (each at its kernel's end).
    """
    spans = execution.timeline
    tracks = _tracks(spans)
    conflict_rows = [len(tracks) - 1 - tracks.index(s.track) for s in spans if _conflict(s, race)]
    for span in spans:
        y = len(tracks) - 1 - tracks.index(span.track)
        width = max(span.end_us - span.start_us, 0.5)
        conflict = _conflict(span, race)
        colour = _CONFLICT_COLOUR if conflict else _KIND_COLOURS.get(span.kind, "#8172B2")
        ax.broken_barh(
            [(span.start_us, width)],
            (y - 0.35, 0.7),
            facecolors=colour,
            edgecolors="black",
            linewidth=0.3,
            hatch="//" if span.kind == "spin" else None,
        )
        spin = (read_spins or {}).get(span.op_index) if span.kind == "kernel" else None
        if spin:
            ax.broken_barh(
                [(span.start_us, spin)], (y - 0.35, 0.7), facecolors="none", edgecolors="white", linewidth=0, hatch="xx"
            )
        label = f"#{span.op_index} {span.label}"
        if conflict:
            # Labels go on the outer side of the two conflicting tracks, so they never collide.
            above = y >= max(conflict_rows) if conflict_rows else True
            ax.text(
                span.end_us,
                y + (0.42 if above else -0.42),
                label,
                ha="center",
                va="bottom" if above else "top",
                fontsize=8,
                color=_CONFLICT_COLOUR,
                fontweight="bold",
            )
            ax.axvline(span.end_us, color=_CONFLICT_COLOUR, linestyle=":", linewidth=1)
        elif span.kind == "kernel" and width > 0.12 * execution.host_end_us:
            ax.text(span.start_us + width / 2, y, label, ha="center", va="center", fontsize=7, color="white")
        elif span.kind == "gate":
            ax.text(span.start_us, y - 0.42, span.label, ha="left", va="top", fontsize=7, color=_KIND_COLOURS["gate"])
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(list(reversed(tracks)))
    ax.set_xlabel("time (us)")
    ax.set_xlim(0, max(execution.host_end_us, 1.0) * 1.02)


def legend_handles() -> list:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=k.replace("_", " ")) for k, c in _KIND_COLOURS.items()]
    handles.append(Patch(facecolor="#4C72B0", edgecolor="white", hatch="xx", label="read spin"))
    handles.append(Patch(facecolor=_CONFLICT_COLOUR, label="conflicting accesses"))
    return handles


def write_png(
    path: Path, execution: Execution, race: Race | None, title: str, read_spins: dict[int, float] | None = None
) -> Path | None:
    """Render the timeline to a PNG; None (and no file) when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return None
    tracks = _tracks(execution.timeline)
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(tracks) + 1.6))
    draw(ax, execution, race, read_spins)
    ax.set_title(title, fontsize=9)
    handles = legend_handles()
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(handles), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
