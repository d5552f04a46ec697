"""The wheel ships the CUDA sources, found through importlib.resources after a non-editable install."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
