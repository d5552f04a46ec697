"""racefuzz's pytest plugin: options, the `cuda` marker, fixtures, Hypothesis profiles, xdist GPU pinning.

Registered through the `pytest11` entry point, so it is loaded by every pytest session of an environment
where racefuzz is installed, and it is polite: a session that uses none of racefuzz's options, fixtures or
markers sees nothing of it but the option group and the `cuda` marker's description. It imports only pytest
and the standard library at load time (`racefuzz/__init__` is lazy), and until the session is found to use
racefuzz it imports neither Hypothesis nor numpy nor torch, runs no `nvidia-smi` and leaves
`CUDA_VISIBLE_DEVICES` alone.

A session uses racefuzz when one of the `--racefuzz-*` options (or `racefuzz_*` ini values) is given, when
the Hypothesis profile asked for is one of racefuzz's (`--hypothesis-profile racefuzz-*`), or when a
collected test uses a racefuzz fixture (`racefuzz_config`, `racefuzz_backend`) or has the `cuda` marker.
The first two are known at `pytest_configure`, the others at the end of collection, which is before any
test runs; racefuzz then validates its settings, registers its Hypothesis profiles and, on an xdist worker,
pins the worker to a GPU (which must happen before the worker initializes CUDA).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
EXAMPLE_TIMEOUT_OPTION = "--racefuzz-example-timeout"
_ALL_OPTIONS = (BACKEND_OPTION, EXAMPLES_OPTION, SEED_OPTION, REPORT_DIR_OPTION, EXAMPLE_TIMEOUT_OPTION)
_INI_NAMES = ("racefuzz_backend", "racefuzz_report_dir")
DEFAULT_BACKEND = "auto"
DEFAULT_REPORT_DIR = ".racefuzz"
DEFAULT_EXAMPLE_TIMEOUT_S = 120.0
"""As the CLI's `--example-timeout` (`racefuzz.commands.argtypes.DEFAULT_EXAMPLE_TIMEOUT_S`, checked equal by
tests/plugin: not imported here at load time)."""
PROFILES = {"racefuzz-dev": 100, "racefuzz-ci": 1000, "racefuzz-thorough": 10_000}
"""Hypothesis profiles racefuzz registers, by max examples; select one with `--hypothesis-profile`. They are
prefixed because Hypothesis ships a `ci` profile of its own (and projects often have `dev`)."""
DERANDOMIZED_PROFILES = frozenset({"racefuzz-ci"})
"""The profiles whose examples are derandomized: the same on every run, so CI is reproducible."""
FIXTURES = frozenset({"racefuzz_config", "racefuzz_backend", "racefuzz_trace"})
"""racefuzz's fixtures: a collected test that uses one (directly or through another fixture) makes the
session use racefuzz."""
CUDA_MARKER = "cuda"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("racefuzz", "CUDA stream-race fuzzing (racefuzz)")
    # The backend names are racefuzz.backends.BACKENDS; that package imports numpy, so it is imported only when
    # a value is validated (tests/plugin checks that this help names every one of them).
    group.addoption(
        BACKEND_OPTION,
        dest="racefuzz_backend",
        default=None,
        metavar="BACKEND",
        help="backend for racefuzz fixtures: auto, sim or cuda; default auto: the GPU when usable, else the simulator",
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
    group.addoption(
        EXAMPLE_TIMEOUT_OPTION,
        dest="racefuzz_example_timeout",
        default=None,
        metavar="SECONDS",
        help="fail a racefuzz test whose example (a design hook, a traced step's run) takes longer; a hook that "
        "never returns ends the session with exit code 6; default 120",
    )
    # No ini defaults: an empty value means "not set", and a set one makes the session use racefuzz.
    parser.addini("racefuzz_backend", f"default for {BACKEND_OPTION} ({DEFAULT_BACKEND} when unset)")
    parser.addini("racefuzz_report_dir", f"default for {REPORT_DIR_OPTION} ({DEFAULT_REPORT_DIR} when unset)")


def parse_backend(text: str) -> str:
    from racefuzz.backends import BACKENDS  # one definition; imports numpy, neither torch nor Hypothesis

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


def _in_range(option: str, text: str, name: str) -> object:
    """`text` through the CLI's own ranged argparse type `racefuzz.commands.argtypes.<name>`: the plugin
    accepts exactly what `racefuzz run` accepts (a seed of 2**32 would write a replay file `racefuzz replay`
    refuses)."""
    import argparse

    from racefuzz.commands import argtypes

    try:
        return getattr(argtypes, name)(text)
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(f"{option}: {exc}") from None


def parse_examples(text: str) -> int:
    _parse_int(EXAMPLES_OPTION, text, 1)
    return _in_range(EXAMPLES_OPTION, text, "examples")  # type: ignore[return-value]


def parse_seed(text: str) -> int:
    _parse_int(SEED_OPTION, text, 0)
    return _in_range(SEED_OPTION, text, "seed")  # type: ignore[return-value]


def parse_example_timeout(text: str) -> float:
    return _in_range(EXAMPLE_TIMEOUT_OPTION, text, "timeout")  # type: ignore[return-value]


# -------------------------------------------------------------------------------------------------------
# initialization
# -------------------------------------------------------------------------------------------------------

_SETTINGS = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Hypothesis' plugin loads `--hypothesis-profile` in its pytest_configure, which pytest may call
    # before ours: register racefuzz's profiles earlier, and only when one of them is asked for.
    if _asks_for_a_racefuzz_profile(config):
        _register_hypothesis_profiles()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{CUDA_MARKER}: needs an NVIDIA GPU with torch CUDA and CuPy; skipped with the reason otherwise"
    )
    if _options_given(config) or _asks_for_a_racefuzz_profile(config):
        # Validate now, so a bad value is one usage error before anything is collected.
        _activate(config)


def _options_given(config: pytest.Config) -> bool:
    """Whether the command line or the ini file sets any racefuzz option."""
    given = any(config.getoption(_dest(option)) is not None for option in _ALL_OPTIONS)
    return given or any(config.getini(name) for name in _INI_NAMES)


def _asks_for_a_racefuzz_profile(config: pytest.Config) -> bool:
    return config.getoption("hypothesis_profile", None) in PROFILES


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def _uses_racefuzz(item: pytest.Item) -> bool:
    """Whether a collected test uses a racefuzz fixture (directly or through others) or the `cuda` marker."""
    if item.get_closest_marker(CUDA_MARKER) is not None:
        return True
    return not FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def _activate(config: pytest.Config) -> dict:
    """The session uses racefuzz: validate its settings, pin an xdist worker to a GPU, register the Hypothesis
    profiles. Once per session; returns the settings."""
    if _SETTINGS in config.stash:
        return config.stash[_SETTINGS]
    backend = config.getoption("racefuzz_backend") or config.getini("racefuzz_backend") or DEFAULT_BACKEND
    examples = config.getoption("racefuzz_examples")
    seed = config.getoption("racefuzz_seed")
    timeout = config.getoption("racefuzz_example_timeout")
    report_dir = config.getoption("racefuzz_report_dir") or config.getini("racefuzz_report_dir") or DEFAULT_REPORT_DIR
    settings = {
        "backend": parse_backend(backend),
        "examples": None if examples is None else parse_examples(examples),
        "seed": 0 if seed is None else parse_seed(seed),
        "example_timeout": DEFAULT_EXAMPLE_TIMEOUT_S if timeout is None else parse_example_timeout(timeout),
        "report_dir": Path(report_dir),
    }
    _check_report_dir(settings["report_dir"])
    settings["gpu"] = _pin_xdist_worker_to_gpu()
    config.stash[_SETTINGS] = settings
    _register_hypothesis_profiles()
    if settings["backend"] == "cuda":
        # Asked for explicitly: say at once, in one line, when it cannot work here.
        from racefuzz.backends import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason is not None:
            raise pytest.UsageError(f"{BACKEND_OPTION} cuda: {reason}")
    return settings


def _check_report_dir(path: Path) -> None:
    """A usage error now, before any test runs, unless failures can be written to `path`."""
    from racefuzz.errors import InvalidArgument
    from racefuzz.outputs import check_output_dir

    try:
        check_output_dir(path, REPORT_DIR_OPTION)
    except InvalidArgument as exc:
        raise pytest.UsageError(str(exc)) from None


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
            derandomize=name in DERANDOMIZED_PROFILES,
        )


def pytest_report_header(config: pytest.Config) -> str | None:
    if not any(config.getoption(_dest(option)) for option in _ALL_OPTIONS):
        return None
    s = config.stash[_SETTINGS]
    return (
        f"racefuzz: backend {s['backend']}, examples {s['examples'] or 'from the Hypothesis profile'}, "
        f"seed {s['seed']}, report dir {s['report_dir']}, CUDA_VISIBLE_DEVICES {s['gpu']}"
    )


@pytest.hookimpl(trylast=True)  # after conftests added markers and `-m`/`-k` deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _SETTINGS not in config.stash and any(_uses_racefuzz(item) for item in items):
        _activate(config)  # before any test runs, and so before any initializes CUDA
    cuda_items = [item for item in items if item.get_closest_marker(CUDA_MARKER) is not None]
    if not cuda_items:
        return
    from racefuzz.backends import cuda_unavailable_reason

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

    s = _activate(pytestconfig)  # normally done at collection; here too for `request.getfixturevalue`
    examples = s["examples"] or settings().max_examples
    # Failures are kept in the active Hypothesis profile's example database and tried first next time: a
    # fleet shares them by registering a profile whose `database` is shared (Redis, GitHub artifacts).
    return Config(
        backend=s["backend"],
        examples=examples,
        seed=s["seed"],
        report_dir=s["report_dir"],
        database=settings().database,
        example_timeout=s["example_timeout"],
        on_abandon=_terminal_line(pytestconfig),
    )


@pytest.fixture(scope="session")
def racefuzz_backend(racefuzz_config) -> str:
    """The resolved backend, `sim` or `cuda` (`--racefuzz-backend cuda` without a GPU is a usage error)."""
    from racefuzz.errors import RacefuzzError

    try:
        return racefuzz_config.resolved_backend
    except RacefuzzError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture
def racefuzz_trace(racefuzz_config):
    """`racefuzz_trace.fuzz(step, watch=[...])`: fuzz a step of real torch/Triton code, fail on a race
    (`racefuzz.trace.fixture`)."""
    from racefuzz.trace.fixture import TraceFixture

    c = racefuzz_config
    return TraceFixture(
        c.backend, c.examples, c.seed, c.report_dir, example_timeout=c.example_timeout, on_abandon=c.on_abandon
    )


def _terminal_line(config: pytest.Config):
    """A callback writing one line to pytest's terminal: the watchdog's last words before a hung example ends
    the session (exit code 6), which pytest's capture of stderr would otherwise take with it."""

    def line(message: str) -> None:
        capture = config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:  # mid-test, pytest holds the terminal's file descriptors
            capture.suspend_global_capture(in_=True)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(message)
            reporter.flush()  # the process ends right after (os._exit): nothing else flushes it

    return line


# -------------------------------------------------------------------------------------------------------
# failures
# -------------------------------------------------------------------------------------------------------

FAILURE_KINDS = {
    "RaceFound": "race found",
    "Inconclusive": "inconclusive",
    "UserCodeError": "error in user code",
    "InvalidArgument": "usage error",
    "ReplayError": "usage error",
    "BackendUnavailable": "usage error",
    "InvalidProgram": "error in user code",
    "ExampleTimeout": "timeout",
}
"""The kind a racefuzz failure is shown as, by exception class: the CLI's exit codes' (`racefuzz.exitcodes`)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """A test failed by racefuzz shows one line, `racefuzz: <kind>: <message>` (the report of a race follows
    on the next lines), instead of a traceback through racefuzz; `-vv` keeps pytest's own report."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if call.excinfo is None or not report.failed or item.config.get_verbosity() >= 2:
        return
    module = type(call.excinfo.value).__module__ or ""
    # By the nearest class in the table: a subclass (the trace fixture's RaceInTrace is a RaceFound) counts too.
    classes = type(call.excinfo.value).__mro__
    kind = next((FAILURE_KINDS[c.__name__] for c in classes if c.__name__ in FAILURE_KINDS), None)
    if kind is None or not module.startswith("racefuzz"):
        return
    message = str(call.excinfo.value).split("\nFalsifying example", 1)[0]
    message = message.removeprefix("racefuzz: ").removeprefix("INCONCLUSIVE: ")
    report.longrepr = f"racefuzz: {kind}: {message}"


# -------------------------------------------------------------------------------------------------------
# diagnostics
# -------------------------------------------------------------------------------------------------------


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With RACEFUZZ_WORKER_LOG=FILE, every test process appends which GPU it ran on (its xdist worker id,
    CUDA_VISIBLE_DEVICES, device 0's name and UUID) -- evidence of the GPU pinning.

    The device is asked of torch only when the session already imported torch (its tests used the CUDA
    backend): this diagnostic never imports torch, nor initializes CUDA in a process that did not.
    """
    log = os.environ.get("RACEFUZZ_WORKER_LOG")
    if not log:
        return
    device = "unknown (torch not used in this process)"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(0)
                device = f"{props.name} {getattr(props, 'uuid', '')}"
            else:
                device = "no CUDA device"
        except Exception as exc:  # a diagnostic must not fail the session
            device = f"unknown ({type(exc).__name__}: {exc})"
    with open(log, "a") as handle:
        handle.write(
            f"worker {os.environ.get('PYTEST_XDIST_WORKER', 'main')}: "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}, device 0 is {device}\n"
        )
