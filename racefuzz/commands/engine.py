"""What `racefuzz sglang` and `racefuzz vllm` share, one mechanism each: the `fetch` and `pack` actions
(over `racefuzz.engines.sources`), the harness subprocess and its JSON result, a version's verdict and the
run's exit code, and the replay file of a racy workload. Each command keeps its own options, workloads
and report text; what differs here is a parameter (the engine's name, its harness module, how a run says
it is the control).

Not a subcommand: `commands.SUBCOMMANDS` names `sglang` and `vllm`, which call this.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode

if TYPE_CHECKING:
    from racefuzz.engines.sources import EngineSources


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
