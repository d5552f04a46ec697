"""Bounded proofs: a clean design proved over a small bound, the control and a mutant racing in it."""

from __future__ import annotations

import argparse

import pytest

from racefuzz.commands.prove import add_parser, prove_command
from racefuzz.designs import load_design
from racefuzz.errors import InvalidArgument
from racefuzz.exitcodes import ExitCode
from racefuzz.prove import byte_strings, prove
from racefuzz.scenarios.sglang import HAZARDS

BOUND = {
    "max_bytes": 11,
    "alphabet": 2,
    "option_sets": [{"fixed_iterations": True, "max_iterations": n} for n in (1, 2)],
}


def test_byte_strings_are_every_string_up_to_the_length() -> None:
    strings = list(byte_strings(3, 2))
    assert len(strings) == 1 + 2 + 4 + 8 == len(set(strings))
    assert strings[0] == b"" and strings[-1] == b"\x01\x01\x01"


def test_a_clean_design_is_proved_and_the_control_races_in_the_same_bound() -> None:
    proof = prove(load_design("war-after-launch"), hazards=HAZARDS, **BOUND)
    control = prove(load_design("none"), hazards=HAZARDS, **BOUND)
    assert proof.proved and proof.workloads == control.workloads > 100 and proof.racing == 0
    assert not control.proved and control.racing > 0 and control.counterexamples
    assert "WAR" in control.counterexamples[0].what
    assert "distinct workloads" in proof.covers() and "max_iterations=2" in proof.covers()


def test_a_mutant_races_in_a_small_bound() -> None:
    proof = prove(load_design("mutant-read-done-early"), hazards=HAZARDS, keep=1, **BOUND)
    assert not proof.proved and len(proof.counterexamples) == 1


def test_an_enormous_bound_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="lower the bound"):
        prove(load_design("none"), hazards=HAZARDS, max_bytes=40, alphabet=4)
    # Refused without computing (or printing) the astronomically large count first.
    with pytest.raises(InvalidArgument, match="more than 50,000,000 byte strings"):
        prove(load_design("none"), hazards=HAZARDS, max_bytes=10**6, alphabet=256)


def test_a_design_that_races_is_not_proved_even_when_no_counterexample_is_kept() -> None:
    proof = prove(load_design("none"), hazards=HAZARDS, keep=0, **BOUND)
    assert proof.racing > 0 and not proof.counterexamples
    assert not proof.proved


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_parser(lambda name, help: sub.add_parser(name, help=help))
    return parser.parse_args(["prove", *argv])


def test_the_command_exits_clean_with_the_control_caught(tmp_path, capsys) -> None:
    out = tmp_path / "proof.json"
    code = prove_command(
        _args("--design", "war-after-launch", "--max-bytes", "11", "--iterations", "1-2", "--json", str(out))
    )
    assert code == ExitCode.CLEAN
    text = capsys.readouterr().out
    assert "war-after-launch: PROVED race-free" in text and "negative control none:" in text
    assert '"proved": true' in out.read_text()
    assert prove_command(_args("--design", "none", "--max-bytes", "11", "--iterations", "2")) == ExitCode.RACE


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-bytes", "20000"], "up to 64"),
        (["--max-bytes", "-1"], "non-negative"),
        (["--alphabet", "0"], "from 1"),
        (["--iterations", "1-100000"], "<= 64"),
    ],
)
def test_bound_options_out_of_range_are_usage_errors(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit:
        _args(*argv)
    assert exit.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unwritable_json_is_refused_before_the_proof(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InvalidArgument, match="--json"):
        prove_command(_args("--max-bytes", "11", "--iterations", "1", "--json", str(blocker / "proof.json")))
    assert "PROVED" not in capsys.readouterr().out
