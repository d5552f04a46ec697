"""The harness subprocesses' bytecode cache (racefuzz/engines/sglang/bytecode.py)."""

from __future__ import annotations

from racefuzz.engines.sglang import bytecode


def test_a_host_that_writes_no_bytecode_gets_a_cache_outside_the_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    env = bytecode.subprocess_env({"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"})
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "racefuzz" / "pycache")
    assert env["PATH"] == "/bin"


def test_a_host_that_caches_bytecode_is_left_as_it_is():
    assert bytecode.subprocess_env({"PATH": "/bin"}) == {"PATH": "/bin"}
    assert bytecode.subprocess_env({"PYTHONDONTWRITEBYTECODE": ""}) == {"PYTHONDONTWRITEBYTECODE": ""}


def test_the_opt_out_and_a_given_prefix_are_kept():
    kept = {"PYTHONDONTWRITEBYTECODE": "1", bytecode.OPT_OUT: "0"}
    assert bytecode.subprocess_env(kept) == kept
    given = bytecode.subprocess_env({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/x"})
    assert given == {"PYTHONPYCACHEPREFIX": "/x"}
