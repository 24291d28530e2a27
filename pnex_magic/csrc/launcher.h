// pnex_magic's generic GPU launcher: the internal header its translation units share.
//
// One extension, compiled once per environment, serves every pnex kernel: for each
// op it registers a boxed functor with PyTorch's dispatcher (CUDA key) holding the
// kernel's parameter description, its shape checks and launch grid as small postfix
// programs, and the loaded CUfunction per device.  A call goes from the dispatcher
// straight to launcher_call.cpp: check arguments, allocate outputs with PyTorch's
// caching allocator, pack Numba's kernel ABI, cuLaunchKernel on PyTorch's current
// stream.  No Python runs per call.
//
// Translation units by concern, compiled in parallel (ninja), each including only the
// torch headers it needs (this header includes none of the heavy ones):
//
//   launcher_faults.cpp    fault naming: the last kernel per device (no torch header)
//   launcher_call.cpp      one call: the postfix programs (shapes, n_threads, autotune key),
//                          the argument checks, the outputs, the launch, checked launches
//   launcher_autotune.cpp  the autotune table: key -> candidate, Python's tuner on a miss
//   launcher_dispatch.cpp  registration with the dispatcher (CUDA, autograd, ADInplaceOrView)
//   launcher_register.cpp  the Python module: the op's description and Python callables, the
//                          op class's C call slot (the only unit with pybind11)
//
// Alone, pybind11 costs 5-6 s of CPU, torch/library.h 5 s, ATen/core/ivalue.h 3 s and
// torch/csrc/autograd/python_variable.h 13 s (g++ 12, 2026-11-25), so no unit includes two
// of them: the longest unit (call) takes 7 s, the five 22 s together, where four took 12-13 s
// and 32 s (benchmarks/launcher_build.py).
//
// The CUDA driver is reached through dlopen("libcuda.so.1") (cuda_driver.h), so the
// extension builds with a host C++ compiler and the CUDA headers alone (no nvcc, no
// link to libcuda).  No iostreams anywhere (and only strings in TORCH_CHECK messages,
// whose formatting of numbers goes through std::ostringstream): a libstdc++ other than
// torch's may be loaded, and its locale facets crash when mixed (seen with the system
// g++ against torch's wheels).

#ifndef PNEX_LAUNCHER_H_
#define PNEX_LAUNCHER_H_

// Light headers only (each unit includes the heavy ones it needs): no <ATen/core/Tensor.h>,
// no pybind11 here.  The build then costs each unit only what it uses.
#include <ATen/core/boxing/OperatorKernel.h>
#include <c10/core/Device.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "launcher_faults.h"

struct _object;  // PyObject (Python.h), for the units that do not include Python

namespace at {
class Tensor;
}
namespace c10 {
class IValue;
class OperatorHandle;
}

namespace pnex::launcher {

// ---------------------------------------------------------------- programs (launcher_call.cpp)
// Opcodes of the postfix programs (pnex_magic.expressions.OPCODES).
enum Op : int64_t { CONST = 0, SIZE = 1, NUMEL = 2, SCALAR = 3, ADD = 4, SUB = 5, MUL = 6, FLOORDIV = 7,
                    MOD = 8, NEG = 9, MIN = 10, MAX = 11,
                    // conditions (pnex_magic.conditions): 1 for true, 0 for false
                    LT = 12, LE = 13, GT = 14, GE = 15, EQ = 16, NE = 17, AND = 18, OR = 19, NOT = 20 };
struct Instr {
  int64_t op, a, b;
};
using Program = std::vector<Instr>;

// One rule of jit(requires=...): its text, its condition, and the terms (sizes, scalars)
// whose values its message shows (pnex_magic.conditions.requirement_message, same words).
struct Rule {
  std::string text;
  std::string why;  // what it means ("" if not given)
  Program condition;
  std::vector<std::pair<std::string, Program>> terms;
};

// The values a call's programs read, per parameter.
struct Values {
  c10::SmallVector<const at::Tensor*, 16> tensors;  // per parameter (nullptr if not a tensor)
  c10::SmallVector<int64_t, 16> ints;               // per parameter: integer scalar values
};

// The program's value; `kernel` and `what` (its text) name it in a division by zero.
int64_t evaluate(const Program& prog, const Values& v, const std::string& kernel, const std::string& what);
// The message of the first rule of jit(requires=...) that `v` breaks, without "pnex: " ("" if none).
std::string broken_rule(const std::vector<Rule>& rules, const Values& v, const std::string& kernel);

std::string dtype_name(c10::ScalarType t);
c10::ScalarType scalar_type(const std::string& name);
std::string shape_str(c10::IntArrayRef sizes);
// A scalar argument in an 8-byte slot, the way the kernel expects it.
uint64_t pack_scalar(const c10::IValue& v, c10::ScalarType t);

// ---------------------------------------------------------------- the op's description
enum Kind : int { IN = 0, INMUT = 1, OUT = 2, SCALAR_PARAM = 3, UNUSED = 4, TUNE = 5, SEED = 6 };

struct Param {
  std::string name;
  int kind = IN;
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t itemsize = 4;
  int64_t ndim = 0;
  std::vector<std::optional<Program>> shape;  // per axis; nullopt: any size
  std::vector<std::string> shape_text;
  bool has_init = false;
  double init = 0.0;
  std::string describe;  // e.g. In(float32, (None,))
  int64_t lanes = 1;  // > 1: a record dtype, `lanes` words per record on the tensor's last axis
  std::string record_message;  // what such a tensor must be (pnex_magic.calls.record_message)
};

// One autotune decision: a key (device, layout, key values) and the candidate chosen.
struct Choice {
  uint64_t hash = 0;
  int device = 0;
  bool contiguous = true;
  c10::SmallVector<int64_t, 8> key;
  int candidate = 0;
};

// The op's Python callables (launcher_python.h): only the units that call Python see them.
struct Callbacks;
// The device arrays the kernel reads as globals (launcher_hidden.h): none for most ops.
struct HiddenArrays;

struct Spec {
  std::string kernel;  // the user's kernel name, for messages
  std::string op_name;  // pnex::<op_name>
  const char* interned = "";  // kernel, interned (for the last kernel per device)
  std::vector<Param> params;
  std::vector<int> arguments;     // parameter index of each op argument
  std::vector<int> arg_of_param;  // op argument index of each parameter (-1 for outputs, unused)
  std::vector<int> outputs;       // parameter index of each output
  std::vector<Program> n_threads;
  std::vector<std::string> n_threads_text;
  std::vector<std::array<unsigned, 3>> candidates;  // block shapes; [0] is the default
  std::vector<int> candidate_variant;  // the Tune variant each candidate runs (index into variants)
  std::vector<int> tune_params;        // parameter index of each Tune parameter
  std::vector<std::vector<int64_t>> variants;  // per variant, the value of each Tune parameter
  std::vector<int64_t> shared;  // per variant, bytes of dynamic shared memory per block (shared_bytes=)
  std::vector<Program> key;  // autotune key (empty unless several candidates)
  std::vector<std::string> key_text;
  bool key_bucket = false;  // round key values up to powers of two
  // Memory checks of InMut arguments (messages from Python, see description.py).
  std::vector<std::pair<int, std::string>> internal_overlap;         // parameter, message
  std::vector<std::tuple<int, int, std::string>> overlap;            // written, other, message
  std::vector<Rule> rules;  // jit(requires=...): a call that breaks one is refused
  std::shared_ptr<Callbacks> python;  // get_image, choose, describe
  std::shared_ptr<const HiddenArrays> hidden;  // null: the kernel reads no device array as a global
  bool check_always = false;  // every launch runs the checked variant (check=True)
  bool cooperative = false;   // it synchronises its grid: launched cooperatively (cooperative.h)
  std::array<unsigned, 3> cluster{0, 0, 0};  // blocks per thread-block cluster (cluster_dims=); 0: none
  std::mutex mutex;      // loading code
  std::shared_mutex table_mutex;
  std::vector<Choice> table;  // autotune decisions made so far

  // Per (Tune variant, checked, layout), the loaded kernel per device index; loaded once,
  // then read without a lock.  Allocated by register_op once the number of variants is known.
  using Functions = std::array<std::atomic<CUfunction>, kMaxDevices>;
  std::vector<std::unique_ptr<Functions>> functions;
  void allocate_functions(size_t variants) {
    functions.clear();
    for (size_t i = 0; i < 4 * std::max<size_t>(variants, 1); ++i) {
      auto table = std::make_unique<Functions>();
      for (auto& fn : *table) fn.store(nullptr, std::memory_order_relaxed);
      functions.push_back(std::move(table));
    }
  }
  std::vector<std::shared_ptr<std::string>> images;  // kept alive with their modules

  // The bytes of dynamic shared memory a Tune variant launches with (0 where none is described).
  int64_t shared_bytes(int variant) const {
    return variant >= 0 && static_cast<size_t>(variant) < shared.size() ? shared[variant] : 0;
  }
};

// ---------------------------------------------------------------- Python (launcher_register.cpp)
// The kernel's code for a device (cubin, or NUL-terminated PTX) and its entry, from Python.
std::pair<std::string, std::string> kernel_image(const Spec& spec, int device, bool contiguous, int variant,
                                                 bool checked);
// The message for a violation an error record holds, from Python.
std::string describe_violation(const Spec& spec, const int64_t* record);
// Raises pnex_magic.calls.inmut_grad_error(kernel, param, leaf) as the Python exception it is.
[[noreturn]] void refuse_inmut_grad(const Spec& spec, const std::string& param, bool leaf);
// Whether the op has a Python tuner (an autotuned op's choose callback).
bool has_chooser(const Spec& spec);
// Python's choice for a key (pnex_magic.launch.autotune.choose): (candidate, final).  `args` is
// the call's arguments as a Python tuple, a reference this takes over, or nullptr while the
// stream captures (nothing may run then).  A failure raises with Python's message.
std::pair<int, bool> python_choose(const Spec& spec, int device, bool contiguous, c10::ArrayRef<int64_t> key,
                                   _object* args);

// ---------------------------------------------------------------- the dispatcher (launcher_dispatch.cpp)
// Registers the op's kernels for pnex::<name> (what an earlier registration of the name left
// is dropped first): PnexKernel at CUDA; with `autograd_fallback`, C++ autograd kernels (no
// Python per call until an autograd formula is attached); ADInplaceOrView's for an InMut.
void register_kernels(const std::string& name, const std::shared_ptr<Spec>& spec, bool autograd_fallback);
void unregister_op(const std::string& name);
// An autograd formula is attached: the C++ autograd kernels step aside.
void drop_autograd_fallback(const std::string& name);

// ---------------------------------------------------------------- checks (launcher_call.cpp)
// Checks a call's arguments (dtype, rank, device, declared sizes, InMut memory overlap),
// fills `v` with them; returns their device and whether every tensor is contiguous.
std::pair<c10::Device, bool> check_arguments(const Spec& spec, c10::ArrayRef<c10::IValue> args, Values& v);

// Launches of one op on this thread run its checked variant ("": none).
void force_checked(const std::string& op_name);
// Whether this call runs the checked variant (check=True, or forced on this thread).
bool checked_launch(const Spec& spec);
// A zeroed error record on `device`, for a checked launch on `stream` (refused while the
// stream is capturing a CUDA graph).
at::Tensor error_record(const Spec& spec, c10::Device device, CUstream stream);
// The error record's size in int64 entries (pnex_magic.checking.RECORD_SIZE).
constexpr int64_t kRecordSlots = 16;  // tests/test_checked.py checks that the three agree
// After a checked launch: raises an IndexError with the violation the record holds, if any.
void raise_violation(const Spec& spec, const at::Tensor& record);

// ---------------------------------------------------------------- hidden arguments (launcher_call.cpp)
// Appends the slots (Numba's ABI) of the kernel's hidden arguments, the device arrays it
// reads as globals, for a launch on `device`: after its parameters and a checked launch's
// error record.  Refuses a tensor on another device, or of another dtype, rank or layout
// than the code was compiled for.
void append_hidden(const Spec& spec, c10::Device device, c10::SmallVector<uint64_t, 64>& slots);

// ---------------------------------------------------------------- autotuning (launcher_autotune.cpp)
// The tuner's own calls launch one candidate, forced on the calling thread.
void force_candidate(const std::string& op_name, int candidate);
// Whether this call is one of the tuner's (a candidate is forced for this op on this thread).
bool tuning_call(const Spec& spec);
// The candidate block for this call: forced, else the table's choice for its key, else
// Python's (pnex_magic.launch.autotune.choose), which benchmarks unless the stream captures.
int select_block(Spec& spec, const Values& v, c10::ArrayRef<c10::IValue> args, int device, bool contiguous,
                 CUstream stream);

// ---------------------------------------------------------------- the call (launcher_call.cpp)
// The op's CUDA kernel at the dispatcher.
class PnexKernel final : public c10::OperatorKernel {
 public:
  explicit PnexKernel(std::shared_ptr<Spec> spec) : spec_(std::move(spec)) {}
  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, std::vector<c10::IValue>* stack);

 private:
  std::shared_ptr<Spec> spec_;
};

}  // namespace pnex::launcher

#endif  // PNEX_LAUNCHER_H_
