// pnex_magic's C++ launcher: the autotune table.
//
// An autotuned op has several launch candidates (block shapes, Tune variants): each call
// evaluates its autotune key and looks it up in a small key -> candidate table; a miss
// calls back into Python once (pnex_magic.launch.autotune.choose, with the GIL), which
// benchmarks the candidates by calling the op again with one forced (force_candidate),
// unless the stream is capturing.  The only translation unit that wraps tensors for
// Python (python_variable.h, the heaviest header of the launcher's build).

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>

#include "launcher_python.h"

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

py::object to_python(const c10::IValue& v) {
  // THPVariable_Wrap, not py::cast: torch's pybind caster for Tensor lives in a header
  // (torch/csrc/utils/pybind.h) this file does not include.
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isBool()) return py::bool_(v.toBool());
  return py::none();
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
  if (count <= 1 || !spec.python->choose || spec.python->choose.is_none()) return 0;
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
  int candidate = 0;
  bool final = false;
  std::string error;
  {
    // No lock is held here: the tuner calls this op again (with a candidate forced).
    py::gil_scoped_acquire gil;
    try {
      py::tuple key(wanted.key.size());
      for (size_t i = 0; i < wanted.key.size(); ++i) key[i] = py::int_(wanted.key[i]);
      py::object call_args = py::none();
      if (!capturing) {
        py::tuple values(args.size());
        for (size_t i = 0; i < args.size(); ++i) values[i] = to_python(args[i]);
        call_args = values;
      }
      auto result = spec.python->choose(device, contiguous, key, call_args).cast<std::tuple<int, bool>>();
      candidate = std::get<0>(result);
      final = std::get<1>(result);
    } catch (py::error_already_set& e) {
      error = py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  TORCH_CHECK(error.empty(), "pnex: kernel '", spec.kernel, "': choosing its block failed: ", error);
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
