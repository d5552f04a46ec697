"""Bad input to the device API is an `InvalidProgram` with a one-line message, never a traceback deep inside."""

from __future__ import annotations

import pytest

from racefuzz import Device, InvalidArgument, InvalidProgram, Schedule


@pytest.fixture
def device() -> Device:
    return Device()


def test_wait_on_event_of_another_device(device: Device) -> None:
    other = Device()
    stream = device.stream("schedule_stream")
    with pytest.raises(InvalidProgram, match="not an event of this device"):
        stream.wait_event(other.event("read_done"))


def test_wait_on_something_that_is_not_an_event(device: Device) -> None:
    stream = device.stream("schedule_stream")
    with pytest.raises(InvalidProgram, match="not an event of this device"):
        stream.wait_event("read_done")  # type: ignore[arg-type]


def test_wait_stream_on_foreign_stream(device: Device) -> None:
    stream = device.stream("schedule_stream")
    with pytest.raises(InvalidProgram, match="not a stream of this device"):
        stream.wait_stream(Device().stream("forward_stream"))


def test_record_on_foreign_stream(device: Device) -> None:
    event = device.event("read_done")
    with pytest.raises(InvalidProgram, match="not a stream of this device"):
        event.record(Device().stream("forward_stream"))


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ((0, slice(3, 3)), "empty cell range"),
        ((0, slice(5, 2)), "empty cell range"),
        ((0, slice(0, 17)), "out of bounds"),
        ((4, slice(0, 2)), "out of bounds"),
        ((-1, slice(0, 2)), "out of bounds"),
        ((0, slice(0, 8, 2)), "no step"),
        ((0,), "two indices"),
        ((0, "a"), "int or a slice"),
    ],
)
def test_bad_cell_ranges(device: Device, index: tuple, message: str) -> None:
    table = device.buffer("req_to_token", 4, 16)
    with pytest.raises(InvalidProgram, match=message):
        table[index]  # type: ignore[index]


def test_launch_needs_an_access_and_matching_values(device: Device) -> None:
    stream = device.stream("schedule_stream")
    table = device.buffer("req_to_token", 4, 16)
    with pytest.raises(InvalidProgram, match="at least one cell range"):
        stream.launch("noop")
    with pytest.raises(InvalidProgram, match="3 values for 4 cells"):
        stream.launch("prefill_write", writes=[(table[0, 0:4], [1, 2, 3])])
    with pytest.raises(InvalidProgram, match="must be integers"):
        stream.launch("prefill_write", writes=[(table[0, 0:2], [1.5, 2.5])])
    with pytest.raises(InvalidProgram, match="another device"):
        stream.launch("block_gather", reads=[Device().buffer("req_to_token", 4, 16)[0, 0:4]])
    with pytest.raises(InvalidProgram, match="cost_us"):
        stream.launch("block_gather", reads=[table[0, 0:4]], cost_us=-1)


def test_negative_delays(device: Device) -> None:
    with pytest.raises(InvalidProgram, match=">= 0"):
        device.host_delay(-1.0)
    with pytest.raises(InvalidArgument, match=">= 0"):
        Schedule(read_spins={3: -5.0})
    with pytest.raises(InvalidArgument, match="above the cap"):
        Schedule(device_delays={3: 1e9})
    with pytest.raises(InvalidArgument, match="non-negative int"):
        Schedule(host_delays={-2: 5.0})


def test_use_after_finish(device: Device) -> None:
    stream = device.stream("schedule_stream")
    event = device.event("read_done")
    table = device.buffer("req_to_token", 4, 16)
    stream.launch("prefill_write", writes=[(table[0, 0:4], 7)])
    device.finish()
    for call in (
        lambda: stream.launch("prefill_write", writes=[(table[0, 0:4], 7)]),
        lambda: stream.synchronize(),
        lambda: event.record(stream),
        lambda: event.synchronize(),
        lambda: device.stream("forward_stream"),
        lambda: device.synchronize(),
        lambda: device.finish(),
    ):
        with pytest.raises(InvalidProgram, match="used after the program finished"):
            call()


def test_duplicate_stream_names_and_bad_buffers(device: Device) -> None:
    device.stream("schedule_stream")
    with pytest.raises(InvalidProgram, match="already exists"):
        device.stream("schedule_stream")
    with pytest.raises(InvalidProgram, match="shape must be positive"):
        device.buffer("req_to_token", 0, 16)


def test_schedule_must_fit_the_program(device: Device) -> None:
    from racefuzz import simulate

    stream = device.stream("schedule_stream")
    table = device.buffer("req_to_token", 4, 16)
    stream.launch("prefill_write", writes=[(table[0, 0:4], 7)])
    device.synchronize()
    program = device.finish()
    with pytest.raises(InvalidArgument, match="not a reading launch"):
        simulate(program, Schedule(read_spins={0: 10.0}))
    with pytest.raises(InvalidArgument, match="not a stream op"):
        simulate(program, Schedule(device_delays={1: 10.0}))
    with pytest.raises(InvalidArgument, match="only 2 ops"):
        simulate(program, Schedule(host_delays={5: 10.0}))
