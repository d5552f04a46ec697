"""The repository's CI: the jobs (`cpu.sh`, `gpu.sh`) and the benchmarks (`ci.bench`), run from the root."""
