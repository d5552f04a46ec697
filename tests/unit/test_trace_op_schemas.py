"""`racefuzz.trace.op_schemas` and `racefuzz.trace.sync_rules` on real aten ops (CPU tensors): the read and
write sets of a call, what the recorder does with an op, and which ops sync the host (after CSAN's
`TestArgumentHandler`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from racefuzz.trace import op_schemas, sync_rules  # noqa: E402

aten = torch.ops.aten


def accesses(func, *args, **kwargs):
    """(the read tensors, the (slot, written tensor) pairs) of `func(*args, **kwargs)` by its schema."""
    schemas = op_schemas.schemas()
    return schemas.accesses(schemas.info(func), args, kwargs)


def same(found, expected) -> bool:
    return len(found) == len(expected) and all(f is e for f, e in zip(found, expected, strict=True))


def test_an_out_of_place_op_reads_its_inputs_and_writes_only_its_fresh_output():
    a, b = torch.ones(3), torch.ones(3)
    reads, writes = accesses(aten.add.Tensor, a, b)
    assert same(reads, [a, b]) and writes == []
    info = op_schemas.schemas().info(aten.add.Tensor)
    assert info.fresh_outputs and not info.fast  # its output is written: the launch's `outputs`


def test_an_in_place_op_writes_self_and_reads_the_rest():
    a, b = torch.ones(3), torch.ones(3)
    reads, writes = accesses(aten.add_.Tensor, a, b)
    assert same(reads, [b]) and [slot for slot, _ in writes] == ["self"] and writes[0][1] is a
    assert op_schemas.schemas().info(aten.add_.Tensor).fast


def test_an_out_argument_is_written_also_when_given_by_keyword():
    a, b, out = torch.ones(3), torch.ones(3), torch.zeros(3)
    reads, writes = accesses(aten.add.out, a, b, out=out)
    assert same(reads, [a, b]) and [slot for slot, _ in writes] == ["out"] and writes[0][1] is out


def test_a_tensor_list_argument_is_read_tensor_by_tensor_and_a_written_one_slot_by_slot():
    a, b = torch.ones(3), torch.ones(3)
    reads, writes = accesses(aten.cat.default, [a, b])
    assert same(reads, [a, b]) and writes == []
    reads, writes = accesses(aten._foreach_add_.Scalar, [a, b], 1)
    assert reads == [] and [slot for slot, _ in writes] == ["self0", "self1"]


def test_a_view_aliases_its_input_without_writing_it():
    a = torch.ones(2, 3)
    reads, writes = accesses(aten.t.default, a)  # `Tensor(a) self -> Tensor(a)`: an alias, no write
    assert same(reads, [a]) and writes == []
    assert not op_schemas.schemas().info(aten.t.default).fresh_outputs  # the mode runs it unrecorded


def test_allocations_and_in_place_view_ops_are_no_accesses():
    schemas = op_schemas.schemas()
    empty_like = schemas.info(aten.empty_like.default)
    assert empty_like.not_access and empty_like.allocates
    unsqueeze_ = schemas.info(aten.unsqueeze_.default)  # torch's `inplace_view` tag: metadata only
    assert unsqueeze_.not_access and not unsqueeze_.allocates and not unsqueeze_.fast


def test_the_sync_rules_table_names_a_method_of_sync_rules_for_each_op():
    # One table, op name -> rule: every entry is a rule `SyncRules` has, and an op not in it never syncs.
    rules = sync_rules.SyncRules(torch.Tensor, frozenset({torch.bool, torch.uint8}))
    assert {name: getattr(rules, rule) for name, rule in sync_rules.RULES.items()}
    schemas = op_schemas.schemas()
    assert schemas.info(aten.nonzero.default).sync == schemas.sync_rules.on_input
    assert schemas.info(aten._local_scalar_dense.default).sync == schemas.sync_rules.after_copy_out
    assert schemas.info(aten.index.Tensor).sync == schemas.sync_rules.on_mask
    assert schemas.info(aten.copy_.default).sync == schemas.sync_rules.in_copy
    assert schemas.info(aten.add_.Tensor).sync is None and rules.of("add_") is None


def test_the_dispatcher_entry_is_told_what_it_records_of_each_op():
    kinds = {
        ("aten::add_", "Tensor"): op_schemas.FAST_WRITES,
        ("aten::copy_", ""): op_schemas.FAST_WRITES,  # between two tensors of the device: no sync
        ("aten::add", "Tensor"): op_schemas.FAST_FRESH,
        ("aten::_to_copy", ""): op_schemas.FAST_FRESH,
        ("aten::empty_like", ""): op_schemas.FAST_ALLOCATES,
        ("aten::lift_fresh", ""): op_schemas.FAST_LIFTED,
    }
    for (name, overload), kind in kinds.items():
        found = op_schemas.dispatcher_op_info(name, overload)
        assert found is not None and found[2] == kind, (name, found)
    assert op_schemas.dispatcher_op_info("aten::lift_fresh", "")[1] == op_schemas.TORCH_TENSOR_COPY
    # Syncing ops, index ops (byte sets from their index values) and unknown ops take the Python path.
    for name, overload in (("aten::nonzero", ""), ("aten::index", "Tensor"), ("aten::no_such_op", "")):
        assert op_schemas.dispatcher_op_info(name, overload) is None, name
