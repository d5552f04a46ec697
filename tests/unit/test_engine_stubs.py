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


def _alloc_reference(prefix: list[int], seq: list[int], last_loc: list[int], free_pages: list[int], page: int) -> list:
    """The paged allocator's extend, request by request as its Triton kernel's three parts say (0.5.15
    mem_cache/triton_ops/allocator.py `alloc_extend_kernel`): the rest of the last page, whole new pages,
    a partial page; new pages taken in request order."""
    out, next_page = [], 0
    for p, s, last in zip(prefix, seq, last_loc, strict=True):
        part1 = min(s, -(-p // page) * page) - p
        out += [last + 1 + j for j in range(part1)]
        for position in range(p + part1, s):
            if position % page == 0:
                next_page += 1
            out.append(free_pages[next_page - 1] * page + position % page)
    return out


@pytest.mark.parametrize(
    ("prefix", "seq", "last_loc"),
    [
        ([0, 0], [12, 20], [-1, -1]),  # fresh prompts: one page, then a page and a partial one
        ([5, 16, 0], [40, 17, 16], [84, 31, -1]),  # mid-page prefixes, a page-aligned one, an exact page
        ([3], [3], [50]),  # nothing to extend
    ],
)
def test_the_paged_allocators_kernels_cpu_equivalents_match_the_kernels_arithmetic(prefix, seq, last_loc) -> None:
    torch = pytest.importorskip("torch")
    from racefuzz.engines.sglang.stubs import CPU_EQUIVALENTS

    page, free_pages = 16, [7, 3, 9, 4, 11, 2]
    total = sum(s - p for p, s in zip(prefix, seq, strict=True))
    out = torch.full((total,), -9, dtype=torch.int64)
    CPU_EQUIVALENTS["alloc_extend_kernel"](
        pre_lens_ptr=torch.tensor(prefix),
        seq_lens_ptr=torch.tensor(seq),
        last_loc_ptr=torch.tensor(last_loc),
        free_page_ptr=torch.tensor(free_pages),
        out_indices=out,
        bs_upper=4,
        page_size=page,
    )
    assert out.tolist() == _alloc_reference(prefix, seq, last_loc, free_pages, page)
    # Decode: one token per request (new length seq + 1); a new page where that token starts one.
    decode = torch.full((len(seq),), -9, dtype=torch.int64)
    ends = [s + 1 for s in seq]
    CPU_EQUIVALENTS["alloc_decode_kernel"](
        seq_lens_ptr=torch.tensor(ends),
        last_loc_ptr=torch.tensor([x + 5 for x in last_loc]),
        free_page_ptr=torch.tensor(free_pages),
        out_indices=decode,
        bs_upper=4,
        page_size=page,
    )
    expected, taken = [], 0
    for end, last in zip(ends, last_loc, strict=True):
        if (end - 1) % page == 0:
            expected.append(free_pages[taken] * page)
            taken += 1
        else:
            expected.append(last + 5 + 1)
    assert decode.tolist() == expected
