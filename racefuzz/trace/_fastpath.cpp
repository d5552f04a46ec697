// The recorder's C++ fast path for torch ops: from the dispatch mode, an op that writes only its arguments
// (an in-place or `out=` op); below torch's dispatcher (see "The dispatcher entry"), those and ops that
// return fresh tensors. `Recorder.launch_op` / `launch` and what they call (`OpSchemas.accesses`,
// `current_stream`, `user_source`, `_access`): the same program op built from the same dicts, through the same
// `racefuzz.trace.builder.ProgramBuilder` containers, without
// Python's per-op interpretation. Built and loaded by `racefuzz.trace.fastpath`; the Python path stays the
// reference (tests/unit/test_trace_fastpath.py runs both on the same steps and compares the traces).
//
// Contract of `launch_op(state, arguments, label, func, args, kwargs)`:
// * returns `state[BAIL]` without any side effect when the op is not for it (a tensor list argument, a
//   tensor off the GPU in a GPU run, a stream or a frame it has not seen yet): the caller then takes the
//   Python path, which records it (and teaches the caches: the next such op is fast);
// * an op that writes nothing (a view, a metadata op) is called and not recorded, as the Python path does;
// * otherwise: the delay (`recorder.delay`), the call `func(*args, **kwargs)`, the `Launch` appended
//   with its accesses as cell ranges of its storages' buffers (after a host-order wait if one is due), the snapshots (`recorder.after_launch`); returns what `func` returned. Anything unusual
//   after the call (a strided view, an unknown storage) is handed to the recorder's own Python methods.
#include <Python.h>
#include <frameobject.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#if PY_VERSION_HEX < 0x030B0000
#error "the fast path needs Python 3.11 or later (PyFrame_GetLasti); racefuzz.trace.fastpath skips it before"
#endif

namespace {

// Indices into the state tuple `pack_state(fields)` makes of the dict `Recorder.fast_state()` builds (the
// recorder's own containers, its storage table's and its program builder's), by the names in `STATE_NAMES`:
// the protocol between the two languages is the names; the positions are this file's own.
enum State {
  RECORDER,
  BAIL,
  BUILDER,
  OPS,
  BUFFERS,
  TORCH_INFOS,
  HOST_COUNT,
  AFTER_HOST,
  LAUNCH_OPS,
  STORAGE_TABLE,
  KEYS,
  EPOCHS,
  STREAM_NAMES,
  STREAMS,
  DELAYS,
  SNAPSHOTS_OR_SYNCS,
  ON_GPU,
  RAW_STREAM,
  DEVICE_INDEX,
  ALLOC_STREAM,
  RECORDED_STREAMS,
  ADDRESS_OF,
  WATCHED,
  GIVEN_NAMES,
  KEEP,
  WATCH_FREES,
  RECORDER_REF,
  STATE_SIZE
};

// The key of each `State` field in `Recorder.fast_state()`'s dict, in `State`'s order (the module's
// `STATE_FIELDS`, which `racefuzz.trace.fastpath` checks against the recorder's before it packs a state).
const char* const STATE_NAMES[STATE_SIZE] = {
    "recorder",     "bail",          "builder",      "ops",          "buffers",      "torch_infos",
    "host_count",   "after_host",    "launch_ops",   "storage_table", "keys",        "epochs",
    "stream_names", "streams",       "delays",       "snapshots_or_syncs",           "on_gpu",
    "raw_stream",   "device_index",  "alloc_streams", "recorded_streams",            "address_of",
    "watched",      "given_names",   "keep",         "watch_frees",  "recorder_ref"};

// Indices into the tuple `configure` packs of the dict `racefuzz.trace.recorder.fast_constants()` gives it (by
// the names in `CONSTANT_NAMES`): the program's types and `user_source`'s caches and helpers, the same for
// every recorder of the process.
enum Constant {
  LAUNCH,
  CELL_RANGE,
  LIBRARY_CODE,
  SOURCES,
  CODE_IS_LIBRARY,
  FRAME_SOURCE,
  KIND_TORCH,
  KIND_FREE,
  KIND_COPY,
  STREAM_SYNC,
  CONSTANTS_SIZE
};

// The key of each `Constant` in `fast_constants()`'s dict, in `Constant`'s order (the module's
// `CONSTANT_FIELDS`).
const char* const CONSTANT_NAMES[CONSTANTS_SIZE] = {
    "launch",     "cell_range", "library_code", "sources",   "code_is_library", "frame_source",
    "kind_torch", "kind_free",  "kind_copy",    "stream_sync"};

// The names `names` as a tuple of str (a new reference), or nullptr with an exception.
PyObject* name_tuple(const char* const* names, Py_ssize_t size) {
  PyObject* tuple = PyTuple_New(size);
  for (Py_ssize_t i = 0; tuple != nullptr && i < size; ++i) {
    PyObject* name = PyUnicode_FromString(names[i]);
    if (name == nullptr) {
      Py_CLEAR(tuple);
      break;
    }
    PyTuple_SET_ITEM(tuple, i, name);
  }
  return tuple;
}

// `fields` (a dict with exactly the keys `names`) as a tuple in the order of `names` (a new reference);
// nullptr with a TypeError naming the keys that are missing or unexpected: a recorder and a build that
// disagree on the fields fail here, at the start of a recording, instead of reading the wrong container.
PyObject* pack(PyObject* fields, const char* const* names, Py_ssize_t size, const char* what) {
  if (!PyDict_CheckExact(fields)) {
    PyErr_Format(PyExc_TypeError, "%s: a dict of the fields by name, not %R", what, Py_TYPE(fields));
    return nullptr;
  }
  PyObject* packed = PyTuple_New(size);
  PyObject* expected = packed == nullptr ? nullptr : name_tuple(names, size);
  if (expected == nullptr) {
    Py_XDECREF(packed);
    return nullptr;
  }
  bool complete = true;
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject* value = PyDict_GetItemWithError(fields, PyTuple_GET_ITEM(expected, i));  // borrowed
    if (value == nullptr) {
      if (PyErr_Occurred()) {
        Py_DECREF(packed);
        Py_DECREF(expected);
        return nullptr;
      }
      complete = false;
      value = Py_None;
    }
    Py_INCREF(value);
    PyTuple_SET_ITEM(packed, i, value);
  }
  if (!complete || PyDict_GET_SIZE(fields) != size) {
    PyObject* given = PyDict_Keys(fields);
    if (given != nullptr) {
      PyErr_Format(PyExc_TypeError, "%s: the fields given, %R, are not the fields this build expects, %R", what,
                   given, expected);
      Py_DECREF(given);
    }
    Py_DECREF(packed);
    Py_DECREF(expected);
    return nullptr;
  }
  Py_DECREF(expected);
  return packed;
}

// What the dispatcher entry does with an op: `racefuzz.trace.op_schemas.dispatcher_op_info`'s kinds, in order.
enum OpKind { WRITES, FRESH, ALLOCATES, LIFTED };

PyObject* constants = nullptr;  // set by `configure`; held for the process

PyObject* constant(Constant which) { return PyTuple_GET_ITEM(constants, which); }

// `user_source` from `frame` outwards: a new reference to `file:line (function)` of the first frame outside
// the recorder, torch, Triton and Hypothesis (the caches of racefuzz.trace.recorder, filled through its
// Python helpers on a miss), "" if there is none; nullptr with an exception if a helper raised.
PyObject* user_source(PyFrameObject* frame) {
  PyObject* library = constant(LIBRARY_CODE);
  PyObject* sources = constant(SOURCES);
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    // Keyed by `id(code)`, as the recorder's caches are (a code object's own hash is recomputed per lookup).
    PyObject* code_id = PyLong_FromVoidPtr(code);
    if (code_id == nullptr) {
      Py_DECREF(code);
      Py_DECREF(frame);
      return nullptr;
    }
    PyObject* known = PyDict_GetItem(library, code_id);
    if (known == nullptr) {
      known = PyObject_CallOneArg(constant(CODE_IS_LIBRARY), reinterpret_cast<PyObject*>(code));
      if (known == nullptr) {
        Py_DECREF(code_id);
        Py_DECREF(code);
        Py_DECREF(frame);
        return nullptr;
      }
      Py_DECREF(known);  // the cache holds it (True / False)
    }
    if (known == Py_False) {
      int lasti = PyFrame_GetLasti(frame);  // what Python's `frame.f_lasti` is (bytes)
      PyObject* key = Py_BuildValue("(Oi)", code_id, lasti);
      Py_DECREF(code_id);
      Py_DECREF(code);
      if (key == nullptr) {
        Py_DECREF(frame);
        return nullptr;
      }
      PyObject* source = PyDict_GetItem(sources, key);
      Py_DECREF(key);
      if (source != nullptr) {
        Py_INCREF(source);
      } else {
        source = PyObject_CallOneArg(constant(FRAME_SOURCE), reinterpret_cast<PyObject*>(frame));
      }
      Py_DECREF(frame);
      return source;
    }
    Py_DECREF(code_id);
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return PyUnicode_FromString("");
}

// `object` (a new reference, or nullptr), no longer tracked by Python's cyclic GC: a trace op or access holds
// only ints, strings and such tuples, so it can never be part of a cycle. Tracked, the tens of thousands a
// long step makes would be scanned by every full collection while recording (CPython untracks plain
// tuples of atoms itself, lazily, but never a NamedTuple): untracked, the fast path costs about a third.
PyObject* untracked(PyObject* object) {
  if (object != nullptr && PyObject_GC_IsTracked(object)) {
    PyObject_GC_UnTrack(object);
  }
  return object;
}

// `tuple.__new__(type, fields)`: a NamedTuple of all its fields without its Python `__new__` (as the
// recorder's `_tuple_new`); steals nothing, returns a new reference or nullptr with an exception.
PyObject* make(PyObject* type, PyObject* fields) {
  PyObject* packed = PyTuple_Pack(1, fields);
  if (packed == nullptr) {
    return nullptr;
  }
  PyObject* made = PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject*>(type), packed, nullptr);
  Py_DECREF(packed);
  return untracked(made);
}

// `CellRange(buffers[key], 0, 1, start, end)`: bytes [start, end) of storage `key` as a cell range of its
// buffer (`racefuzz.trace.builder`); a new reference, or nullptr with an exception.
PyObject* cell_range(PyObject* buffers, PyObject* key, long long start, long long end) {
  const Py_ssize_t id = PyLong_AsSsize_t(key);
  if (id < 0 || id >= PyList_GET_SIZE(buffers)) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_KeyError, "storage %R has no buffer", key);
    }
    return nullptr;
  }
  PyObject* fields = Py_BuildValue("(OiiLL)", PyList_GET_ITEM(buffers, id), 0, 1, start, end);
  if (fields == nullptr) {
    return nullptr;
  }
  PyObject* made = make(constant(CELL_RANGE), fields);
  Py_DECREF(fields);
  return made;
}

// `ProgramBuilder.order_after_host(stream)` when it has something to do: the host accesses emitted so far
// (`host_count[0]`) are more than `stream` is ordered after (`after_host`). False with a Python exception.
bool order_after_host(PyObject* builder, PyObject* host_count, PyObject* after_host, PyObject* stream) {
  const long count = PyLong_AsLong(PyList_GET_ITEM(host_count, 0));
  if (count == 0) {
    return true;
  }
  PyObject* seen = PyDict_GetItemWithError(after_host, stream);  // borrowed
  if (seen == nullptr && PyErr_Occurred()) {
    return false;
  }
  if (seen != nullptr && PyLong_AsLong(seen) >= count) {
    return true;
  }
  PyObject* none = PyObject_CallMethod(builder, "order_after_host", "O", stream);
  Py_XDECREF(none);
  return none != nullptr;
}

// The `Launch.info` of a launch of `kind` at `source` (a new reference): from `cached` (the builder's
// source -> info of that kind), else `ProgramBuilder.info` (which fills it). nullptr with an exception.
PyObject* launch_info(PyObject* builder, PyObject* cached, PyObject* kind, PyObject* source) {
  PyObject* info = cached == nullptr ? nullptr : PyDict_GetItemWithError(cached, source);  // borrowed
  if (info != nullptr) {
    Py_INCREF(info);
    return info;
  }
  if (PyErr_Occurred()) {
    return nullptr;
  }
  return PyObject_CallMethod(builder, "info", "OOO", kind, source, Py_False);
}

// `Launch(index, streams[stream], kernel, reads, writes, (), None, info, None)` appended to `ops` (the
// builder's), the index `len(ops)`: a new reference to the index, or nullptr with an exception.
PyObject* append_launch(PyObject* ops, PyObject* streams, PyObject* stream, PyObject* kernel, PyObject* reads,
                        PyObject* writes, PyObject* info) {
  PyObject* on = PyDict_GetItemWithError(streams, stream);  // borrowed: a stream seen has its `Stream`
  if (on == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_KeyError, "stream %R has no Stream", stream);
    }
    return nullptr;
  }
  PyObject* index = PyLong_FromSsize_t(PyList_GET_SIZE(ops));
  PyObject* no_values = index == nullptr ? nullptr : PyTuple_New(0);
  PyObject* fields = no_values == nullptr
                         ? nullptr
                         : PyTuple_Pack(9, index, on, kernel, reads, writes, no_values, Py_None, info, Py_None);
  Py_XDECREF(no_values);
  PyObject* op = fields == nullptr ? nullptr : make(constant(LAUNCH), fields);
  Py_XDECREF(fields);
  const bool appended = op != nullptr && PyList_Append(ops, op) == 0;
  Py_XDECREF(op);
  if (!appended) {
    Py_XDECREF(index);
    return nullptr;
  }
  return index;
}

// The stream name of the current stream (a new reference), or nullptr (no exception) for one not seen yet.
PyObject* current_stream(PyObject* state) {
  PyObject* name;
  if (PyTuple_GET_ITEM(state, ON_GPU) == Py_True) {
    PyObject* handle = PyObject_CallOneArg(PyTuple_GET_ITEM(state, RAW_STREAM), PyTuple_GET_ITEM(state, DEVICE_INDEX));
    if (handle == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    name = PyDict_GetItem(PyTuple_GET_ITEM(state, STREAM_NAMES), handle);
    Py_DECREF(handle);
    Py_XINCREF(name);
  } else {
    PyObject* current = PyObject_GetAttrString(PyTuple_GET_ITEM(state, RECORDER), "virtual_current");
    if (current == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    name = PyObject_GetAttrString(current, "name");
    Py_DECREF(current);
    if (name == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
  }
  if (name != nullptr && PyDict_Contains(PyTuple_GET_ITEM(state, STREAMS), name) != 1) {
    Py_DECREF(name);
    return nullptr;
  }
  return name;
}

// A contiguous view's bytes in its storage: [start, start + nbytes) from the storage's base address. False
// for a strided view or one without a plain storage (meta, sparse: the Python path says what it is).
bool contiguous_extent(const at::Tensor& t, int64_t& start, int64_t& nbytes, uintptr_t& base) {
  try {
    if (!t.is_contiguous()) {
      return false;
    }
    int64_t itemsize = static_cast<int64_t>(t.itemsize());
    nbytes = t.numel() * itemsize;
    start = t.storage_offset() * itemsize;
    base = nbytes ? reinterpret_cast<uintptr_t>(t.data_ptr()) - static_cast<uintptr_t>(start) : 0;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The recorder's key of the storage at `base` in its current epoch (`StorageTable.current_key(base)`),
// borrowed; nullptr for a storage it does not know yet, with an exception set only on an error.
PyObject* known_key(PyObject* state, uintptr_t base) {
  PyObject* base_obj = PyLong_FromUnsignedLongLong(base);
  if (base_obj == nullptr) {
    return nullptr;
  }
  PyObject* epoch = PyDict_GetItem(PyTuple_GET_ITEM(state, EPOCHS), base_obj);
  PyObject* zero = epoch == nullptr ? PyLong_FromLong(0) : nullptr;
  PyObject* pair = epoch == nullptr && zero == nullptr ? nullptr : PyTuple_Pack(2, base_obj, epoch ? epoch : zero);
  Py_XDECREF(zero);
  Py_DECREF(base_obj);
  if (pair == nullptr) {
    return nullptr;
  }
  PyObject* key = PyDict_GetItem(PyTuple_GET_ITEM(state, KEYS), pair);
  Py_DECREF(pair);
  return key;
}

// ---- Storages: new ones, allocations, frees ---------------------------------------------------------------
//
// What `StorageTable.key` (a storage seen for the first time), `Recorder.allocated` (a fresh output) and
// `StorageTable.watch` / `Recorder.on_free` (a storage's death as a free) do, on the same containers: the fast
// path's fresh outputs (`c = a + b`: an allocation, a new storage and, when the block is reused, a free per
// op) would otherwise call into Python three times an op. A storage the recorder has placed at another
// address (grown in place) is handed to `StorageTable.watch`, which records its old block's free.

// Attribute names the free callback reads from the recorder, interned once (`PyInit`).
struct Names {
  PyObject *active, *paused, *builder, *storage_table, *buffers, *streams, *free_infos, *host_count, *after_host,
      *ops, *watched, *address_of, *epochs, *alloc_streams, *keys, *recorded_streams, *cols, *name, *new_buffer;
};
Names names;

bool intern_names() {
  struct Entry {
    PyObject** slot;
    const char* text;
  };
  for (Entry entry : {Entry{&names.active, "active"}, Entry{&names.paused, "paused"},
                      Entry{&names.builder, "builder"}, Entry{&names.storage_table, "storage_table"},
                      Entry{&names.buffers, "buffers"}, Entry{&names.streams, "streams"},
                      Entry{&names.free_infos, "free_infos"}, Entry{&names.host_count, "host_count"},
                      Entry{&names.after_host, "after_host"}, Entry{&names.ops, "ops"},
                      Entry{&names.watched, "watched"}, Entry{&names.address_of, "address_of"},
                      Entry{&names.epochs, "epochs"}, Entry{&names.alloc_streams, "alloc_streams"},
                      Entry{&names.keys, "keys"}, Entry{&names.recorded_streams, "recorded_streams"},
                      Entry{&names.cols, "cols"}, Entry{&names.name, "name"},
                      Entry{&names.new_buffer, "new_buffer"}}) {
    *entry.slot = PyUnicode_InternFromString(entry.text);
    if (*entry.slot == nullptr) {
      return false;
    }
  }
  return true;
}

// `dictionary.pop(key, None)`: a new reference, or nullptr (an exception set only on an error).
PyObject* pop(PyObject* dictionary, PyObject* key) {
  PyObject* value = PyDict_GetItemWithError(dictionary, key);
  if (value == nullptr) {
    return nullptr;
  }
  Py_INCREF(value);
  if (PyDict_DelItem(dictionary, key) < 0) {
    Py_DECREF(value);
    return nullptr;
  }
  return value;
}

// `dictionary.get(key, 0)` (a new reference), nullptr with an exception on an error.
PyObject* get_or_zero(PyObject* dictionary, PyObject* key) {
  PyObject* value = PyDict_GetItemWithError(dictionary, key);
  if (value != nullptr) {
    Py_INCREF(value);
    return value;
  }
  return PyErr_Occurred() ? nullptr : PyLong_FromLong(0);
}

// What the free callback needs of a recorder: its program builder's containers (`recorder.builder`, a
// `racefuzz.trace.builder.ProgramBuilder`) and its storage table's (`recorder.storage_table`: the public
// containers of `racefuzz.trace.storages.StorageTable`), each a new reference (released by the destructor).
struct FreeTargets {
  PyObject *builder = nullptr, *buffers = nullptr, *streams = nullptr, *free_infos = nullptr, *host_count = nullptr,
           *after_host = nullptr, *ops = nullptr, *watched = nullptr, *address_of = nullptr, *epochs = nullptr,
           *alloc_stream = nullptr, *keys = nullptr, *recorded_streams = nullptr;
  bool load(PyObject* recorder) {
    struct Slot {
      PyObject** target;
      PyObject* name;
    };
    builder = PyObject_GetAttr(recorder, names.builder);
    bool ok = builder != nullptr;
    for (Slot slot : {Slot{&buffers, names.buffers}, Slot{&streams, names.streams},
                      Slot{&free_infos, names.free_infos}, Slot{&host_count, names.host_count},
                      Slot{&after_host, names.after_host}, Slot{&ops, names.ops}}) {
      ok = ok && (*slot.target = PyObject_GetAttr(builder, slot.name)) != nullptr;  // stops at the first error
    }
    PyObject* table = ok ? PyObject_GetAttr(recorder, names.storage_table) : nullptr;
    if (table == nullptr) {
      return false;
    }
    for (Slot slot : {Slot{&watched, names.watched}, Slot{&address_of, names.address_of},
                      Slot{&epochs, names.epochs}, Slot{&alloc_stream, names.alloc_streams}, Slot{&keys, names.keys},
                      Slot{&recorded_streams, names.recorded_streams}}) {
      ok = ok && (*slot.target = PyObject_GetAttr(table, slot.name)) != nullptr;
    }
    Py_DECREF(table);
    return ok;
  }
  ~FreeTargets() {
    for (PyObject* held : {builder, buffers, streams, free_infos, host_count, after_host, ops, watched, address_of,
                           epochs, alloc_stream, keys, recorded_streams}) {
      Py_XDECREF(held);
    }
  }
};

// `Recorder.on_free(ptr)`: the storage at `ptr` died; its epoch ends, and if it was allocated while recording
// on a known stream (and not handed to `record_stream`), a `free(<name>)` launch writing its whole block on
// that stream is appended, with the source line the free happened at. False with a Python exception.
bool on_free(PyObject* recorder, PyObject* ptr) {
  FreeTargets at;
  if (!at.load(recorder)) {
    return false;
  }
  PyObject* watched = pop(at.watched, ptr);
  if (watched == nullptr && PyErr_Occurred()) {
    return false;
  }
  if (watched != nullptr) {
    PyObject* gone = pop(at.address_of, PyTuple_GET_ITEM(watched, 1));
    Py_DECREF(watched);
    if (gone == nullptr && PyErr_Occurred()) {
      return false;
    }
    Py_XDECREF(gone);
  }
  PyObject* epoch = get_or_zero(at.epochs, ptr);
  PyObject* one = PyLong_FromLong(1);
  PyObject* next = epoch == nullptr || one == nullptr ? nullptr : PyNumber_Add(epoch, one);
  Py_XDECREF(one);
  bool ok = next != nullptr && PyDict_SetItem(at.epochs, ptr, next) == 0;
  Py_XDECREF(next);
  PyObject* stream = ok ? pop(at.alloc_stream, ptr) : nullptr;
  ok = ok && !PyErr_Occurred();
  PyObject* pair = ok ? PyTuple_Pack(2, ptr, epoch) : nullptr;
  Py_XDECREF(epoch);
  PyObject* key = pair == nullptr ? nullptr : PyDict_GetItemWithError(at.keys, pair);  // borrowed
  Py_XDECREF(pair);
  ok = pair != nullptr && !PyErr_Occurred();
  int recorded_stream = ok ? PySet_Discard(at.recorded_streams, ptr) : -1;  // 1: it was there
  PyObject* paused = recorded_stream < 0 ? nullptr : PyObject_GetAttr(recorder, names.paused);
  int is_paused = paused == nullptr ? -1 : PyObject_IsTrue(paused);
  Py_XDECREF(paused);
  if (is_paused < 0) {
    Py_XDECREF(stream);
    return false;
  }
  if (is_paused || key == nullptr || stream == nullptr || recorded_stream == 1) {
    Py_XDECREF(stream);
    return true;
  }
  // `ProgramBuilder.free(key, stream, source)`: a write of the whole buffer on its allocation stream.
  Py_INCREF(key);
  const Py_ssize_t id = PyLong_AsSsize_t(key);
  PyObject* buffer = id >= 0 && id < PyList_GET_SIZE(at.buffers) ? PyList_GET_ITEM(at.buffers, id) : nullptr;
  if (buffer == nullptr && !PyErr_Occurred()) {
    PyErr_SetObject(PyExc_KeyError, key);
  }
  PyObject* cols = buffer == nullptr ? nullptr : PyObject_GetAttr(buffer, names.cols);
  PyObject* name = cols == nullptr ? nullptr : PyObject_GetAttr(buffer, names.name);
  PyObject* kernel = name == nullptr ? nullptr : PyUnicode_FromFormat("free(%S)", name);
  const long long nbytes = kernel == nullptr ? 0 : PyLong_AsLongLong(cols);
  PyObject* whole = kernel == nullptr || PyErr_Occurred() ? nullptr : cell_range(at.buffers, key, 0, nbytes);
  PyObject* writes = whole == nullptr ? nullptr : untracked(PyTuple_Pack(1, whole));
  PyObject* source = writes == nullptr ? nullptr : user_source(PyEval_GetFrame());
  PyObject* info = source == nullptr ? nullptr : launch_info(at.builder, at.free_infos, constant(KIND_FREE), source);
  PyObject* reads = info == nullptr ? nullptr : PyTuple_New(0);
  // The host-order wait and the index last, next to the append: a free that an allocation above ran (a
  // collected cycle) comes first.
  ok = reads != nullptr && order_after_host(at.builder, at.host_count, at.after_host, stream);
  PyObject* index = ok ? append_launch(at.ops, at.streams, stream, kernel, reads, writes, info) : nullptr;
  ok = index != nullptr;
  for (PyObject* held : {key, stream, cols, name, kernel, whole, writes, source, info, reads, index}) {
    Py_XDECREF(held);
  }
  return ok;
}

// The callback of a weak reference to a storage the fast path watches (`bound`: the recorder's weak
// reference and the storage's address), as `racefuzz.trace.storages._storage_freed`: the storage's free,
// if its recorder is still recording.
PyObject* storage_freed(PyObject* bound, PyObject* /*weakref*/) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* recorder = nullptr;
  if (PyWeakref_GetRef(PyTuple_GET_ITEM(bound, 0), &recorder) < 0) {
    return nullptr;
  }
  if (recorder == nullptr) {
    Py_RETURN_NONE;  // the recorder is gone
  }
#else
  PyObject* recorder = PyWeakref_GetObject(PyTuple_GET_ITEM(bound, 0));  // borrowed; None once it is gone
  if (recorder == nullptr) {
    return nullptr;
  }
  if (recorder == Py_None) {
    Py_RETURN_NONE;
  }
  Py_INCREF(recorder);
#endif
  PyObject* active = PyObject_GetAttr(recorder, names.active);
  int is_active = active == nullptr ? -1 : PyObject_IsTrue(active);
  Py_XDECREF(active);
  bool ok = is_active >= 0 && (is_active == 0 || on_free(recorder, PyTuple_GET_ITEM(bound, 1)));
  Py_DECREF(recorder);
  if (!ok) {
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef storage_freed_def = {"storage_freed", storage_freed, METH_O,
                                 "A watched storage died: its free, if its recorder is recording."};

// `StorageTable.watch(storage, ptr)` (`storage` a Python storage object, `ptr` its address): the storage is known
// at `ptr`, and with frees watched its death calls `storage_freed`. A storage the recorder knows at another
// address goes to `StorageTable.watch` itself (its old block's free). False with a Python exception.
bool watch(PyObject* state, PyObject* storage, PyObject* ptr) {
  PyObject* identity = PyLong_FromVoidPtr(storage);  // `id(storage)`
  if (identity == nullptr) {
    return false;
  }
  PyObject* address_of = PyTuple_GET_ITEM(state, ADDRESS_OF);
  PyObject* old = PyDict_GetItemWithError(address_of, identity);
  if (old != nullptr || PyErr_Occurred()) {
    int same = old == nullptr ? -1 : PyObject_RichCompareBool(old, ptr, Py_EQ);
    Py_DECREF(identity);
    if (same != 0) {
      return same == 1;
    }
    PyObject* none = PyObject_CallMethod(PyTuple_GET_ITEM(state, STORAGE_TABLE), "watch", "OO", storage, ptr);
    Py_XDECREF(none);
    return none != nullptr;
  }
  bool ok = PyDict_SetItem(address_of, identity, ptr) == 0;
  if (!ok || PyTuple_GET_ITEM(state, WATCH_FREES) != Py_True) {
    Py_DECREF(identity);
    return ok;
  }
  PyObject* watched = PyTuple_GET_ITEM(state, WATCHED);
  PyObject* previous = PyDict_GetItemWithError(watched, ptr);  // borrowed
  int another = previous == nullptr ? 0 : PyObject_RichCompareBool(PyTuple_GET_ITEM(previous, 1), identity, Py_NE);
  if (another == 1) {
    // Another storage known at this address moved without the recorder seeing it: forget where it was.
    PyObject* gone = pop(address_of, PyTuple_GET_ITEM(previous, 1));
    Py_XDECREF(gone);
  } else if (another == 0 && !PyErr_Occurred()) {
    another = PySet_Discard(PyTuple_GET_ITEM(state, RECORDED_STREAMS), ptr) < 0 ? -1 : 0;
  }
  PyObject* bound = another < 0 || PyErr_Occurred() ? nullptr : PyTuple_Pack(2, PyTuple_GET_ITEM(state, RECORDER_REF), ptr);
  PyObject* callback = bound == nullptr ? nullptr : PyCFunction_New(&storage_freed_def, bound);
  PyObject* reference = callback == nullptr ? nullptr : PyWeakref_NewRef(storage, callback);
  PyObject* entry = reference == nullptr ? nullptr : PyTuple_Pack(2, reference, identity);
  ok = entry != nullptr && PyDict_SetItem(watched, ptr, entry) == 0;
  for (PyObject* held : {identity, bound, callback, reference, entry}) {
    Py_XDECREF(held);
  }
  return ok;
}

// `Recorder.allocated(tensor)`: `tensor` (a fresh output) was allocated on `stream`, the op's; its free is
// a write on that stream, and with frees watched it is watched from now on. False with a Python exception.
bool allocated(PyObject* state, const at::Tensor& tensor, PyObject* stream) {
  const c10::Storage& storage = tensor.storage();
  void* data = storage.mutable_data();  // as Python's `untyped_storage().data_ptr()`
  if (data == nullptr) {
    return true;
  }
  PyObject* ptr = PyLong_FromVoidPtr(data);
  // A pinned host block's free is no write on a stream (see `Recorder.allocated`).
  const bool on_stream = PyTuple_GET_ITEM(state, ON_GPU) != Py_True || tensor.is_cuda();
  bool ok = ptr != nullptr && (!on_stream || PyDict_SetItem(PyTuple_GET_ITEM(state, ALLOC_STREAM), ptr, stream) == 0) &&
            PySet_Discard(PyTuple_GET_ITEM(state, RECORDED_STREAMS), ptr) >= 0;
  if (ok && PyTuple_GET_ITEM(state, WATCH_FREES) == Py_True) {
    PyObject* python_storage = THPStorage_Wrap(storage);
    ok = python_storage != nullptr && watch(state, python_storage, ptr);
    Py_XDECREF(python_storage);
  }
  Py_XDECREF(ptr);
  return ok;
}

// `StorageTable.key(tensor, label)` for a storage the recorder has no key for in its current epoch: a new
// key (a new reference) and its buffer (`ProgramBuilder.new_buffer`: named as the step named it, else
// `tmp<key> (<label>)`), the
// storage kept alive (frees not watched) or watched. nullptr with a Python exception.
PyObject* new_key(PyObject* state, const at::Tensor& tensor, PyObject* label) {
  const c10::Storage& storage = tensor.storage();
  void* data = storage.mutable_data();
  PyObject* ptr = PyLong_FromVoidPtr(data);
  PyObject* epoch = ptr == nullptr ? nullptr : get_or_zero(PyTuple_GET_ITEM(state, EPOCHS), ptr);
  PyObject* pair = epoch == nullptr ? nullptr : PyTuple_Pack(2, ptr, epoch);
  Py_XDECREF(epoch);
  PyObject* keys = PyTuple_GET_ITEM(state, KEYS);
  PyObject* key = pair == nullptr ? nullptr : PyLong_FromSsize_t(PyList_GET_SIZE(PyTuple_GET_ITEM(state, BUFFERS)));
  bool ok = key != nullptr && PyDict_SetItem(keys, pair, key) == 0;
  Py_XDECREF(pair);
  PyObject* given = ok ? PyDict_GetItemWithError(PyTuple_GET_ITEM(state, GIVEN_NAMES), ptr) : nullptr;  // borrowed
  int named = given == nullptr ? (ok && !PyErr_Occurred() ? 0 : -1) : PyObject_IsTrue(given);
  PyObject* name = nullptr;
  if (named == 1) {
    name = given;
    Py_INCREF(name);
  } else if (named == 0) {
    name = PyUnicode_FromFormat("tmp%S (%S)", key, label);
  }
  PyObject* record = nullptr;
  if (name != nullptr) {
    const int64_t itemsize = static_cast<int64_t>(tensor.itemsize());
    const int64_t row_bytes = tensor.dim() == 2 ? tensor.stride(0) * itemsize : 0;
    // The stream `allocated` gave it (a fresh output: just before its first access), else "" (`Allocation`).
    PyObject* stream = PyDict_GetItemWithError(PyTuple_GET_ITEM(state, ALLOC_STREAM), ptr);  // borrowed
    PyObject* allocated_on = stream != nullptr ? stream : (PyErr_Occurred() ? nullptr : PyUnicode_FromString(""));
    if (stream != nullptr) {
      Py_INCREF(allocated_on);
    }
    PyObject* nbytes = allocated_on == nullptr ? nullptr : PyLong_FromLongLong(static_cast<long long>(storage.nbytes()));
    PyObject* size = nbytes == nullptr ? nullptr : PyLong_FromLongLong(static_cast<long long>(itemsize));
    PyObject* row = size == nullptr ? nullptr : PyLong_FromLongLong(static_cast<long long>(row_bytes));
    if (row != nullptr) {
      // `builder.new_buffer(name, nbytes, itemsize, row_bytes, allocated_on)`, the name interned.
      PyObject* call[] = {PyTuple_GET_ITEM(state, BUILDER), name, nbytes, size, row, allocated_on};
      record = PyObject_VectorcallMethod(names.new_buffer, call, 6, nullptr);
    }
    for (PyObject* held : {allocated_on, nbytes, size, row}) {
      Py_XDECREF(held);
    }
  }
  ok = record != nullptr;
  PyObject* python_storage = ok ? THPStorage_Wrap(storage) : nullptr;
  ok = python_storage != nullptr;
  if (ok && PyTuple_GET_ITEM(state, WATCH_FREES) != Py_True) {
    ok = PyList_Append(PyTuple_GET_ITEM(state, KEEP), python_storage) == 0;  // its address not reused in the run
  }
  if (ok && data != nullptr) {
    ok = watch(state, python_storage, ptr);
  }
  for (PyObject* held : {ptr, name, record, python_storage}) {
    Py_XDECREF(held);
  }
  if (!ok) {
    Py_XDECREF(key);
    return nullptr;
  }
  return key;
}

// `Recorder._access` of one tensor (a new reference to a tuple of `CellRange`), or nullptr with an exception.
PyObject* access(PyObject* state, PyObject* tensor, PyObject* label) {
  PyObject* recorder = PyTuple_GET_ITEM(state, RECORDER);
  int64_t start = 0, nbytes = 0;
  uintptr_t base = 0;
  if (!contiguous_extent(THPVariable_Unpack(tensor), start, nbytes, base)) {
    PyObject* one = PyList_New(1);
    if (one == nullptr) {
      return nullptr;
    }
    Py_INCREF(tensor);
    PyList_SET_ITEM(one, 0, tensor);
    PyObject* result = PyObject_CallMethod(recorder, "merged_accesses", "OO", one, label);
    Py_DECREF(one);
    return result;
  }
  if (!nbytes) {
    return PyTuple_New(0);
  }
  PyObject* key = known_key(state, base);
  if (key != nullptr) {
    Py_INCREF(key);
  } else if (PyErr_Occurred()) {
    return nullptr;
  } else {
    key = new_key(state, THPVariable_Unpack(tensor), label);
    if (key == nullptr) {
      return nullptr;
    }
  }
  PyObject* item = cell_range(PyTuple_GET_ITEM(state, BUFFERS), key, static_cast<long long>(start),
                              static_cast<long long>(start + nbytes));
  Py_DECREF(key);
  if (item == nullptr) {
    return nullptr;
  }
  PyObject* result = untracked(PyTuple_Pack(1, item));
  Py_DECREF(item);
  return result;
}

// `Recorder.merged_accesses` of several non-empty contiguous tensors on storages it knows already (an op's
// inputs, the common case): their byte intervals merged per storage, storages in first-seen order, as cell
// ranges of their buffers, as it does. nullptr without an exception where the recorder must do it itself (a strided or empty view, a
// storage new to it); nullptr with one on an error.
PyObject* known_merged_accesses(PyObject* state, PyObject* tensors) {
  struct Part {
    PyObject* key;  // borrowed from the storage table's `keys`
    long long start, end;
  };
  std::vector<Part> parts;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(tensors); ++k) {
    int64_t start = 0, nbytes = 0;
    uintptr_t base = 0;
    if (!contiguous_extent(THPVariable_Unpack(PyList_GET_ITEM(tensors, k)), start, nbytes, base) || !nbytes) {
      return nullptr;
    }
    PyObject* key = known_key(state, base);  // nullptr: unknown (the recorder's), or an error
    if (key == nullptr) {
      return nullptr;
    }
    parts.push_back(Part{key, static_cast<long long>(start), static_cast<long long>(start + nbytes)});
  }
  std::vector<std::pair<PyObject*, std::vector<std::pair<long long, long long>>>> by_storage;
  for (const Part& part : parts) {
    auto same = std::find_if(by_storage.begin(), by_storage.end(), [&](const auto& entry) {
      return PyObject_RichCompareBool(entry.first, part.key, Py_EQ) == 1;
    });
    if (same == by_storage.end()) {
      by_storage.push_back({part.key, {}});
      same = by_storage.end() - 1;
    }
    same->second.emplace_back(part.start, part.end);
  }
  std::vector<PyObject*> ranges;  // new references, per storage in first-seen order, each's sorted
  auto release = [&ranges]() {
    for (PyObject* range : ranges) {
      Py_DECREF(range);
    }
  };
  for (size_t k = 0; k < by_storage.size(); ++k) {
    auto& intervals = by_storage[k].second;
    std::sort(intervals.begin(), intervals.end());
    std::vector<std::pair<long long, long long>> merged;  // `intervals.merge`: overlapping or touching
    for (const auto& interval : intervals) {
      if (!merged.empty() && interval.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, interval.second);
      } else {
        merged.push_back(interval);
      }
    }
    for (const auto& run : merged) {
      PyObject* item = cell_range(PyTuple_GET_ITEM(state, BUFFERS), by_storage[k].first, run.first, run.second);
      if (item == nullptr) {
        release();
        return nullptr;
      }
      ranges.push_back(item);
    }
  }
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(ranges.size()));
  if (result == nullptr) {
    release();
    return nullptr;
  }
  for (size_t k = 0; k < ranges.size(); ++k) {
    PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(k), ranges[k]);  // steals
  }
  return untracked(result);
}

// `Recorder._accesses`: one tensor here; several here when `known_merged_accesses` can, else through the
// recorder (it merges them per storage).
PyObject* accesses(PyObject* state, PyObject* tensors, PyObject* label) {
  Py_ssize_t count = PyList_GET_SIZE(tensors);
  if (count == 0) {
    return PyTuple_New(0);
  }
  if (count == 1) {
    return access(state, PyList_GET_ITEM(tensors, 0), label);
  }
  PyObject* known = known_merged_accesses(state, tensors);
  if (known != nullptr || PyErr_Occurred()) {
    return known;
  }
  return PyObject_CallMethod(PyTuple_GET_ITEM(state, RECORDER), "merged_accesses", "OO", tensors, label);
}

bool off_device(PyObject* state, PyObject* tensor) {
  return PyTuple_GET_ITEM(state, ON_GPU) == Py_True && !THPVariable_Unpack(tensor).is_cuda();
}

// One op's recording between its collection and its trace op: the tensors it reads and writes, then the
// stream and source line of its launch. Owns its references; released under the GIL.
struct Pending {
  PyObject* reads = nullptr;
  PyObject* writes = nullptr;   // (slot, tensor) pairs, as `_after` takes them
  PyObject* written = nullptr;  // the tensors alone
  PyObject* stream = nullptr;
  PyObject* source = nullptr;

  bool init() {
    reads = PyList_New(0);
    writes = PyList_New(0);
    written = PyList_New(0);
    return reads != nullptr && writes != nullptr && written != nullptr;
  }
  void clear() {
    Py_CLEAR(reads);
    Py_CLEAR(writes);
    Py_CLEAR(written);
    Py_CLEAR(stream);
    Py_CLEAR(source);
  }
};

enum class Collected { OK, BAIL, ERROR };

// `_schema_accesses` of one argument: `value` (a borrowed Python object) appended to `pending`'s reads or
// writes. BAIL (no side effect) for a tensor list or a tensor off the GPU in a GPU run.
Collected collect(PyObject* state, Pending& pending, PyObject* name, bool is_written, PyObject* value) {
  if (THPVariable_Check(value)) {
    if (off_device(state, value)) {
      return Collected::BAIL;
    }
    int appended;
    if (is_written) {
      PyObject* pair = PyTuple_Pack(2, name, value);
      appended = pair == nullptr ? -1 : PyList_Append(pending.writes, pair);
      Py_XDECREF(pair);
      appended = appended < 0 ? -1 : PyList_Append(pending.written, value);
    } else {
      appended = PyList_Append(pending.reads, value);
    }
    return appended < 0 ? Collected::ERROR : Collected::OK;
  }
  if (PyList_Check(value) || PyTuple_Check(value)) {
    return Collected::BAIL;  // tensor lists: the Python path's `_tensors`
  }
  return Collected::OK;
}

// Before the launch of an op that writes: its stream and source line, then the planned delay. BAIL (no side
// effect) for a stream not seen yet; ERROR with a Python exception.
Collected begin(PyObject* state, Pending& pending) {
  pending.stream = current_stream(state);
  if (pending.stream == nullptr) {
    return Collected::BAIL;
  }
  pending.source = user_source(PyEval_GetFrame());
  if (pending.source == nullptr) {
    return Collected::ERROR;
  }
  if (PyDict_GET_SIZE(PyTuple_GET_ITEM(state, DELAYS)) != 0) {
    PyObject* none = PyObject_CallMethod(PyTuple_GET_ITEM(state, RECORDER), "delay", "O", pending.stream);
    if (none == nullptr) {
      return Collected::ERROR;
    }
    Py_DECREF(none);
  }
  return Collected::OK;
}

// After the launch: its accesses, the `Launch` of kind `kind` (default "torch") appended as
// `ProgramBuilder.launch` appends it (a host-order wait first if one is due), the snapshots
// (`recorder.after_launch`). False with a Python exception.
bool finish(PyObject* state, Pending& pending, PyObject* label, PyObject* kind = nullptr) {
  PyObject* write_access = accesses(state, pending.written, label);
  if (write_access == nullptr) {
    return false;
  }
  PyObject* read_access = accesses(state, pending.reads, label);
  if (read_access == nullptr) {
    Py_DECREF(write_access);
    return false;
  }
  PyObject* builder = PyTuple_GET_ITEM(state, BUILDER);
  PyObject* launch_ops = PyTuple_GET_ITEM(state, LAUNCH_OPS);
  Py_ssize_t ordinal = PyList_GET_SIZE(launch_ops);
  const bool torch_kind = kind == nullptr || kind == constant(KIND_TORCH);
  PyObject* info = launch_info(builder, torch_kind ? PyTuple_GET_ITEM(state, TORCH_INFOS) : nullptr,
                               torch_kind ? constant(KIND_TORCH) : kind, pending.source);
  // The index after the accesses: a new storage seen there may have recorded a free first (`StorageTable.watch`).
  PyObject* index = info == nullptr || !order_after_host(builder, PyTuple_GET_ITEM(state, HOST_COUNT),
                                                         PyTuple_GET_ITEM(state, AFTER_HOST), pending.stream)
                        ? nullptr
                        : append_launch(PyTuple_GET_ITEM(state, OPS), PyTuple_GET_ITEM(state, STREAMS),
                                        pending.stream, label, read_access, write_access, info);
  Py_DECREF(read_access);
  Py_DECREF(write_access);
  Py_XDECREF(info);
  bool appended = index != nullptr && PyList_Append(launch_ops, index) == 0;
  Py_XDECREF(index);
  if (!appended) {
    return false;
  }
  if (PyTuple_GET_ITEM(state, SNAPSHOTS_OR_SYNCS) == Py_True) {
    PyObject* none = PyObject_CallMethod(PyTuple_GET_ITEM(state, RECORDER), "after_launch", "nO", ordinal, pending.writes);
    if (none == nullptr) {
      return false;
    }
    Py_DECREF(none);
  }
  return true;
}

bool valid_state(PyObject* state) {
  return PyTuple_CheckExact(state) && PyTuple_GET_SIZE(state) == STATE_SIZE;
}

// Whether `configure` has run (else a Python exception).
bool configured() {
  if (constants == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "the fast path is used before configure(helper, set_eval_frame, constants)");
  }
  return constants != nullptr;
}

// The dispatch mode's entry: see the contract at the top.
PyObject* launch_op_impl(PyObject* const* argv, Py_ssize_t nargs) {
  if (!configured()) {
    return nullptr;
  }
  if (nargs != 6 || !valid_state(argv[0]) || !PyTuple_Check(argv[1]) || !PyTuple_Check(argv[4]) ||
      !PyDict_Check(argv[5])) {
    PyErr_SetString(PyExc_TypeError, "launch_op(state, arguments, label, func, args, kwargs)");
    return nullptr;
  }
  PyObject* state = argv[0];
  PyObject* arguments = argv[1];
  PyObject* label = argv[2];
  PyObject* func = argv[3];
  PyObject* args = argv[4];
  PyObject* kwargs = argv[5];
  PyObject* bail = PyTuple_GET_ITEM(state, BAIL);
  Pending pending;
  if (!pending.init()) {
    pending.clear();
    return nullptr;
  }
  Collected collected = Collected::OK;
  Py_ssize_t count = PyTuple_GET_SIZE(args);
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(arguments) && collected == Collected::OK; ++k) {
    PyObject* spec = PyTuple_GET_ITEM(arguments, k);
    Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 0));
    PyObject* name = PyTuple_GET_ITEM(spec, 1);
    PyObject* value;
    if (PyTuple_GET_ITEM(spec, 2) == Py_True || position >= count) {
      value = PyDict_GetItem(kwargs, name);
      if (value == nullptr) {
        continue;
      }
    } else {
      value = PyTuple_GET_ITEM(args, position);
    }
    collected = collect(state, pending, name, PyTuple_GET_ITEM(spec, 3) == Py_True, value);
  }
  PyObject* result = nullptr;
  if (collected == Collected::OK && PyList_GET_SIZE(pending.writes) == 0) {
    result = PyObject_Call(func, args, kwargs);  // a view or metadata op: not a launch
  } else if (collected == Collected::OK) {
    collected = begin(state, pending);
    if (collected == Collected::OK) {
      result = PyObject_Call(func, args, kwargs);
      if (result != nullptr && !finish(state, pending, label)) {
        Py_CLEAR(result);
      }
    }
  }
  if (collected == Collected::BAIL) {
    Py_INCREF(bail);
    result = bail;
  }
  pending.clear();
  return result;
}

// `launch_op_impl` behind a C++ exception barrier: a c10 or Python error thrown from torch's C++ (none is
// expected on these paths) becomes a Python exception instead of terminating the process.
PyObject* launch_op(PyObject* /*module*/, PyObject* const* argv, Py_ssize_t nargs) {
  try {
    return launch_op_impl(argv, nargs);
  } catch (python_error& error) {
    error.restore();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

// ---- The dispatcher entry -------------------------------------------------------------------------------
//
// A torch dispatch mode costs every op a round trip through Python (the op's arguments boxed into Python
// objects, `__torch_dispatch__`, the op called again from Python, its result unboxed): 7-9 us an op, more
// than everything else the recorder does. So while a recording is on, an op that writes only its arguments,
// or one that returns fresh tensors from tensor inputs (`c = a + b`: not a factory, whose device the mode
// checks; not an op that syncs the host, only allocates, or returns a list), is recorded before it reaches
// the mode: by a boxed fallback on a dispatch key that `begin()` adds to the
// recording thread's included keys, above autograd and every key but torch's PreDispatch and
// PythonDispatcher. It records the op as `launch_op` does and runs it below the Python keys, so the mode
// never sees it; every other op (and every op the checks below turn away) goes on to the mode exactly as
// without it. So are a copy between two tensors of the recording's device (`copy_`, `_to_copy`: no host
// sync), an allocation (`empty`, `empty_like`: no launch, the storage's stream noted as `Recorder.allocated`
// does) and `lift_fresh` (`torch.tensor`'s copy to the device, as `TraceMode._lifted` records it); and the
// ops a CompositeImplicitAutograd op (`matmul`) decomposes into, each routed on its own. torch has no
// dispatch key for out-of-tree tools above
// autograd: racefuzz borrows `TESTING_ONLY_GenericMode`, which torch itself registers nothing on (its
// only use is torch's own C++ tests) and which is included on the recording thread only while recording.
//
// Taken only when (checked under the GIL, per op): the innermost recording begun on this thread began with its mode the
// only one on torch's mode stack and that mode still is the only one there (no mode of the step's own, pushed or
// swapped in; no outer mode or outer recording: each must see the op, or see it alone), the op would reach the mode
// (torch has not excluded the mode's key, as it does inside `torch.tensor` and under `_DisableTorchDispatch`), autocast
// is off (its kernels cast the inputs, and the mode sees the casts), no functorch transform is on (it wraps outputs
// above the mode, a factory's too), the recorder is neither paused nor inside an opaque launch, the op is aten's
// (another library's op may have kernels above the mode's key that issue ops of their own) and not
// CompositeImplicitAutograd (the mode sees such an op's decomposition, which the fallback then leaves to it), the
// Python helper set by `configure` says the op is one the fast path records (`_OpInfo.fast`, or fresh outputs:
// `_dispatcher_op_info`), and each tensor argument is a plain strided tensor on the recording's device: no tensor with
// the Python key (a `__torch_dispatch__` subclass), no functorch wrapper or tensor list, no conjugate, negative or zero
// tensor, none autograd works on (requiring grad in grad mode, or with a forward-mode tangent), no inference tensor
// outside inference mode. Those keep torch from issuing ops of its own above the mode's key (autograd's saved `clone`,
// a saved-tensors hook's ops, the conjugate fallback's copies) or raising there after the kernel ran, which the mode
// records. The op then runs with the mode's keys excluded for it and everything it calls (as the mode's own
// `__torch_dispatch__` runs it).

constexpr c10::DispatchKey kTraceKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

c10::DispatchKeySet quiet_keys() {
  // The fallback's own key and the mode's: what an op the fallback records, and the recorder's own Python
  // helpers it calls, run without.
  return c10::DispatchKeySet({kTraceKey, c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot});
}

c10::DispatchKeySet wrapper_keys() {
  // A tensor with any of these is not a plain tensor: its op is left to the mode. Conjugate, negative and
  // zero tensors among them: torch's fallbacks for those keys (above the mode's) issue ops of their own
  // (a `clone`, a `copy_` back), which the mode records.
  return c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                              c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                              c10::DispatchKey::Batched, c10::DispatchKey::BatchedNestedTensor,
                              c10::DispatchKey::Functionalize, c10::DispatchKey::Conjugate,
                              c10::DispatchKey::Negative, c10::DispatchKey::ZeroTensor});
}

c10::DispatchKeySet transform_keys() {
  // Included by functorch while one of its transforms (`vmap`, `grad`, `jacrev`, `functionalize`) runs.
  return c10::DispatchKeySet({c10::DispatchKey::FuncTorchDynamicLayerFrontMode,
                              c10::DispatchKey::FuncTorchDynamicLayerBackMode, c10::DispatchKey::Functionalize,
                              c10::DispatchKey::FuncTorchVmapMode, c10::DispatchKey::VmapMode});
}

struct Scope {
  PyObject* state;  // a reference held from `begin` to `end`
  unsigned long thread;
  // The recording's mode on torch's stack (held: no other mode can take its address), if it was the only
  // mode there when the recording began; else null.
  std::shared_ptr<c10::impl::PyObject_TorchDispatchMode> sole_mode;
  bool was_included;  // the key's state on that thread before
};

std::vector<Scope> scopes;  // guarded by the GIL; a thread's innermost recording is its last

// The innermost recording begun on this thread, or nullptr.
const Scope* innermost() {
  const unsigned long thread = PyThread_get_thread_ident();
  for (auto scope = scopes.rbegin(); scope != scopes.rend(); ++scope) {
    if (scope->thread == thread) {
      return &*scope;
    }
  }
  return nullptr;
}

// Whether autograd would issue ops of its own for an op on `tensor` before the mode sees it (a `clone` it
// saves for backward, a saved-tensors hook's ops, forward-mode AD's tangent ops): the mode records those.
bool autograd_works_on(const at::Tensor& tensor) {
  return (c10::GradMode::is_enabled() && tensor.requires_grad()) || tensor._fw_grad(/*level=*/0).defined();
}

// Whether ADInplaceOrView raises after an op on `tensor` has run (an inference tensor written outside
// inference mode): the mode, below that key, records the op first.
bool rejected_after_the_kernel(const at::Tensor& tensor) {
  return tensor.is_inference() && !c10::InferenceMode::is_enabled();
}
PyObject* op_info_helper = nullptr;
PyObject* set_eval_frame = nullptr;  // `torch._C._dynamo.eval_frame.set_eval_frame`

// Dynamo's frame callback off for the scope (under the GIL), as the dispatch mode keeps it off in its own
// frames: the recorder's Python helpers this entry calls must not be traced by a `torch.compile` whose
// compiled code issued the op. `failed` with a Python exception if it could not be turned off.
struct NoDynamo {
  PyObject* prior = set_eval_frame == nullptr ? nullptr : PyObject_CallOneArg(set_eval_frame, Py_None);
  bool failed = set_eval_frame != nullptr && prior == nullptr;
  ~NoDynamo() {
    if (prior != nullptr) {
      // The error the scope ends with (a helper's, raised next) is kept across the call.
      PyObject *type, *value, *traceback;
      PyErr_Fetch(&type, &value, &traceback);
      PyObject* none = PyObject_CallOneArg(set_eval_frame, prior);
      if (none == nullptr) {
        PyErr_WriteUnraisable(set_eval_frame);  // a destructor cannot raise; never seen
      }
      Py_XDECREF(none);
      Py_DECREF(prior);
      PyErr_Restore(type, value, traceback);
    }
  }
};

struct KnownOp {
  c10::OperatorName name;
  PyObject* info;  // (arguments, label, fresh) or None: a reference held for the process
};
std::unordered_map<const c10::FunctionSchema*, KnownOp> known_ops;  // guarded by the GIL

// The fast-path info of `op` (borrowed: (arguments, label, fresh), or None for an op the fallback leaves to
// the mode), cached per op; nullptr with a Python exception.
PyObject* op_info(const c10::OperatorHandle& op) {
  if (!op.hasSchema()) {
    return Py_None;
  }
  const c10::FunctionSchema* key = &op.schema();
  auto found = known_ops.find(key);
  if (found != known_ops.end() && found->second.name == op.operator_name()) {
    return found->second.info;
  }
  PyObject* info;
  // Only aten's ops: another library's op may have kernels above the mode's key (Autograd,
  // ADInplaceOrView) that issue ops of their own, which the mode records.
  const bool aten = op.operator_name().name.rfind("aten::", 0) == 0;
  if (op_info_helper == nullptr || !aten || op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    info = Py_None;
    Py_INCREF(info);
  } else {
    const c10::OperatorName& name = op.operator_name();
    info = PyObject_CallFunction(op_info_helper, "ss", name.name.c_str(), name.overload_name.c_str());
    if (info == nullptr) {
      return nullptr;
    }
  }
  if (found != known_ops.end()) {
    Py_DECREF(found->second.info);  // another op now at that schema's address
    known_ops.erase(found);
  }
  known_ops.emplace(key, KnownOp{op.operator_name(), info});
  return info;
}

// The GIL, held for the scope (re-entrant: the dispatcher is reached with or without it).
struct Gil {
  PyGILState_STATE state = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(state); }
};

[[noreturn]] void raise_python_error() {
  python_error error;
  error.persist();
  throw error;
}

enum class Route { MODE, UNRECORDED, RECORDED, ALLOCATED, LIFTED };

// Under the GIL, the fallback's keys excluded: which way `op` goes; for RECORDED, `pending` collected and
// begun (the delay applied); for ALLOCATED (an allocation, no launch) and LIFTED (`torch.tensor`'s copy, no
// delay point: `Recorder.launch`'s kind "copy"), collected with its stream (LIFTED: and source line).
// Throws the Python error a helper raised.
Route route(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack, Pending& pending,
            PyObject*& state, PyObject*& label, bool& fresh) {
  const Scope* scope = innermost();
  if (scope == nullptr || scope->sole_mode == nullptr || c10::impl::TorchDispatchModeTLS::stack_len() != 1 ||
      c10::impl::TorchDispatchModeTLS::get_stack_at(0) != scope->sole_mode) {
    return Route::MODE;  // another mode (the step's own, an outer recording's) must see the op, or only it
  }
  if (!keys.has(c10::DispatchKey::Python)) {
    return Route::MODE;  // torch excluded the mode's key here (inside `torch.tensor`, `_DisableTorchDispatch`)
  }
  if (keys.has_any(c10::autocast_dispatch_keyset)) {
    return Route::MODE;  // autocast is on: its kernels, above the mode's key, cast inputs the mode then sees
  }
  if (keys.has_any(transform_keys())) {
    // A functorch transform is on: it wraps the op's outputs (a factory's too, which has no wrapped
    // argument to tell) after the op returns, above the mode's key; the mode sees the plain inner tensors.
    return Route::MODE;
  }
  state = scope->state;
  PyObject* recorder = PyTuple_GET_ITEM(state, RECORDER);
  for (const char* busy : {"paused", "opaque"}) {
    PyObject* value = PyObject_GetAttrString(recorder, busy);
    if (value == nullptr) {
      raise_python_error();
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (truth != 0) {
      if (truth < 0) {
        raise_python_error();
      }
      return Route::MODE;
    }
  }
  NoDynamo no_dynamo;
  if (no_dynamo.failed) {
    raise_python_error();
  }
  PyObject* info = op_info(op);
  if (info == nullptr) {
    raise_python_error();
  }
  if (info == Py_None) {
    return Route::MODE;
  }
  PyObject* arguments = PyTuple_GET_ITEM(info, 0);
  label = PyTuple_GET_ITEM(info, 1);
  const long kind = PyLong_AsLong(PyTuple_GET_ITEM(info, 2));
  fresh = kind == FRESH;
  const size_t count = op.schema().arguments().size();
  if (stack->size() < count) {
    return Route::MODE;
  }
  const size_t base = stack->size() - count;
  const bool on_gpu = PyTuple_GET_ITEM(state, ON_GPU) == Py_True;
  if (!pending.init()) {
    raise_python_error();
  }
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(arguments); ++k) {
    PyObject* spec = PyTuple_GET_ITEM(arguments, k);
    const c10::IValue& value = (*stack)[base + PyLong_AsSize_t(PyTuple_GET_ITEM(spec, 0))];
    if (value.isNone()) {
      continue;
    }
    if (!value.isTensor()) {
      return Route::MODE;  // a tensor list (or an `Any` holding something else)
    }
    const at::Tensor& tensor = value.toTensor();
    if (!tensor.defined() || tensor.unsafeGetTensorImpl()->is_wrapped_number()) {
      continue;  // a Python number the binding wrapped (`x.add_(1)`): the mode is handed the number itself
    }
    if (tensor.layout() != c10::kStrided || tensor.key_set().has_any(wrapper_keys()) ||
        (on_gpu ? !tensor.is_cuda() : !tensor.is_cpu()) || autograd_works_on(tensor) ||
        rejected_after_the_kernel(tensor)) {
      return Route::MODE;
    }
    PyObject* wrapped = THPVariable_Wrap(tensor);
    if (wrapped == nullptr) {
      raise_python_error();
    }
    Collected collected =
        collect(state, pending, PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 3) == Py_True, wrapped);
    Py_DECREF(wrapped);
    if (collected != Collected::OK) {
      if (collected == Collected::ERROR) {
        raise_python_error();
      }
      return Route::MODE;
    }
  }
  const c10::FunctionSchema& schema = op.schema();
  const std::optional<int> device_at = schema.argumentIndexWithName("device");
  const c10::IValue* device = device_at ? &(*stack)[base + *device_at] : nullptr;
  const bool placed = device != nullptr && device->isDevice();
  const bool factory =
      (fresh || kind == ALLOCATES) && PyList_GET_SIZE(pending.reads) == 0 && PyList_GET_SIZE(pending.writes) == 0;
  if (factory) {
    // A factory (`zeros`, `arange`, `empty`): as the mode decides, in a GPU run a launch (an allocation) iff
    // its `device` argument is a CUDA device, else not recorded; in a CPU run a launch. A factory on another
    // device (meta) or of another layout is left to the mode.
    const std::optional<int> layout_at = schema.argumentIndexWithName("layout");
    const c10::IValue* layout = layout_at ? &(*stack)[base + *layout_at] : nullptr;
    if (layout != nullptr && !layout->isNone() && layout->toLayout() != c10::kStrided) {
      return Route::MODE;
    }
    if (on_gpu && !(placed && device->toDevice().is_cuda())) {
      return Route::UNRECORDED;
    }
    if (!on_gpu && placed && !device->toDevice().is_cpu()) {
      return Route::MODE;
    }
  } else if (placed && (on_gpu ? !device->toDevice().is_cuda() : !device->toDevice().is_cpu())) {
    // Its output placed on another kind of device (`x.to("cpu")` in a GPU run: a copy to the host, which
    // syncs it, `_syncs_in_copy`; `zeros_like(x, device=...)`): the mode's.
    return Route::MODE;
  }
  if (kind == LIFTED) {
    // `TraceMode._lifted`: in a CPU run only inside a `torch.tensor(data, device=...)` (`lifting_to_device`);
    // no launch for an empty tensor or one on a storage the recorder knows (no copy was made).
    if (!on_gpu) {
      PyObject* lifting = PyObject_GetAttrString(PyTuple_GET_ITEM(state, RECORDER), "lifting_to_device");
      int truth = lifting == nullptr ? -1 : PyObject_IsTrue(lifting);
      Py_XDECREF(lifting);
      if (truth < 0) {
        raise_python_error();
      }
      if (truth == 0) {
        return Route::UNRECORDED;
      }
    }
    if (PyList_GET_SIZE(pending.reads) != 1) {
      return Route::MODE;
    }
    const at::Tensor& lifted = THPVariable_Unpack(PyList_GET_ITEM(pending.reads, 0));
    if (lifted.numel() == 0) {
      return Route::UNRECORDED;
    }
    const uintptr_t base_address = reinterpret_cast<uintptr_t>(lifted.data_ptr()) -
                                   static_cast<uintptr_t>(lifted.storage_offset() * lifted.itemsize());
    if (known_key(state, base_address) != nullptr) {
      return Route::UNRECORDED;  // `Recorder.knows`
    }
    if (PyErr_Occurred()) {
      raise_python_error();
    }
  }
  if (kind == ALLOCATES || kind == LIFTED) {
    pending.stream = current_stream(state);
    if (pending.stream == nullptr) {
      return Route::MODE;  // a stream not seen yet: the mode's (which teaches the recorder)
    }
    if (kind == ALLOCATES) {
      return Route::ALLOCATED;
    }
    pending.source = user_source(PyEval_GetFrame());
    if (pending.source == nullptr) {
      raise_python_error();
    }
    return Route::LIFTED;
  }
  if (!fresh && PyList_GET_SIZE(pending.writes) == 0) {
    return Route::UNRECORDED;  // a view or metadata op: not a launch (nor anything the mode records)
  }
  Collected begun = begin(state, pending);
  if (begun == Collected::ERROR) {
    raise_python_error();
  }
  return begun == Collected::OK ? Route::RECORDED : Route::MODE;
}

// The fresh tensors `op` returned (on `stack` now), as the Python path's `fresh(out)` takes them: each on the
// recording's device (or pinned) and not on the storage of one of the op's reads (a view the schema does
// not declare) is allocated (`allocated`) and written, as slot `out<i>` (`i` counting the
// returned tensors). False with a Python exception.
bool add_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack, PyObject* state, Pending& pending) {
  const bool on_gpu = PyTuple_GET_ITEM(state, ON_GPU) == Py_True;
  // The addresses as Python's `untyped_storage().data_ptr()` gives them (a copy-on-write storage takes its
  // own copy first, as there).
  std::vector<const void*> inputs;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(pending.reads); ++k) {
    inputs.push_back(THPVariable_Unpack(PyList_GET_ITEM(pending.reads, k)).storage().mutable_data());
  }
  const size_t returned = op.schema().returns().size();
  Py_ssize_t ordinal = 0;
  for (size_t r = stack.size() - returned; r < stack.size(); ++r) {
    if (!stack[r].isTensor() || !stack[r].toTensor().defined()) {
      continue;
    }
    const at::Tensor& tensor = stack[r].toTensor();
    const Py_ssize_t slot = ordinal++;
    if ((on_gpu && !tensor.is_cuda() && !tensor.is_pinned()) ||
        std::find(inputs.begin(), inputs.end(), tensor.storage().mutable_data()) != inputs.end()) {
      continue;
    }
    PyObject* wrapped = THPVariable_Wrap(tensor);
    if (wrapped == nullptr) {
      return false;
    }
    PyObject* name = allocated(state, tensor, pending.stream) ? PyUnicode_FromFormat("out%zd", slot) : nullptr;
    PyObject* pair = name == nullptr ? nullptr : PyTuple_Pack(2, name, wrapped);
    bool appended = pair != nullptr && PyList_Append(pending.writes, pair) == 0 &&
                    PyList_Append(pending.written, wrapped) == 0;
    Py_XDECREF(name);
    Py_XDECREF(pair);
    Py_DECREF(wrapped);
    if (!appended) {
      return false;
    }
  }
  return true;
}

// An allocation op (`empty`, `empty_like`) has run: each returned tensor on the recording's device and not on
// the storage of one of its tensor arguments is allocated on the op's stream (`Recorder.allocated`), as the
// mode's `_record` does; no launch. False with a Python exception.
bool allocations(const c10::OperatorHandle& op, const torch::jit::Stack& stack, PyObject* state, Pending& pending) {
  const bool on_gpu = PyTuple_GET_ITEM(state, ON_GPU) == Py_True;
  std::vector<const void*> inputs;
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(pending.reads); ++k) {
    inputs.push_back(THPVariable_Unpack(PyList_GET_ITEM(pending.reads, k)).storage().mutable_data());
  }
  const size_t returned = op.schema().returns().size();
  for (size_t r = stack.size() - returned; r < stack.size(); ++r) {
    if (!stack[r].isTensor() || !stack[r].toTensor().defined()) {
      continue;
    }
    const at::Tensor& tensor = stack[r].toTensor();
    if ((on_gpu && !tensor.is_cuda()) ||
        std::find(inputs.begin(), inputs.end(), tensor.storage().mutable_data()) != inputs.end()) {
      continue;
    }
    if (!allocated(state, tensor, pending.stream)) {
      return false;
    }
  }
  return true;
}

// `lift_fresh` has run (`TraceMode._lifted`): its tensor, a copy `torch.tensor(data, device=...)` made from the
// host, allocated on the stream (`Recorder.allocated`) and written by a launch of kind "copy" with no reads,
// then the host's sync of that stream (`Recorder.launch`'s `host_sync` "after"). False with a Python exception.
bool lifted_copy(const torch::jit::Stack& stack, PyObject* state, Pending& pending, PyObject* label) {
  if (stack.empty() || !stack.back().isTensor()) {
    PyErr_SetString(PyExc_RuntimeError, "lift_fresh returned no tensor");
    return false;
  }
  const at::Tensor& out = stack.back().toTensor();
  PyObject* wrapped = THPVariable_Wrap(out);
  if (wrapped == nullptr || !allocated(state, out, pending.stream)) {
    Py_XDECREF(wrapped);
    return false;
  }
  PyObject* slot = PyUnicode_FromString("out0");
  PyObject* pair = slot == nullptr ? nullptr : PyTuple_Pack(2, slot, wrapped);
  PyObject* no_reads = pair == nullptr ? nullptr : PyList_New(0);
  bool ok = no_reads != nullptr && PyList_Append(pending.writes, pair) == 0 &&
            PyList_Append(pending.written, wrapped) == 0;
  Py_XDECREF(slot);
  Py_XDECREF(pair);
  Py_DECREF(wrapped);
  if (!ok) {
    Py_XDECREF(no_reads);
    return false;
  }
  Py_SETREF(pending.reads, no_reads);  // the host data it was copied from is no device access
  if (!finish(state, pending, label, constant(KIND_COPY))) {
    return false;
  }
  PyObject* ops = PyTuple_GET_ITEM(state, OPS);
  PyObject* index = PyLong_FromSsize_t(PyList_GET_SIZE(ops));
  // A `StreamSync` of the stream's `Stream` (borrowed from the builder's streams: a stream seen has one).
  PyObject* on = index == nullptr ? nullptr : PyDict_GetItemWithError(PyTuple_GET_ITEM(state, STREAMS), pending.stream);
  PyObject* fields = on == nullptr ? nullptr : PyTuple_Pack(2, index, on);
  PyObject* sync = fields == nullptr ? nullptr : make(constant(STREAM_SYNC), fields);
  ok = sync != nullptr && PyList_Append(ops, sync) == 0;
  Py_XDECREF(index);
  Py_XDECREF(fields);
  Py_XDECREF(sync);
  return ok;
}

void trace_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kTraceKey);
  Pending pending;
  PyObject* state = nullptr;  // borrowed: held by the scope until `end`, which cannot run before this returns
  PyObject* label = nullptr;  // borrowed: held by `known_ops` for the process
  Route way = Route::MODE;
  bool fresh = false;  // the op returns fresh tensors (`_OpInfo.fresh_outputs`), written by it
  try {
    Gil gil;
    c10::impl::ExcludeDispatchKeyGuard quiet(quiet_keys());
    way = route(op, keys, stack, pending, state, label, fresh);
    if (way == Route::MODE || way == Route::UNRECORDED) {
      pending.clear();
    }
  } catch (...) {
    Gil gil;
    pending.clear();
    throw;
  }
  if (way == Route::MODE) {
    if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
      // Its decomposition (`matmul`'s `mm`, `linear`'s `addmm`) is what the mode sees: each of those ops
      // comes back here, and is routed on its own.
      op.redispatchBoxed(below, stack);
      return;
    }
    c10::impl::ExcludeDispatchKeyGuard itself(kTraceKey);
    op.redispatchBoxed(below, stack);
    return;
  }
  try {
    c10::impl::ExcludeDispatchKeyGuard quiet(quiet_keys());
    op.redispatchBoxed(below - quiet_keys(), stack);
  } catch (...) {
    Gil gil;
    pending.clear();
    throw;
  }
  if (way == Route::UNRECORDED) {
    return;
  }
  Gil gil;
  c10::impl::ExcludeDispatchKeyGuard quiet(quiet_keys());
  bool finished;
  try {
    NoDynamo no_dynamo;
    if (no_dynamo.failed) {
      finished = false;
    } else if (way == Route::ALLOCATED) {
      finished = allocations(op, *stack, state, pending);
    } else if (way == Route::LIFTED) {
      finished = lifted_copy(*stack, state, pending, label);
    } else {
      finished = (!fresh || add_outputs(op, *stack, state, pending)) && finish(state, pending, label);
    }
  } catch (...) {
    pending.clear();  // a c10 error (an output without a storage, as the Python path raises too)
    throw;
  }
  pending.clear();
  if (!finished) {
    raise_python_error();
  }
}

// `begin(state)`: record the fast ops of the recording that `state` (`pack_state(Recorder.fast_state())`) is of, on this
// thread, from now until the matching `end()`; the recording's mode must be the top of torch's mode stack.
PyObject* begin_recording(PyObject* /*module*/, PyObject* state) {
  if (!configured()) {
    return nullptr;
  }
  if (!valid_state(state)) {
    PyErr_SetString(PyExc_TypeError, "begin(state): a pack_state(Recorder.fast_state()) tuple");
    return nullptr;
  }
  try {
    Py_INCREF(state);
    std::shared_ptr<c10::impl::PyObject_TorchDispatchMode> sole_mode;
    if (c10::impl::TorchDispatchModeTLS::stack_len() == 1) {
      sole_mode = c10::impl::TorchDispatchModeTLS::get_stack_at(0);
    }
    const bool was_included = c10::impl::tls_is_dispatch_key_included(kTraceKey);
    scopes.push_back(Scope{state, PyThread_get_thread_ident(), sole_mode, was_included});
    c10::impl::tls_set_dispatch_key_included(kTraceKey, sole_mode != nullptr || was_included);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

// `end()`: the innermost `begin` on this thread ends; the key's earlier state there is restored.
PyObject* end_recording(PyObject* /*module*/, PyObject* /*unused*/) {
  const Scope* found = innermost();
  if (found == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "end(): no recording begun on this thread");
    return nullptr;
  }
  Scope scope = *found;
  scopes.erase(scopes.begin() + (found - scopes.data()));
  c10::impl::tls_set_dispatch_key_included(kTraceKey, scope.was_included);
  Py_DECREF(scope.state);
  Py_RETURN_NONE;
}

// `pack_state(fields)`: the state tuple `launch_op` and `begin` take, from `Recorder.fast_state()`'s dict
// (exactly the keys `STATE_FIELDS`, else a TypeError naming both sets).
PyObject* pack_state(PyObject* /*module*/, PyObject* fields) {
  return pack(fields, STATE_NAMES, STATE_SIZE, "pack_state(fields)");
}

// `configure(helper, set_eval_frame, constants)`: `helper(name, overload)` gives an op's (arguments, label,
// kind) if the fast path records it, else None (`racefuzz.trace.op_schemas.dispatcher_op_info`; asked once
// per op); `set_eval_frame` is Dynamo's (`torch._C._dynamo.eval_frame.set_eval_frame`), or None;
// `constants` is `racefuzz.trace.recorder.fast_constants()`, a dict with exactly the keys `CONSTANT_FIELDS`
// (else a TypeError naming both sets). Before any other call.
PyObject* configure(PyObject* /*module*/, PyObject* const* argv, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "configure(helper, set_eval_frame, constants)");
    return nullptr;
  }
  PyObject* packed = pack(argv[2], CONSTANT_NAMES, CONSTANTS_SIZE, "configure(helper, set_eval_frame, constants)");
  if (packed == nullptr) {
    return nullptr;
  }
  Py_INCREF(argv[0]);
  Py_XSETREF(op_info_helper, argv[0]);
  PyObject* dynamo = argv[1] == Py_None ? nullptr : argv[1];
  Py_XINCREF(dynamo);
  Py_XSETREF(set_eval_frame, dynamo);
  Py_XSETREF(constants, packed);
  for (auto& known : known_ops) {
    Py_DECREF(known.second.info);
  }
  known_ops.clear();
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"launch_op", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch_op)), METH_FASTCALL,
     "The recorder's fast path for an op that writes only its arguments (see the source's contract)."},
    {"begin", begin_recording, METH_O, "Record fast ops below the dispatch mode on this thread (see the source)."},
    {"end", end_recording, METH_NOARGS, "End the innermost `begin` on this thread."},
    {"pack_state", pack_state, METH_O, "The state tuple of a Recorder.fast_state() dict (checked: see the source)."},
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure)), METH_FASTCALL,
     "The Python helper saying which ops the fast path records, Dynamo's set_eval_frame, the recorder's constants."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "racefuzz_trace_fastpath", nullptr, -1, methods};

// The fallback's registration, made when the module is imported (not by a static initializer: a key
// already taken would then abort the process instead of failing the import, which `fastpath.load` reports
// and records without the fast path).
std::unique_ptr<torch::Library> registration;

}  // namespace

PyMODINIT_FUNC PyInit_racefuzz_trace_fastpath() {
  if (!intern_names()) {
    return nullptr;
  }
  if (registration == nullptr) {
    try {
      if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kTraceKey)) {
        PyErr_SetString(PyExc_ImportError, "torch's dispatch key TESTING_ONLY_GenericMode is already taken");
        return nullptr;
      }
      auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "_", kTraceKey, __FILE__, __LINE__);
      library->fallback(torch::CppFunction::makeFromBoxedFunction<&trace_fallback>());
      registration = std::move(library);
    } catch (const std::exception& error) {
      PyErr_SetString(PyExc_ImportError, error.what());
      return nullptr;
    }
  }
  PyObject* made = PyModule_Create(&module);
  PyObject* state_fields = made == nullptr ? nullptr : name_tuple(STATE_NAMES, STATE_SIZE);
  PyObject* constant_fields = state_fields == nullptr ? nullptr : name_tuple(CONSTANT_NAMES, CONSTANTS_SIZE);
  // `PyModule_AddObject` steals a reference only when it succeeds.
  bool ok = constant_fields != nullptr && PyModule_AddObject(made, "STATE_FIELDS", state_fields) == 0;
  if (ok) {
    state_fields = nullptr;
    ok = PyModule_AddObject(made, "CONSTANT_FIELDS", constant_fields) == 0;
    if (ok) {
      constant_fields = nullptr;
    }
  }
  Py_XDECREF(state_fields);
  Py_XDECREF(constant_fields);
  if (!ok) {
    Py_XDECREF(made);
    return nullptr;
  }
  return made;
}
