"""Packaging: the wheel ships the CUDA sources, found through importlib.resources after a non-editable
install; torch is optional (the `cuda12`/`cuda13` extras), and nothing on the CPU path imports it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _requirement_names(requirements: list[str]) -> list[str]:
    return [re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower() for requirement in requirements]


def test_torch_is_an_extra_not_a_core_dependency() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs tomllib (Python >= 3.11)")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(_requirement_names(project["dependencies"])) == ["hypothesis", "numpy", "tqdm"]
    extras = {name: _requirement_names(reqs) for name, reqs in project["optional-dependencies"].items()}
    assert sorted(extras["cuda12"]) == ["cupy-cuda12x", "torch"]
    assert sorted(extras["cuda13"]) == ["cupy-cuda13x", "torch"]
    assert "torch" not in extras["test"]


def test_the_cpu_path_runs_without_torch(tmp_path: Path) -> None:
    # Where torch is installed (CI installs the CPU build), hide it: a None entry in sys.modules makes
    # `import torch` fail as if it were not installed, and any import of it on the CPU path an error.
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = sys.modules["cupy"] = None
        import racefuzz.pytest_plugin, racefuzz.testing
        from racefuzz.backends import resolve_backend
        from racefuzz.cli import main
        assert resolve_backend("auto") == "sim"
        argv = ["run", "--examples", "200", "--quiet", "--report-dir", {str(tmp_path)!r}]
        for backend in ("sim", "auto"):
            code = main([*argv, "--backend", backend, "--design", "war-after-launch"])
            assert code == 0, code
        assert main([*argv, "--backend", "sim", "--design", "none", "--no-control"]) == 1
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (the test extra installs it)")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("racefuzz-*.whl")
    return built


def test_wheel_contains_the_kernels(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "racefuzz/kernels/req_to_token.cu" in names
    assert not any(name.startswith("tests/") or name.startswith("properties/") for name in names)


def test_wheel_ships_no_benchmark_code(wheel: Path) -> None:
    """The benchmarks, the GPU proof and their runner live in ci/bench/ (run from a checkout): the wheel has
    the package and its kernels only, and none of its modules names the benchmarks."""
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert not [name for name in names if name.startswith(("racefuzz/bench/", "ci/"))]
    assert all(name.startswith(("racefuzz/", "racefuzz-")) for name in names), names
    assert "racefuzz/selfcheck.py" in names and "racefuzz/cli.py" in names  # the product's own check stays
    assert not [name for name in names if Path(name).stem in ("proof", "sglang_overlap") or "bench" in name]
    sources = {name: archive.read(name).decode() for name in names if name.endswith(".py")}
    imports_ci = re.compile(r"^\s*(from|import)\s+ci\b", re.MULTILINE)
    assert not [name for name, text in sources.items() if "racefuzz.bench" in text or imports_ci.search(text)]


def test_installed_wheel_finds_kernels_through_importlib_resources(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    probe = (
        "import racefuzz, racefuzz.kernel_sources as k, sys;"
        "print(racefuzz.__file__); print(k.kernel_dir()); print(len(k.kernel_source()));"
        "print('torch' in sys.modules, 'cupy' in sys.modules)"
    )
    # Run from an empty folder with only the installed copy on the path, so the checkout cannot be found.
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
    )
    module_file, kernels, size, imported = result.stdout.splitlines()
    assert module_file.startswith(str(site))
    assert kernels == str(site / "racefuzz" / "kernels")
    assert int(size) > 1000
    assert imported == "False False", "import racefuzz must import neither torch nor cupy"
