"""The storages of one recording: keys, epochs, watched storages and the stream each block was allocated on.

A storage is keyed by its base address and its epoch there: a block freed and handed out again is a new
storage (the next epoch of its address). Its key is its buffer's id in the recording's program
(`racefuzz.trace.builder.ProgramBuilder.buffers`): one number names a storage everywhere. `StorageTable`
owns that bookkeeping for the Python path (`racefuzz.trace.recorder.Recorder`) and the C++ fast path
(`_fastpath.cpp`) alike: both read and write the same public containers (named in `Recorder.fast_state`),
and both go through `StorageTable.watch` for a storage seen at a new address. A watched storage's death (its
weak reference's callback) is its free, recorded by the recorder (`Recorder.on_free`), which ends its epoch
here (`end_epoch`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

from racefuzz.trace.builder import ProgramBuilder


class StorageTable:
    """Keys, epochs, watched storages and allocation streams of one recording (see the module doc).

    Args:
        builder: the recording's program builder, whose buffer each new storage gets (its id the key).
        watch_frees: watch each storage for its free (else keep every storage alive: no address reuse).
        recorder_ref: a weak reference to the recorder whose `on_free(ptr)` records a watched storage's free
            and whose `current_stream()` a storage grown in place is allocated on.
    """

    def __init__(self, builder: ProgramBuilder, watch_frees: bool, recorder_ref: Callable[[], Any]) -> None:
        self.builder = builder
        self.watch_frees = watch_frees
        self.recorder_ref = recorder_ref
        self.keys: dict[tuple[int, int], int] = {}
        """(base address, epoch) -> key: its buffer's id (0, 1, ... in order of first sight)."""
        self.epochs: dict[int, int] = {}
        """Base address -> its current epoch (0 when absent): how many storages there have died."""
        self.alloc_streams: dict[int, str] = {}
        """Base address -> the stream the storage there was allocated on while recording."""
        self.watched: dict[int, tuple[Any, int]] = {}
        """Base address -> (the weak reference whose callback records the storage's free, `id(storage)`)."""
        self.address_of: dict[int, int] = {}
        """`id(storage)` -> the address it is known at."""
        self.given_names: dict[int, str] = {}
        """Base address -> the name the step gave its storage (`Recorder.name_storage`)."""
        self.recorded_streams: set[int] = set()
        """Base addresses whose block `record_stream` deferred the reuse of."""
        self.keep: list[Any] = []
        """Every storage seen, without `watch_frees` (no address is reused within the run)."""

    def current_key(self, ptr: int) -> int | None:
        """The key of the storage at base address `ptr` in its current epoch, if it has one."""
        return self.keys.get((ptr, self.epochs.get(ptr, 0)))

    def knows(self, tensor: Any) -> bool:
        """Whether `tensor`'s storage has a key in its current epoch (it was accessed while recording, and its
        block not freed since). From the base address: no storage object is made."""
        ptr = tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()
        return (ptr, self.epochs.get(ptr, 0)) in self.keys

    def key(self, tensor: Any, origin: str) -> int:
        """The key of `tensor`'s storage, a new one (with its buffer, named `tmp<key> (<origin>)` unless the
        step named it) for a storage not seen in its current epoch."""
        # The storage's base address without making a storage object (the common case: a known storage).
        ptr = tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()
        key = self.keys.get((ptr, self.epochs.get(ptr, 0)))
        if key is not None:
            return key
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        epoch = self.epochs.get(ptr, 0)
        key = len(self.builder.buffers)
        self.keys[(ptr, epoch)] = key
        name = self.given_names.get(ptr) or f"tmp{key} ({origin})"
        row_bytes = tensor.stride(0) * tensor.element_size() if tensor.dim() == 2 else 0
        allocated_on = self.alloc_streams.get(ptr, "")  # set by `allocated` before its first access
        self.builder.new_buffer(name, storage.nbytes(), tensor.element_size(), row_bytes, allocated_on)
        if not self.watch_frees:
            self.keep.append(storage)  # the address must not be reused within the run
        if ptr:
            # Every storage seen is watched (one allocated before recording too): its death ends its epoch,
            # so a block reused at the same address is never taken for the same storage.
            self.watch(storage, ptr)
        return key

    def allocated(self, storage: Any, ptr: int, stream: str | None) -> None:
        """`storage` (at `ptr`, not 0) is a fresh allocation on `stream` (None: a block whose free is no write
        on a stream, a pinned host one); watched from now on with `watch_frees`."""
        if stream is not None:
            self.alloc_streams[ptr] = stream
        self.recorded_streams.discard(ptr)  # a `record_stream` of an earlier block at this address
        if self.watch_frees:
            self.watch(storage, ptr)  # now: a block never accessed must still end its allocation

    def resized(self, storage: Any) -> None:
        """`storage` was resized: if it was known at another address, it moved (`watch`)."""
        ptr = storage.data_ptr()
        old = self.address_of.get(id(storage))
        if ptr and old is not None and old != ptr:
            self.watch(storage, ptr)

    def watch(self, storage: Any, ptr: int) -> None:
        """Know `storage` at `ptr`; with `watch_frees`, the recorder's `on_free(ptr)` is called when it dies. A
        storage known at another address was reallocated in place (an `out=` op or `resize_` that grew it):
        its old block was freed then, and is a new storage from now on."""
        identity = id(storage)  # stable: torch keeps a storage's Python object as long as the storage
        old = self.address_of.get(identity)
        if old == ptr:
            return
        if old is not None:
            if self.watch_frees:
                recorder = self.recorder_ref()
                recorder.on_free(old)
                self.alloc_streams.setdefault(ptr, recorder.current_stream())
            else:
                self.epochs[old] = self.epochs.get(old, 0) + 1
        self.address_of[identity] = ptr
        if not self.watch_frees:
            return
        previous = self.watched.get(ptr)
        if previous is not None and previous[1] != identity:
            # Another storage known at this address moved without the recorder seeing it (a resize outside
            # dispatch, `UntypedStorage.resize_`): forget where it was rather than free this block for it.
            self.address_of.pop(previous[1], None)
        else:
            self.recorded_streams.discard(ptr)  # a new storage here: an old block's `record_stream` is gone
        callback = functools.partial(_storage_freed, self.recorder_ref, ptr)
        self.watched[ptr] = (weakref.ref(storage, callback), identity)

    def end_epoch(self, ptr: int) -> tuple[int | None, str | None, bool]:
        """The storage at `ptr` died: no longer watched, its epoch ends (a storage at `ptr` after it is a new
        one). Returns its key (None if it was never accessed), the stream it was allocated on while recording
        (None if it was not), and whether `record_stream` deferred its reuse (its free is then not modelled): a
        plain tuple, as this runs at every free."""
        watched = self.watched.pop(ptr, None)
        if watched is not None:
            self.address_of.pop(watched[1], None)
        epoch = self.epochs.get(ptr, 0)
        self.epochs[ptr] = epoch + 1
        stream = self.alloc_streams.pop(ptr, None)
        key = self.keys.get((ptr, epoch))
        record_stream = ptr in self.recorded_streams
        self.recorded_streams.discard(ptr)
        return key, stream, record_stream


def _storage_freed(recorder_ref: Callable[[], Any], ptr: int, _storage_ref: Any) -> None:
    """The callback of a watched storage's weak reference: its free, if its recorder is still recording."""
    recorder = recorder_ref()
    if recorder is not None and recorder.active:
        recorder.on_free(ptr)
