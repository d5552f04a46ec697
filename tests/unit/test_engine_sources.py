"""`racefuzz.engines.sources.EngineSources` on a made-up engine: no wheel downloaded, no engine imported."""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from racefuzz.engines.sources import EngineSources, SourcesUnavailable
from racefuzz.errors import InvalidArgument

TOY = EngineSources(
    package="toy",
    display="Toy",
    article="a",
    example_version="1.2.3",
    marker="toy/core.py",
    cache_env="RACEFUZZ_TOY_CACHE",
    source_subdirs=("", "python"),
    keep_directories=True,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(TOY.cache_env, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("toy/core.py", "# core\n")
        wheel.writestr("toy/kernels/include/header.h", "")  # its directory is kept, the file not
        wheel.writestr("toy/_ext.so", "binary")
        wheel.writestr("other/mod.py", "# another package\n")
    return path


def test_a_malformed_version_is_one_line_naming_an_example() -> None:
    with pytest.raises(InvalidArgument, match=r"^not a Toy version: 'latest' \(expected e.g. 1.2.3\)$"):
        TOY.check_version("latest")


def test_locate_finds_a_checkout_or_its_subdirectory_and_names_what_is_missing(tmp_path: Path, cache: Path) -> None:
    (tmp_path / "checkout/python/toy").mkdir(parents=True)
    (tmp_path / "checkout/python/toy/core.py").write_text("")
    assert TOY.locate(source=tmp_path / "checkout") == (tmp_path / "checkout/python").resolve()
    with pytest.raises(SourcesUnavailable, match=r"is not a Toy source tree: no toy/core\.py in it or in its python/"):
        TOY.locate(source=tmp_path)
    with pytest.raises(
        SourcesUnavailable, match=r"run `racefuzz toy fetch --version 1.0.0` \(or set RACEFUZZ_TOY_CACHE"
    ):
        TOY.locate(version="1.0.0")
    with pytest.raises(InvalidArgument, match="give a Toy version"):
        TOY.locate()


def test_a_wheel_unpacks_to_its_python_files_and_directories(tmp_path: Path, cache: Path) -> None:
    target = TOY.python_dir("1.0.0")
    target.parent.mkdir(parents=True)
    assert TOY.unpack_wheel(_wheel(tmp_path / "toy-1.0.0.whl"), target) == 1
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == [
        "toy",
        "toy/core.py",
        "toy/kernels",
        "toy/kernels/include",
    ]
    assert TOY.locate(version="1.0.0") == target


def test_without_keep_directories_only_python_files_are_unpacked(tmp_path: Path) -> None:
    bare = EngineSources("toy", "Toy", "a", "1.2.3", "toy/core.py", "RACEFUZZ_TOY_CACHE")
    target = tmp_path / "python"
    bare.unpack_wheel(_wheel(tmp_path / "toy-1.0.0.whl"), target)
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == ["toy", "toy/core.py"]


def test_an_archive_round_trips_and_a_foreign_one_is_refused(tmp_path: Path, cache: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "toy/empty").mkdir(parents=True)
    (tree / "toy/core.py").write_text("# core\n")
    out, count, size = TOY.write_archive(tree, ["toy", "toy/empty", "toy/core.py"], tmp_path / "toy.tar.gz")
    assert (count, size) == (1, len("# core\n"))
    with tarfile.open(out) as archive:
        assert archive.getnames() == ["python/toy", "python/toy/empty", "python/toy/core.py"]
    unpacked = TOY.unpack(out, "1.0.0")
    assert (unpacked / "toy/core.py").read_text() == "# core\n" and (unpacked / "toy/empty").is_dir()
    foreign = tmp_path / "foreign.tar.gz"
    with tarfile.open(foreign, "w:gz") as archive:
        archive.add(tree / "toy/core.py", arcname="python/other/core.py")
    with pytest.raises(SourcesUnavailable, match="not an archive made by `toy pack`"):
        TOY.unpack(foreign, "1.0.1")
    (tmp_path / "junk.tar.gz").write_text("not gzip")
    with pytest.raises(SourcesUnavailable, match=r"not a readable \.tar\.gz"):
        TOY.unpack(tmp_path / "junk.tar.gz", "1.0.1")


def test_a_failed_download_is_one_line_and_leaves_no_wheel_directory(tmp_path: Path, cache: Path) -> None:
    pip = tmp_path / "pip-that-fails.py"  # stands in for `python -m pip download`: the pip error's last line
    pip.write_text("import sys\nprint('ERROR: No matching distribution found for toy==1.0.0', file=sys.stderr)\n")
    failing = tmp_path / "python"
    failing.write_text(f"#!/bin/sh\nexec {sys.executable} {pip}\n")
    failing.chmod(0o755)
    failed = re.escape("pip could not download toy==1.0.0: ERROR: No matching distribution")
    with pytest.raises(SourcesUnavailable, match=f"^{failed}"):
        TOY.fetch("1.0.0", python=str(failing))
    assert list(TOY.cache_dir("1.0.0").iterdir()) == []  # the temporary download directory removed


def test_the_wheel_is_asked_for_this_python_only_where_the_engine_builds_one_per_python() -> None:
    assert TOY.wheel_args() == []
    per_python = EngineSources("toy", "Toy", "a", "1.2.3", "toy/core.py", "RACEFUZZ_TOY_CACHE", platform_wheel=True)
    major, minor = sys.version_info[:2]
    assert per_python.wheel_args() == ["--python-version", f"{major}.{minor}", "--platform", "manylinux_2_34_x86_64"]
