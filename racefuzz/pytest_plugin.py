"""racefuzz's pytest plugin: options, the `cuda` marker, fixtures, Hypothesis profiles, xdist GPU pinning.

Registered through the `pytest11` entry point. It imports only pytest at load time (`racefuzz/__init__`
is lazy); the rest of racefuzz (and with it numpy, Hypothesis strategies, and torch only for the CUDA
backend) is imported when a fixture or a `cuda`-marked test needs it, so installing racefuzz costs other
test suites nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# -------------------------------------------------------------------------------------------------------
# options
# -------------------------------------------------------------------------------------------------------
# Help texts: one line, lower case, say the default.

BACKEND_OPTION = "--racefuzz-backend"
EXAMPLES_OPTION = "--racefuzz-examples"
SEED_OPTION = "--racefuzz-seed"
REPORT_DIR_OPTION = "--racefuzz-report-dir"
_ALL_OPTIONS = (BACKEND_OPTION, EXAMPLES_OPTION, SEED_OPTION, REPORT_DIR_OPTION)
BACKENDS = ("auto", "sim", "cuda")
PROFILES = {"racefuzz-dev": 100, "racefuzz-ci": 1000, "racefuzz-thorough": 10_000}
"""Hypothesis profiles racefuzz registers, by max examples; select one with `--hypothesis-profile`. They are
prefixed because Hypothesis ships a `ci` profile of its own (and projects often have `dev`)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("racefuzz", "CUDA stream-race fuzzing (racefuzz)")
    group.addoption(
        BACKEND_OPTION,
        dest="racefuzz_backend",
        default=None,
        metavar="auto|sim|cuda",
        help="backend for racefuzz fixtures; default auto: the GPU when usable, else the simulator",
    )
    group.addoption(
        EXAMPLES_OPTION,
        dest="racefuzz_examples",
        default=None,
        metavar="N",
        help="examples per racefuzz search; default: the active Hypothesis profile's max_examples",
    )
    group.addoption(
        SEED_OPTION, dest="racefuzz_seed", default=None, metavar="S", help="seed of racefuzz searches; default 0"
    )
    group.addoption(
        REPORT_DIR_OPTION,
        dest="racefuzz_report_dir",
        default=None,
        metavar="DIR",
        help="where replay files, reports and timelines of failures go; default .racefuzz/",
    )
    parser.addini("racefuzz_backend", "default for --racefuzz-backend", default="auto")
    parser.addini("racefuzz_report_dir", "default for --racefuzz-report-dir", default=".racefuzz")


def parse_backend(text: str) -> str:
    if text not in BACKENDS:
        raise pytest.UsageError(f"{BACKEND_OPTION}: expected one of {', '.join(BACKENDS)}, got {text!r}")
    return text


def _parse_int(option: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise pytest.UsageError(f"{option}: expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise pytest.UsageError(f"{option}: expected an integer >= {minimum}, got {value}")
    return value


def parse_examples(text: str) -> int:
    return _parse_int(EXAMPLES_OPTION, text, 1)


def parse_seed(text: str) -> int:
    return _parse_int(SEED_OPTION, text, 0)


# -------------------------------------------------------------------------------------------------------
# initialization
# -------------------------------------------------------------------------------------------------------

_SETTINGS = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Hypothesis' plugin loads `--hypothesis-profile` in its pytest_configure, which pytest may call
    # before ours: register racefuzz's profiles earlier, and only when one of them is asked for.
    profile = config.getoption("hypothesis_profile", None)
    if profile in PROFILES:
        _register_hypothesis_profiles()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cuda: needs an NVIDIA GPU with torch CUDA and CuPy; skipped with the reason otherwise"
    )
    # Validate now, so a bad value is one usage error before anything is collected.
    backend = config.getoption("racefuzz_backend") or config.getini("racefuzz_backend")
    examples = config.getoption("racefuzz_examples")
    seed = config.getoption("racefuzz_seed")
    config.stash[_SETTINGS] = {
        "backend": parse_backend(backend),
        "examples": None if examples is None else parse_examples(examples),
        "seed": 0 if seed is None else parse_seed(seed),
        "report_dir": Path(config.getoption("racefuzz_report_dir") or config.getini("racefuzz_report_dir")),
        "gpu": _pin_xdist_worker_to_gpu(),
    }
    _register_hypothesis_profiles()
    if config.stash[_SETTINGS]["backend"] == "cuda":
        # Asked for explicitly: say at once, in one line, when it cannot work here.
        from racefuzz.backend import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason is not None:
            raise pytest.UsageError(f"{BACKEND_OPTION} cuda: {reason}")


def _gpu_count() -> int | None:
    """How many GPUs `nvidia-smi -L` lists (None without nvidia-smi), without initializing CUDA here."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in out.splitlines()) or None


def _pin_xdist_worker_to_gpu() -> str | None:
    """Under pytest-xdist, give worker gwN the GPU N mod (number of GPUs), unless CUDA_VISIBLE_DEVICES is set.

    It must happen before the worker initializes CUDA, hence here and through the environment. With one
    GPU every worker shares it: delays still order the streams within each worker's programs, but the
    workers' kernels interleave on the GPU, so measured timings (and `racefuzz bench`) are not meaningful
    under `-n`; race verdicts are, since each run's corruption check is self-contained.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or "CUDA_VISIBLE_DEVICES" in os.environ:
        return os.environ.get("CUDA_VISIBLE_DEVICES")
    count = _gpu_count()
    if not count:
        return None
    index = int(worker.removeprefix("gw") or 0) % count
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    return str(index)


def _register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.errors import InvalidArgument

    for name, examples in PROFILES.items():
        try:
            settings.get_profile(name)
            continue  # the project's own profile of that name wins
        except InvalidArgument:
            pass
        settings.register_profile(
            name,
            max_examples=examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            derandomize=name == "ci",
        )


def pytest_report_header(config: pytest.Config) -> str | None:
    if not any(config.getoption(opt.lstrip("-").replace("-", "_")) for opt in _ALL_OPTIONS):
        return None
    s = config.stash[_SETTINGS]
    return (
        f"racefuzz: backend {s['backend']}, examples {s['examples'] or 'from the Hypothesis profile'}, "
        f"seed {s['seed']}, report dir {s['report_dir']}, CUDA_VISIBLE_DEVICES {s['gpu']}"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda_items = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not cuda_items:
        return
    from racefuzz.backend import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
        for item in cuda_items:
            item.add_marker(skip)


# -------------------------------------------------------------------------------------------------------
# fixtures
# -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def racefuzz_config(pytestconfig: pytest.Config):
    """The racefuzz.testing.Config the command line asked for (backend, examples, seed, report dir)."""
    from hypothesis import settings

    from racefuzz.testing import Config

    s = pytestconfig.stash[_SETTINGS]
    examples = s["examples"] or settings().max_examples
    return Config(backend=s["backend"], examples=examples, seed=s["seed"], report_dir=s["report_dir"])


@pytest.fixture(scope="session")
def racefuzz_backend(racefuzz_config) -> str:
    """The resolved backend, `sim` or `cuda` (`--racefuzz-backend cuda` without a GPU is a usage error)."""
    from racefuzz.errors import RacefuzzError

    try:
        return racefuzz_config.resolved_backend
    except RacefuzzError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session", autouse=True)
def _racefuzz_worker_log() -> None:
    """Diagnostics: with RACEFUZZ_WORKER_LOG=FILE, every test process appends which GPU it runs on (its
    xdist worker id, CUDA_VISIBLE_DEVICES, device 0's name and UUID) -- evidence of the GPU pinning."""
    log = os.environ.get("RACEFUZZ_WORKER_LOG")
    if not log:
        return
    device = "no CUDA device"
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            device = f"{props.name} {getattr(props, 'uuid', '')}"
    except ImportError:
        pass
    with open(log, "a") as handle:
        handle.write(
            f"worker {os.environ.get('PYTEST_XDIST_WORKER', 'main')}: "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}, device 0 is {device}\n"
        )
