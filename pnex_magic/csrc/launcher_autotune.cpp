// pnex_magic's C++ launcher: the autotune table.
//
// An autotuned op has several launch candidates (block shapes, Tune variants): each call
// evaluates its autotune key and looks it up in a small key -> candidate table; a miss
// calls back into Python once (pnex_magic.launch.autotune.choose, with the GIL), which
// benchmarks the candidates by calling the op again with one forced (force_candidate),
// unless the stream is capturing.  The one unit that wraps tensors for Python, through
// Python's C API and torch's THPVariable_Wrap, declared below: its header,
// torch/csrc/autograd/python_variable.h, costs 13 s of CPU to compile on its own, and
// pybind11 another 5 (tests/test_launcher_build.py checks that torch still declares it).

#include <Python.h>

#include <ATen/core/ivalue.h>
#include <torch/csrc/Export.h>

#include <algorithm>

#include "launcher.h"

TORCH_PYTHON_API PyObject* THPVariable_Wrap(const at::TensorBase& var);

namespace pnex::launcher {

namespace {
// The tuner's own calls launch one candidate, forced on the calling thread.
thread_local std::string t_forced_op;
thread_local int t_forced_candidate = -1;

int64_t bucket(int64_t n) {  // the smallest power of two >= n (pnex_magic.blocks.bucket)
  if (n <= 0) return 0;
  int64_t p = 1;
  while (p < n && p < (int64_t(1) << 62)) p <<= 1;
  return p;
}

// A new reference to the argument as Python sees it (nullptr and a Python error if that fails).
PyObject* to_python(const c10::IValue& v) {
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  Py_RETURN_NONE;
}

// The call's arguments as a new Python tuple (nullptr if one could not be made).
PyObject* to_python(c10::ArrayRef<c10::IValue> args) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
  for (size_t i = 0; tuple != nullptr && i < args.size(); ++i) {
    PyObject* item = to_python(args[i]);
    if (item == nullptr) {
      Py_CLEAR(tuple);
      break;
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(i), item);
  }
  if (tuple == nullptr) PyErr_Clear();
  PyGILState_Release(gil);
  return tuple;
}
}  // namespace

void force_candidate(const std::string& op_name, int candidate) {
  t_forced_op = op_name;
  t_forced_candidate = candidate;
}

bool tuning_call(const Spec& spec) { return t_forced_candidate >= 0 && t_forced_op == spec.op_name; }

int select_block(Spec& spec, const Values& v, c10::ArrayRef<c10::IValue> args, int device, bool contiguous,
                 CUstream stream) {
  const int count = static_cast<int>(spec.candidates.size());
  if (count <= 1 || !has_chooser(spec)) return 0;
  if (t_forced_candidate >= 0 && t_forced_op == spec.op_name) {
    TORCH_CHECK(t_forced_candidate < count, "pnex: kernel '", spec.kernel, "': no candidate ",
                std::to_string(t_forced_candidate));
    return t_forced_candidate;
  }
  Choice wanted;
  wanted.device = device;
  wanted.contiguous = contiguous;
  uint64_t h = 1469598103934665603ULL ^ static_cast<uint64_t>(device * 2 + contiguous);
  for (size_t i = 0; i < spec.key.size(); ++i) {
    int64_t value = evaluate(spec.key[i], v, spec.kernel, spec.key_text[i]);
    if (spec.key_bucket) value = bucket(value);
    wanted.key.push_back(value);
    h = (h ^ static_cast<uint64_t>(value)) * 1099511628211ULL;
  }
  wanted.hash = h;
  auto same = [&wanted](const Choice& c) {
    return c.hash == wanted.hash && c.device == wanted.device && c.contiguous == wanted.contiguous &&
           c.key == wanted.key;
  };
  {
    std::shared_lock<std::shared_mutex> lock(spec.table_mutex);
    for (const Choice& c : spec.table)
      if (same(c)) return c.candidate;
  }
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  pnex::driver().streamIsCapturing(stream, &status);
  const bool capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
  PyObject* call_args = nullptr;
  if (!capturing) {
    call_args = to_python(args);
    TORCH_CHECK(call_args != nullptr, "pnex: kernel '", spec.kernel, "': its arguments could not be handed to the tuner");
  }
  // No lock is held here: the tuner calls this op again (with a candidate forced).
  auto [candidate, final] = python_choose(spec, device, contiguous, wanted.key, call_args);
  TORCH_CHECK(candidate >= 0 && candidate < count, "pnex: kernel '", spec.kernel, "': no candidate ",
              std::to_string(candidate));
  if (final) {
    wanted.candidate = candidate;
    std::unique_lock<std::shared_mutex> lock(spec.table_mutex);
    if (std::none_of(spec.table.begin(), spec.table.end(), same)) spec.table.push_back(std::move(wanted));
  }
  return candidate;
}

}  // namespace pnex::launcher
