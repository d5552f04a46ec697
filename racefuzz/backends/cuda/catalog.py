"""The kernel catalogue: the `__global__` kernels of `kernels/req_to_token.cu`, told apart by signature.

A launch's stores go through the kernel named `launch.kernel` when the source defines a *writer* of that
name, else `rf_write_cells`; its loads through a *reader* of that name, else `rf_read_cells`. Writers and
readers are told apart by their parameter lists, so a reader's name on a writing launch can never bind
the wrong argument list. Pure: no torch, no CuPy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from racefuzz.errors import BackendUnavailable
from racefuzz.kernel_sources import kernel_source

KERNEL_FILE = "req_to_token.cu"
WRITE_FALLBACK = "rf_write_cells"
READ_FALLBACK = "rf_read_cells"
SPIN_KERNEL = "rf_spin"
GATE_SIGNAL = "rf_gate_signal"
GATE_WAIT = "rf_gate_wait"
"""The two kernels of a forced order's gate (see `kernels/req_to_token.cu`)."""

_WRITER_PARAMS = ("int*", "int", "const int*", "const int*")  # table, ld, rects, values
_READER_PARAMS = ("const int*", "int", "const int*", "int*", "long long")  # table, ld, rects, observed, spin
_SIGNAL_PARAMS = ("int*",)  # flag
_WAIT_PARAMS = ("int*", "int*", "long long")  # flag, timed_out, timeout_ns
_GLOBAL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')


@dataclass(frozen=True)
class KernelCatalog:
    """The `__global__` kernels of the source, by role, as told by their parameter lists.

    Writers take `(int* table, int ld, const int* rects, const int* values)`; readers take
    `(const int* table, int ld, const int* rects, int* observed, long long spin_ns)`.
    """

    writers: frozenset[str]
    readers: frozenset[str]
    spin: str = SPIN_KERNEL
    gate_signal: str = GATE_SIGNAL
    gate_wait: str = GATE_WAIT

    def writer_for(self, kernel: str) -> str:
        return kernel if kernel in self.writers else WRITE_FALLBACK

    def reader_for(self, kernel: str) -> str:
        return kernel if kernel in self.readers else READ_FALLBACK

    @property
    def names(self) -> tuple[str, ...]:
        return (self.spin, self.gate_signal, self.gate_wait, *sorted(self.writers), *sorted(self.readers))


def _param_type(param: str) -> str:
    """`const int *rects` -> `const int*`: the declared type with the parameter name dropped."""
    words = " ".join(param.split())
    match = re.fullmatch(r"(.*?)\s*\b\w+", words)
    declared = match.group(1) if match else words
    return re.sub(r"\s*\*", "*", declared).strip()


def kernel_catalog(source: str) -> KernelCatalog:
    """Classify the `extern "C" __global__` kernels of `source`; `BackendUnavailable` if a fallback is missing."""
    writers: set[str] = set()
    readers: set[str] = set()
    spins: set[str] = set()
    signals: set[str] = set()
    waits: set[str] = set()
    for name, params in _GLOBAL_RE.findall(source):
        types = tuple(_param_type(p) for p in params.split(",") if p.strip())
        if types == _WRITER_PARAMS:
            writers.add(name)
        elif types == _READER_PARAMS:
            readers.add(name)
        elif types == ("long long",):
            spins.add(name)
        elif types == _SIGNAL_PARAMS:
            signals.add(name)
        elif types == _WAIT_PARAMS:
            waits.add(name)
    required = (
        (WRITE_FALLBACK, writers),
        (READ_FALLBACK, readers),
        (SPIN_KERNEL, spins),
        (GATE_SIGNAL, signals),
        (GATE_WAIT, waits),
    )
    missing = [n for n, found in required if n not in found]
    if missing:
        raise BackendUnavailable(f"{KERNEL_FILE} lacks the kernel(s) {', '.join(missing)} with the expected signature")
    return KernelCatalog(frozenset(writers), frozenset(readers))


def read_kernels() -> tuple[str, KernelCatalog]:
    """The source of `KERNEL_FILE` (through `racefuzz.kernel_sources`) and its catalogue."""
    source = kernel_source(KERNEL_FILE)
    return source, kernel_catalog(source)
