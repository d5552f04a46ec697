"""An engine harness's subprocess and its result, one mechanism for every engine: the harness (or search)
module run with `--python-dir DIR` and its options, its result the last JSON line it prints.

A version runs in its own process because engines' modules clash across versions and a recording patches
torch for the process's life. The result's `status` is `ok`, `error` (the harness failed: exit 5) or
`unsupported` (the version lacks what the harness or the asked workload needs, `Unsupported`: exit 2).
Nothing here imports an engine or torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


class Unsupported(RuntimeError):
    """This engine version lacks something the harness or the asked workload needs (the message names it,
    in one line): the harness reports the status `unsupported`, a usage error, not a failure of its own."""


def run_json_process(
    module: str,
    python_dir: Path,
    options: list[str],
    *,
    timeout: float,
    env: dict[str, str],
    stdin: str | None = None,
    what: str = "the harness",
) -> dict[str, Any]:
    """`python -m module --python-dir python_dir *options` (with `stdin` on its standard input) -> the last
    line of its output that starts with `{`, as JSON. A process past `timeout` seconds, or one that prints
    no such line, is `{"status": "error", "error": <one line naming `what` and why>, "python_dir": ...}`."""
    command = [sys.executable, "-m", module, "--python-dir", str(python_dir), *options]
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"{what} ran past {timeout:.0f} s", "python_dir": str(python_dir)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "error", "error": f"{what} exited {done.returncode}: {tail}", "python_dir": str(python_dir)}
    return json.loads(lines[-1])
