// The recorder's C++ fast path for a torch op that writes only its arguments (an in-place or `out=` op):
// `Recorder.launch_op` and what it calls (`_schema_accesses`, `current_stream`, `user_source`, `_access`),
// the same trace op built from the same dicts, without Python's per-op interpretation. Built and loaded by
// `racefuzz.trace.fastpath`; the Python path stays the reference (tests/unit/test_trace_fastpath.py runs
// both on the same steps and compares the traces).
//
// Contract of `launch_op(state, arguments, label, func, args, kwargs)`:
// * returns `state[BAIL]` without any side effect when the op is not for it (a tensor list argument, a
//   tensor off the GPU in a GPU run, a stream or a frame it has not seen yet): the caller then takes the
//   Python path, which records it (and teaches the caches: the next such op is fast);
// * an op that writes nothing (a view, a metadata op) is called and not recorded, as the Python path does;
// * otherwise: the delay (`recorder._delay`), the call `func(*args, **kwargs)`, the `TraceLaunch` appended
//   with its accesses, the snapshots (`recorder._after`); returns what `func` returned. Anything unusual
//   after the call (a strided view, an unknown storage) is handed to the recorder's own Python methods.
#include <Python.h>
#include <frameobject.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#if PY_VERSION_HEX < 0x030B0000
#error "the fast path needs Python 3.11 or later (PyFrame_GetLasti); racefuzz.trace.fastpath skips it before"
#endif

namespace {

// Indices into the state tuple `Recorder.fast_state()` builds.
enum State {
  RECORDER,
  BAIL,
  OPS,
  LAUNCH_OPS,
  KEYS,
  EPOCHS,
  STREAM_NAMES,
  SEEN_STREAMS,
  DELAYS,
  SNAPSHOTS_OR_SYNCS,
  ON_GPU,
  RAW_STREAM,
  DEVICE_INDEX,
  TRACE_LAUNCH,
  ACCESS,
  LIBRARY_CODE,
  SOURCES,
  CODE_IS_LIBRARY,
  FRAME_SOURCE,
  KIND_TORCH,
  STATE_SIZE
};

// `user_source` from `frame` outwards: a new reference to `file:line (function)` of the first frame outside
// the recorder, torch, Triton and Hypothesis (the caches of racefuzz.trace.recorder, filled through its
// Python helpers on a miss), "" if there is none; nullptr with an exception if a helper raised.
PyObject* user_source(PyObject* state, PyFrameObject* frame) {
  PyObject* library = PyTuple_GET_ITEM(state, LIBRARY_CODE);
  PyObject* sources = PyTuple_GET_ITEM(state, SOURCES);
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* known = PyDict_GetItem(library, reinterpret_cast<PyObject*>(code));
    if (known == nullptr) {
      known = PyObject_CallOneArg(PyTuple_GET_ITEM(state, CODE_IS_LIBRARY), reinterpret_cast<PyObject*>(code));
      if (known == nullptr) {
        Py_DECREF(code);
        Py_DECREF(frame);
        return nullptr;
      }
      Py_DECREF(known);  // the cache holds it (True / False)
    }
    if (known == Py_False) {
      int lasti = PyFrame_GetLasti(frame);  // what Python's `frame.f_lasti` is (bytes)
      PyObject* key = Py_BuildValue("(Oi)", code, lasti);
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
        source = PyObject_CallOneArg(PyTuple_GET_ITEM(state, FRAME_SOURCE), reinterpret_cast<PyObject*>(frame));
      }
      Py_DECREF(frame);
      return source;
    }
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
  if (name != nullptr && PySet_Contains(PyTuple_GET_ITEM(state, SEEN_STREAMS), name) != 1) {
    Py_DECREF(name);
    return nullptr;
  }
  return name;
}

// `Recorder._access` of one tensor (a new reference to a tuple of `Access`), or nullptr with an exception.
PyObject* access(PyObject* state, PyObject* tensor, PyObject* label) {
  PyObject* recorder = PyTuple_GET_ITEM(state, RECORDER);
  const at::Tensor& t = THPVariable_Unpack(tensor);
  int64_t start = 0, nbytes = 0;
  uintptr_t base = 0;
  bool contiguous = false;
  try {
    contiguous = t.is_contiguous();
    if (contiguous) {
      int64_t itemsize = static_cast<int64_t>(t.itemsize());
      nbytes = t.numel() * itemsize;
      start = t.storage_offset() * itemsize;
      if (nbytes) {
        base = reinterpret_cast<uintptr_t>(t.data_ptr()) - static_cast<uintptr_t>(start);
      }
    }
  } catch (const std::exception&) {
    contiguous = false;  // no plain storage (meta, sparse): the Python path says what it is
  }
  if (!contiguous) {
    PyObject* one = PyList_New(1);
    if (one == nullptr) {
      return nullptr;
    }
    Py_INCREF(tensor);
    PyList_SET_ITEM(one, 0, tensor);
    PyObject* result = PyObject_CallMethod(recorder, "_merged_accesses", "OO", one, label);
    Py_DECREF(one);
    return result;
  }
  if (!nbytes) {
    return PyTuple_New(0);
  }
  PyObject* base_obj = PyLong_FromUnsignedLongLong(base);
  if (base_obj == nullptr) {
    return nullptr;
  }
  PyObject* epoch = PyDict_GetItem(PyTuple_GET_ITEM(state, EPOCHS), base_obj);
  PyObject* zero = nullptr;
  if (epoch == nullptr) {
    epoch = zero = PyLong_FromLong(0);
  }
  PyObject* pair = epoch == nullptr ? nullptr : PyTuple_Pack(2, base_obj, epoch);
  Py_XDECREF(zero);
  Py_DECREF(base_obj);
  if (pair == nullptr) {
    return nullptr;
  }
  PyObject* key = PyDict_GetItem(PyTuple_GET_ITEM(state, KEYS), pair);
  Py_DECREF(pair);
  if (key != nullptr) {
    Py_INCREF(key);
  } else {
    key = PyObject_CallMethod(recorder, "_storage", "OO", tensor, label);
    if (key == nullptr) {
      return nullptr;
    }
  }
  PyObject* bounds = untracked(Py_BuildValue("(LL)", static_cast<long long>(start), static_cast<long long>(start + nbytes)));
  PyObject* interval = bounds == nullptr ? nullptr : untracked(PyTuple_Pack(1, bounds));
  Py_XDECREF(bounds);
  PyObject* fields = interval == nullptr ? nullptr : PyTuple_Pack(2, key, interval);
  Py_DECREF(key);
  Py_XDECREF(interval);
  if (fields == nullptr) {
    return nullptr;
  }
  PyObject* item = make(PyTuple_GET_ITEM(state, ACCESS), fields);
  Py_DECREF(fields);
  if (item == nullptr) {
    return nullptr;
  }
  PyObject* result = untracked(PyTuple_Pack(1, item));
  Py_DECREF(item);
  return result;
}

// `Recorder._accesses`: one tensor here, several through the recorder (it merges them per storage).
PyObject* accesses(PyObject* state, PyObject* tensors, PyObject* label) {
  Py_ssize_t count = PyList_GET_SIZE(tensors);
  if (count == 0) {
    return PyTuple_New(0);
  }
  if (count == 1) {
    return access(state, PyList_GET_ITEM(tensors, 0), label);
  }
  return PyObject_CallMethod(PyTuple_GET_ITEM(state, RECORDER), "_merged_accesses", "OO", tensors, label);
}

bool off_device(PyObject* state, PyObject* tensor) {
  return PyTuple_GET_ITEM(state, ON_GPU) == Py_True && !THPVariable_Unpack(tensor).is_cuda();
}

PyObject* launch_op_impl(PyObject* const* argv, Py_ssize_t nargs) {
  if (nargs != 6 || !PyTuple_CheckExact(argv[0]) || PyTuple_GET_SIZE(argv[0]) != STATE_SIZE || !PyTuple_Check(argv[1]) ||
      !PyTuple_Check(argv[4]) || !PyDict_Check(argv[5])) {
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
  PyObject* recorder = PyTuple_GET_ITEM(state, RECORDER);

  // `_schema_accesses`: (position, name, keyword-only, written) per tensor-holding argument.
  PyObject* reads = PyList_New(0);
  PyObject* writes = PyList_New(0);   // (slot, tensor) pairs, as `_after` takes them
  PyObject* written = PyList_New(0);  // the tensors alone
  if (reads == nullptr || writes == nullptr || written == nullptr) {
    Py_XDECREF(reads);
    Py_XDECREF(writes);
    Py_XDECREF(written);
    return nullptr;
  }
  PyObject* result = nullptr;
  PyObject* stream = nullptr;
  PyObject* source = nullptr;
  PyObject* read_access = nullptr;
  PyObject* write_access = nullptr;
  Py_ssize_t count = PyTuple_GET_SIZE(args);
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(arguments); ++k) {
    PyObject* spec = PyTuple_GET_ITEM(arguments, k);
    Py_ssize_t position = PyLong_AsSsize_t(PyTuple_GET_ITEM(spec, 0));
    PyObject* name = PyTuple_GET_ITEM(spec, 1);
    bool kwarg_only = PyTuple_GET_ITEM(spec, 2) == Py_True;
    bool is_written = PyTuple_GET_ITEM(spec, 3) == Py_True;
    PyObject* value;
    if (kwarg_only || position >= count) {
      value = PyDict_GetItem(kwargs, name);
      if (value == nullptr) {
        continue;
      }
    } else {
      value = PyTuple_GET_ITEM(args, position);
    }
    if (THPVariable_Check(value)) {
      if (off_device(state, value)) {
        result = bail;
        break;
      }
      int appended;
      if (is_written) {
        PyObject* pair = PyTuple_Pack(2, name, value);
        appended = pair == nullptr ? -1 : PyList_Append(writes, pair);
        Py_XDECREF(pair);
        appended = appended < 0 ? -1 : PyList_Append(written, value);
      } else {
        appended = PyList_Append(reads, value);
      }
      if (appended < 0) {
        goto done;  // no side effect yet: the error (out of memory) propagates
      }
    } else if (PyList_Check(value) || PyTuple_Check(value)) {
      result = bail;  // tensor lists: the Python path's `_tensors`
      break;
    }
  }
  if (result == bail) {
    Py_INCREF(bail);
    goto done;
  }
  if (PyList_GET_SIZE(writes) == 0) {
    result = PyObject_Call(func, args, kwargs);  // a view or metadata op: not a launch
    goto done;
  }
  stream = current_stream(state);
  if (stream == nullptr) {
    Py_INCREF(bail);
    result = bail;
    goto done;
  }
  {
    PyFrameObject* frame = PyEval_GetFrame();
    source = user_source(state, frame);
    if (source == nullptr) {
      goto done;
    }
  }
  if (PyDict_GET_SIZE(PyTuple_GET_ITEM(state, DELAYS)) != 0) {
    PyObject* none = PyObject_CallMethod(recorder, "_delay", "O", stream);
    if (none == nullptr) {
      goto done;
    }
    Py_DECREF(none);
  }
  result = PyObject_Call(func, args, kwargs);
  if (result == nullptr) {
    goto done;
  }
  write_access = accesses(state, written, label);
  if (write_access == nullptr) {
    Py_CLEAR(result);
    goto done;
  }
  read_access = accesses(state, reads, label);
  if (read_access == nullptr) {
    Py_CLEAR(result);
    goto done;
  }
  {
    PyObject* ops = PyTuple_GET_ITEM(state, OPS);
    PyObject* launch_ops = PyTuple_GET_ITEM(state, LAUNCH_OPS);
    Py_ssize_t ordinal = PyList_GET_SIZE(launch_ops);
    // The index after the accesses: a new storage seen there may have recorded a free first (`_watch`).
    PyObject* index = PyLong_FromSsize_t(PyList_GET_SIZE(ops));
    PyObject* fields = index == nullptr ? nullptr
                                        : PyTuple_Pack(8, index, stream, label, PyTuple_GET_ITEM(state, KIND_TORCH),
                                                       read_access, write_access, source, Py_False);
    PyObject* op = fields == nullptr ? nullptr : make(PyTuple_GET_ITEM(state, TRACE_LAUNCH), fields);
    Py_XDECREF(fields);
    if (op == nullptr || PyList_Append(ops, op) < 0 || PyList_Append(launch_ops, index) < 0) {
      Py_XDECREF(op);
      Py_XDECREF(index);
      Py_CLEAR(result);
      goto done;
    }
    Py_DECREF(op);
    Py_DECREF(index);
    if (PyTuple_GET_ITEM(state, SNAPSHOTS_OR_SYNCS) == Py_True) {
      PyObject* none = PyObject_CallMethod(recorder, "_after", "nO", ordinal, writes);
      if (none == nullptr) {
        Py_CLEAR(result);
        goto done;
      }
      Py_DECREF(none);
    }
  }
done:
  Py_DECREF(reads);
  Py_DECREF(writes);
  Py_DECREF(written);
  Py_XDECREF(stream);
  Py_XDECREF(source);
  Py_XDECREF(read_access);
  Py_XDECREF(write_access);
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

PyMethodDef methods[] = {
    {"launch_op", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch_op)), METH_FASTCALL,
     "The recorder's fast path for an op that writes only its arguments (see the source's contract)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "racefuzz_trace_fastpath", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_racefuzz_trace_fastpath() {
  return PyModule_Create(&module);
}
