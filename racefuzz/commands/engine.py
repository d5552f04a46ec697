"""What `racefuzz sglang` and `racefuzz vllm` share, one mechanism each: the `fetch` and `pack` actions
(over `racefuzz.engines.sources`), the versions and checkout a run is on, a version's verdict and the run's
exit code (and the exceptions of the engines' `assert_*_race_free`), the report's race and control lines,
the replay file of a racy workload, and the drawing of distinct workloads (`draw_distinct`). The harness
subprocess itself is `racefuzz.engines.harness_process`. Each command keeps its own options, workloads and
report; what differs here is a parameter (the engine's name, how a run says it is the control, the replay
file's fields).

Not a subcommand: `commands.SUBCOMMANDS` names `sglang` and `vllm`, which call this.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode

if TYPE_CHECKING:
    from racefuzz.engines.sources import EngineSources

Target = tuple[str, Path, str | None]
"""What one harness process runs on: its label (`source DIR` or the version), the directory holding the
engine's package, the version to report (a checkout's from `--<engine>-version`, if given)."""

Run = dict[str, Any]
"""One run of a harness result's `runs`: its `races` and whether it is the negative control."""


def draw_distinct(strategy: Any, count: int, seed: int) -> list[Any]:
    """`count` distinct examples of the Hypothesis `strategy` (hashable), reproducibly from `seed`, in the
    order drawn; fewer only if twice as many draws did not find that many. Generation only: no database, no
    shrinking, and it stops once `count` are in."""
    import contextlib

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn: list[Any] = []
    seen: set[Any] = set()

    class Enough(Exception):
        """Raised once `count` distinct examples are in: generation stops."""

    @hypothesis_seed(seed)
    @settings(
        max_examples=2 * count + 10,  # Hypothesis draws duplicates: 2000 draws held 1991 distinct sglang workloads
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate,),
    )
    @given(strategy)
    def collect(example: Any) -> None:
        if len(drawn) >= count:
            raise Enough
        if example not in seen:  # a set: a list's `in` made 10,000 draws take minutes
            seen.add(example)
            drawn.append(example)

    with contextlib.suppress(Enough):
        collect()
    return drawn[:count]


def fetch_action(args: argparse.Namespace, engine: EngineSources) -> ExitCode:
    """`racefuzz <engine> fetch --version X...` (pip) or `--version X --archive FILE` (a `pack` archive):
    one line per version naming where its sources are."""
    name = engine.package
    if not args.versions:
        raise InvalidArgument(f"racefuzz {name} fetch needs --version X (repeatable)")
    if args.archive is not None and len(args.versions) != 1:
        raise InvalidArgument("fetch --archive needs exactly one --version (the archive's)")
    if args.archive is not None and not args.archive.is_file():
        raise InvalidArgument(f"fetch --archive: no file {args.archive}")
    for version in args.versions:
        path = engine.unpack(args.archive, version) if args.archive is not None else engine.fetch(version)
        print(f"{name} {version}: {path}")
    return ExitCode.CLEAN


PackFunction = Callable[[str | None, Path, Path | None], tuple[Path, int, int]]
"""An engine's `sources.pack(version, out, source)`: the archive, its file count and their bytes."""


def pack_action(args: argparse.Namespace, engine: EngineSources, pack: PackFunction) -> ExitCode:
    """`racefuzz <engine> pack (--version X | --source DIR) --out FILE.tar.gz` through the engine's `pack`
    (what a slim archive holds is the engine's): one line, the files and sizes."""
    if args.out is None or (len(args.versions) != 1) == (args.source is None):
        raise InvalidArgument(
            f"racefuzz {engine.package} pack needs one --version X or --source DIR, and --out FILE.tar.gz"
        )
    out, count, size = pack(args.versions[0] if args.versions else None, args.out, args.source)
    print(f"{out}: {count} files, {size / 1e6:.1f} MB of .py, {out.stat().st_size / 1e6:.1f} MB archived")
    return ExitCode.CLEAN


def targets(args: argparse.Namespace, locate: Callable[..., Path], source_version: str | None) -> list[Target]:
    """`--source` (labelled `source DIR`, reported as `source_version`) first, then each `--version`, each
    located by the engine's `sources.locate` (missing sources: one line, before anything runs)."""
    found: list[Target] = []
    if args.source is not None:
        found.append((f"source {args.source}", locate(source=args.source), source_version))
    for version in args.versions:
        found.append((version, locate(version=version), version))
    return found


def version_verdict(
    result: dict[str, Any], control: bool, is_control: Callable[[Run], bool], manifested: bool = False
) -> ExitCode:
    """One version's exit code: 2 the harness cannot drive it (`unsupported`), 5 the harness failed, 1 a race
    in a run that is not the control (or a confirmed wrong read: `manifested`), 3 none and, with `control`,
    no control run caught, else 0."""
    if result.get("status") == "unsupported":
        return ExitCode.USAGE
    if result.get("status") != "ok":
        return ExitCode.INTERNAL
    runs = result["runs"]
    if any(run["races"] for run in runs if not is_control(run)) or manifested:
        return ExitCode.RACE
    if control and not any(run["races"] for run in runs if is_control(run)):
        return ExitCode.INCONCLUSIVE
    return ExitCode.CLEAN


EXIT_PRECEDENCE = (ExitCode.USAGE, ExitCode.INTERNAL, ExitCode.RACE, ExitCode.INCONCLUSIVE)
"""Which version's code is the run's: the first of these any version has, else 0."""


def overall_exit(codes: Iterable[ExitCode]) -> ExitCode:
    """The run's exit code from its versions' (`EXIT_PRECEDENCE`)."""
    found = set(codes)
    return next((code for code in EXIT_PRECEDENCE if code in found), ExitCode.CLEAN)


def raise_for_verdict(verdict: ExitCode, text: str) -> None:
    """An engine's `assert_*_race_free`: `RaceFound` / `Inconclusive` / `RuntimeError` (with the command's
    report `text`) where the command would exit 1 / 3 / anything but 0."""
    from racefuzz.errors import Inconclusive, RaceFound

    if verdict == ExitCode.RACE:
        raise RaceFound(text)
    if verdict == ExitCode.INCONCLUSIVE:
        raise Inconclusive(text)
    if verdict != ExitCode.CLEAN:
        raise RuntimeError(text)


def write_results(results: list[dict[str, Any]], path: Path | None) -> None:
    """`--json FILE`: every version's result."""
    if path is not None:
        path.write_text(json.dumps(results, indent=1) + "\n")


def race_lines(race: dict[str, Any], byte_names: int, called_from: int = 0) -> list[str]:
    """A race in the commands' report: its kind, its first `byte_names` bytes and the missing edge, then each
    access's kernel, stream and source line (and up to `called_from` of its callers)."""
    lines = [f"  {race['kind']} on {', '.join(race['bytes'][:byte_names])}: {race['missing_edge']}"]
    for end in ("first", "second"):
        access = race[end]
        lines.append(f"    {end:6}: {access['kernel']} on {access['stream']}  {access['source']}")
        lines += [f"            called from {chain}" for chain in access.get("called_from", [])[:called_from]]
    return lines


def control_line(condition: str, controls: list[Run]) -> str:
    """The negative control's line: run under `condition` (what the control switches off), caught or not."""
    caught = sum(1 for run in controls if run["races"])
    total = sum(len(run["races"]) for run in controls)
    verdict = "caught" if caught else "NOT caught (inconclusive)"
    return f"  control ({condition}): {verdict}: {total} race(s) in {caught} of {len(controls)} workload(s)"


def replay_document(kind: str, head: dict[str, Any], workload: dict[str, Any], tail: dict[str, Any]) -> dict[str, Any]:
    """A replay file of an engine's racy workload: the project's replay format (`racefuzz.report.FORMAT`, its
    `kind` the engine's) around the workload's own JSON, so that `--workload FILE` reads it as the workload it
    is (`Workload.from_json` reads its fields and ignores the others): `head` (the version...) before the
    workload's fields, `tail` (the race...) after."""
    from racefuzz.report import FORMAT, FORMAT_VERSION

    return {"format": FORMAT, "version": FORMAT_VERSION, "kind": kind, **head, **workload, **tail}


def write_replay(report_dir: Path, name: str, data: dict[str, Any]) -> Path:
    """`data` as `report_dir/name` (the directory made if need be)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / name
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
