"""The engines' stubs: what a host has installed does not change what the harness imports.

The H200 host has a transformers whose import fails (`audio_utils` imports `soxr`, absent there): both
engines' harnesses failed on it while the CPU CI, which installs no transformers, passed. These tests install
a transformers like that host's and check that each engine's `stubs.install(force=())` (the GPU path's call)
still answers `import transformers` with a stub. Each runs in a subprocess: `install` changes the import
system of its process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_hosts_broken_transformers_is_stubbed_on_the_gpu_path_too(engine: str, tmp_path) -> None:
    broken = tmp_path / "transformers"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'soxr'\")\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from racefuzz.engines.{engine} import stubs
        stubbed = stubs.install(force=())
        import transformers
        print("stubbed" if "transformers" in stubbed else "real", type(transformers).__name__)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0] == "stubbed", done.stdout


def test_light_packages_a_bare_host_lacks_are_stubbed_where_absent() -> None:
    """IPython (imported at module level by sglang's scheduler) was missing on the H200 host."""
    from racefuzz.engines.sglang.stubs import STUBBED

    assert {"IPython", "PIL", "requests", "yaml", "tqdm"} <= set(STUBBED)
