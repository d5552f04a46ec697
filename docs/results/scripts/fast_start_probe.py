"""How long `racefuzz run` takes to print its header, and whether it imported torch (issue 15's "fast start").

Run from the repository root: `python docs/results/scripts/fast_start_probe.py [N]`. With CUDA_VISIBLE_DEVICES=""
the CUDA driver reports no GPU, as on a CPU machine. Output: raw lines, one per run."""

import os
import subprocess
import sys
import time

ENTRY = "import sys\nfrom racefuzz.cli import main\nsys.exit(main())\n"
WATCH = (
    "import sys, atexit\n"
    "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules, file=sys.stderr))\n" + ENTRY
)

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
print("CUDA_VISIBLE_DEVICES =", repr(os.environ.get("CUDA_VISIBLE_DEVICES")), flush=True)
for _ in range(runs):
    start = time.monotonic()
    argv = [sys.executable, "-c", WATCH, "run", "--examples", "300", "--database", "none", "--report-dir", "/tmp/fs"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    header = process.stdout.readline()
    to_header = time.monotonic() - start
    out, err = process.communicate()
    total = time.monotonic() - start
    typo_start = time.monotonic()
    typo_argv = [sys.executable, "-c", ENTRY, "run", "--design", "global-wra"]
    typo = subprocess.run(typo_argv, capture_output=True, text=True)
    to_typo = time.monotonic() - typo_start
    print(
        f"header after {to_header:.3f} s ({header.strip()[:70]}); exit {process.returncode} after {total:.2f} s; "
        f"{err.strip().splitlines()[-1]}; typo: exit {typo.returncode} after {to_typo:.3f} s",
        flush=True,
    )
