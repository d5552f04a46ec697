"""`ci.sglang_json_diff`: two `racefuzz sglang --json` outputs compared, clocks aside."""

from __future__ import annotations

import copy
import json

from ci.sglang_json_diff import main

RUN = {
    "workload": "2 requests",
    "sglang_functions": ["sglang/srt/managers/scheduler.py:run_batch"],
    "races": [{"first": {"called_from": ["sglang/srt/managers/scheduler.py:10 (run_batch)"]}}],
    "latent": [],
    "syncs": {"synchronize at sglang/srt/managers/scheduler.py:20 (run_batch)": 3},
    "seconds": 0.5,
    "loop_seconds": 0.1,
}
DOCUMENT = {"python_dir": "/a", "status": "ok", "runs": [RUN], "import_seconds": 1.0, "wall_s": 2.0}


def write(tmp_path, name, document):
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def test_outputs_that_differ_only_in_their_clocks_are_identical(tmp_path, capsys):
    after = copy.deepcopy(DOCUMENT)
    after.update(python_dir="/b", import_seconds=3.0, wall_s=4.0)
    after["runs"][0].update(seconds=9.0, loop_seconds=8.0)
    assert main([write(tmp_path, "a.json", DOCUMENT), write(tmp_path, "b.json", after)]) == 0
    assert capsys.readouterr().out.startswith("identical, clocks aside: 1 runs, 1 functions, 1 races")


def test_a_changed_caller_chain_is_named_by_its_run_and_key(tmp_path, capsys):
    after = copy.deepcopy(DOCUMENT)
    after["runs"][0]["races"][0]["first"]["called_from"] = ["sglang/srt/managers/scheduler.py:11 (run_batch)"]
    assert main([write(tmp_path, "a.json", DOCUMENT), write(tmp_path, "b.json", after)]) == 1
    assert capsys.readouterr().out.strip() == "run 1 (2 requests): races differs"


def test_an_unreadable_file_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{")
    assert main([write(tmp_path, "a.json", DOCUMENT), str(tmp_path / "bad.json")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("ci.sglang_json_diff: cannot read") and captured.err.count("\n") == 1
