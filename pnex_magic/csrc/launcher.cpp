// pnex_magic's generic GPU launcher.
//
// One extension, compiled once per environment, serves every pnex kernel: for each
// op it registers a boxed functor with PyTorch's dispatcher (CUDA key) holding the
// kernel's parameter description, its shape checks and launch grid as small postfix
// programs, and the loaded CUfunction per device.  A call goes from the dispatcher
// straight here: check arguments, allocate outputs with PyTorch's caching allocator,
// pack Numba's kernel ABI, cuLaunchKernel on PyTorch's current stream.  No Python
// runs per call.
//
// An autotuned op has several candidate blocks: each call evaluates its autotune key
// and looks it up in a small key -> block table; a miss calls back into Python once
// (select_block), which benchmarks the candidates, unless the stream is capturing.
//
// The CUDA driver is reached through dlopen("libcuda.so.1"), so the extension builds
// with a host C++ compiler and the CUDA headers alone (no nvcc, no link to libcuda).

// The headers used here, not <torch/extension.h> (all of torch's C++ API): the one-time
// build takes half the time (13 s instead of 25 s of CPU with g++ 12).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/library.h>
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/core/GradMode.h>
#include <c10/util/Half.h>
#include <c10/util/BFloat16.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/python_variable.h>

#include "cuda_driver.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <vector>

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------- CUDA driver
// The dlopen'd driver table, shared with the XLA FFI handler (jax_ffi.cpp).
using pnex::cu_error;
using pnex::driver;
using pnex::Driver;
using pnex::is_fault;
using pnex::launch_blocking;

// Devices a process may use (c10 allows fewer): per-device tables are fixed arrays.
constexpr int kMaxDevices = 128;

// Kernel names, interned for the life of the process, so that the last kernel launched
// on each device is a pointer swapped atomically per launch (no string copy, no lock).
const char* intern(const std::string& name) {
  static std::mutex mutex;
  static auto* names = new std::set<std::string>();  // never destroyed: read until exit
  std::lock_guard<std::mutex> lock(mutex);
  return names->insert(name).first->c_str();
}
std::array<std::atomic<const char*>, kMaxDevices> g_last_kernel{};  // device -> last pnex kernel there

// What to add to a sticky fault (an earlier kernel's illegal access, found by this call).
std::string fault_hint(const char* previous) {
  if (launch_blocking())
    return "; launches are synchronised (PNEX_LAUNCH_BLOCKING / CUDA_LAUNCH_BLOCKING), so this kernel faulted, "
           "unless a kernel outside pnex did just before it";
  return "; this error is left by an earlier kernel on this device" +
         (previous == nullptr || !*previous
              ? std::string()
              : " (the last pnex kernel launched there was '" + std::string(previous) + "')") +
         ". Set PNEX_LAUNCH_BLOCKING=1 (or CUDA_LAUNCH_BLOCKING=1) to name the kernel that faulted";
}

// ---------------------------------------------------------------- expressions
enum Op : int64_t { CONST = 0, SIZE = 1, NUMEL = 2, SCALAR = 3, ADD = 4, SUB = 5, MUL = 6, FLOORDIV = 7,
                    MOD = 8, NEG = 9, MIN = 10, MAX = 11 };
struct Instr {
  int64_t op, a, b;
};
using Program = std::vector<Instr>;

enum Kind : int { IN = 0, INMUT = 1, OUT = 2, SCALAR_PARAM = 3, UNUSED = 4, TUNE = 5 };

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
};

struct Values {
  c10::SmallVector<const at::Tensor*, 16> tensors;  // per parameter (nullptr if not a tensor)
  c10::SmallVector<int64_t, 16> ints;               // per parameter: integer scalar values
};

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t pymod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

struct Spec;
int64_t evaluate(const Program& prog, const Values& v, const Spec& spec, const std::string& what);

// One autotune decision: a key (device, layout, key values) and the candidate chosen.
struct Choice {
  uint64_t hash = 0;
  int device = 0;
  bool contiguous = true;
  c10::SmallVector<int64_t, 8> key;
  int candidate = 0;
};

struct Spec {
  std::string kernel;  // the user's kernel name, for messages
  std::string op_name;  // pnex::<op_name>
  const char* interned = "";  // kernel, interned (for g_last_kernel)
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
  std::vector<Program> key;  // autotune key (empty unless several candidates)
  std::vector<std::string> key_text;
  bool key_bucket = false;  // round key values up to powers of two
  // Memory checks of InMut arguments (messages from Python, see description.py).
  std::vector<std::pair<int, std::string>> internal_overlap;         // parameter, message
  std::vector<std::tuple<int, int, std::string>> overlap;            // written, other, message
  py::object get_image;  // callable(device_index, contiguous, variant, checked) -> (cubin or PTX bytes, entry)
  py::object choose;     // callable(device_index, contiguous, key, args or None) -> (candidate, final)
  py::object describe;   // callable(error record as a list) -> message ("" for none)
  bool check_always = false;  // every launch runs the checked variant (check=True)
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
  ~Spec() {
    // The dispatcher may destroy kernels at process exit, after Python has finalised:
    // then the references must be dropped without touching the interpreter.
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      get_image = py::object();
      choose = py::object();
      describe = py::object();
    } else {
      get_image.release();
      choose.release();
      describe.release();
    }
  }
  std::vector<std::shared_ptr<std::string>> images;  // kept alive with their modules
};

int64_t evaluate(const Program& prog, const Values& v, const Spec& spec, const std::string& what) {
  int64_t stack[64];
  int sp = 0;
  for (const Instr& ins : prog) {
    switch (ins.op) {
      case CONST: stack[sp++] = ins.a; break;
      case SIZE: stack[sp++] = v.tensors[ins.a]->size(ins.b); break;
      case NUMEL: stack[sp++] = v.tensors[ins.a]->numel(); break;
      case SCALAR: stack[sp++] = v.ints[ins.a]; break;
      case NEG: stack[sp - 1] = -stack[sp - 1]; break;
      default: {
        int64_t r = stack[--sp];
        int64_t l = stack[sp - 1];
        int64_t out = 0;
        if ((ins.op == FLOORDIV || ins.op == MOD) && r == 0) {
          TORCH_CHECK_VALUE(false, "pnex: ", spec.kernel, "(): division by zero while evaluating ", what);
        }
        switch (ins.op) {
          case ADD: out = l + r; break;
          case SUB: out = l - r; break;
          case MUL: out = l * r; break;
          case FLOORDIV: out = floordiv(l, r); break;
          case MOD: out = pymod(l, r); break;
          case MIN: out = std::min(l, r); break;
          case MAX: out = std::max(l, r); break;
          default: TORCH_CHECK(false, "pnex: bad opcode ", std::to_string(ins.op));
        }
        stack[sp - 1] = out;
      }
    }
  }
  return stack[0];
}

std::string dtype_name(c10::ScalarType t) {
  std::string s = c10::toString(t);
  // c10 names: Float, Double, Half, BFloat16, Int, Long, Short, Char, Byte, Bool, UInt16...
  static const std::map<std::string, std::string> names = {
      {"Float", "float32"}, {"Double", "float64"}, {"Half", "float16"}, {"BFloat16", "bfloat16"},
      {"Int", "int32"},     {"Long", "int64"},     {"Short", "int16"},  {"Char", "int8"},
      {"Byte", "uint8"},    {"Bool", "bool"},      {"UInt16", "uint16"}, {"UInt32", "uint32"},
      {"UInt64", "uint64"}};
  auto it = names.find(s);
  return it == names.end() ? s : it->second;
}

// No iostreams in this file (and only strings in TORCH_CHECK messages, whose formatting
// of numbers goes through std::ostringstream): a libstdc++ other than torch's may be loaded, and its
// locale facets crash when mixed (seen with the system g++ against torch's wheels).
std::string shape_str(at::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  if (sizes.size() == 1) out += ",";
  return out + ")";
}

// Store a scalar argument in an 8-byte slot the way the kernel expects it.
uint64_t pack_scalar(const c10::IValue& v, c10::ScalarType t) {
  uint64_t slot = 0;
  auto put = [&slot](auto x) { std::memcpy(&slot, &x, sizeof(x)); };
  double d = v.isDouble() ? v.toDouble() : (v.isBool() ? (v.toBool() ? 1.0 : 0.0) : static_cast<double>(v.toInt()));
  int64_t i = v.isInt() ? v.toInt() : (v.isBool() ? (v.toBool() ? 1 : 0) : static_cast<int64_t>(d));
  switch (t) {
    case c10::ScalarType::Float: put(static_cast<float>(d)); break;
    case c10::ScalarType::Double: put(d); break;
    case c10::ScalarType::Half: put(c10::Half(static_cast<float>(d)).x); break;
    case c10::ScalarType::BFloat16: put(c10::BFloat16(static_cast<float>(d)).x); break;
    case c10::ScalarType::Char: put(static_cast<int8_t>(i)); break;
    case c10::ScalarType::Short: put(static_cast<int16_t>(i)); break;
    case c10::ScalarType::Int: put(static_cast<int32_t>(i)); break;
    case c10::ScalarType::Long: put(static_cast<int64_t>(i)); break;
    case c10::ScalarType::Byte: put(static_cast<uint8_t>(i)); break;
    case c10::ScalarType::UInt16: put(static_cast<uint16_t>(i)); break;
    case c10::ScalarType::UInt32: put(static_cast<uint32_t>(i)); break;
    case c10::ScalarType::UInt64: put(static_cast<uint64_t>(i)); break;
    case c10::ScalarType::Bool: put(static_cast<uint8_t>(v.isBool() ? v.toBool() : i != 0)); break;
    default: TORCH_CHECK(false, "pnex: unsupported scalar type ", c10::toString(t));
  }
  return slot;
}

// A thread that has made no CUDA runtime call yet (autograd's backward worker, say) has
// no current context, and CUDAGuard does not bind one when the device index already
// matches: bind the device's primary context, the one PyTorch uses.
void ensure_context(int device, const std::string& kernel) {
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  if (d.ctxGetCurrent(&ctx) == CUDA_SUCCESS && ctx != nullptr) return;
  CUdevice dev = 0;
  CUresult r = d.deviceGet(&dev, device);
  if (r == CUDA_SUCCESS) r = d.primaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = d.ctxSetCurrent(ctx);
  TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", kernel, "': cannot make cuda:", std::to_string(device),
              "'s context current: ", cu_error(r));
}

// The kernel for a device, loaded on first use: the code for C-contiguous inputs (whose
// loads compile to ld.global) or the one for any strides, of one Tune variant.
CUfunction function_for(Spec& spec, int device, bool contiguous, int variant, bool checked) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "pnex: kernel '", spec.kernel, "': device index ",
              std::to_string(device), " is beyond the ", std::to_string(kMaxDevices), " devices pnex supports");
  const size_t table = (2 * static_cast<size_t>(variant) + (checked ? 1 : 0)) * 2 + (contiguous ? 1 : 0);
  TORCH_CHECK(table < spec.functions.size(), "pnex: kernel '", spec.kernel, "': no variant ", std::to_string(variant));
  std::atomic<CUfunction>& slot = (*spec.functions[table])[device];
  CUfunction loaded = slot.load(std::memory_order_acquire);
  if (loaded) return loaded;
  std::lock_guard<std::mutex> lock(spec.mutex);
  loaded = slot.load(std::memory_order_acquire);
  if (loaded) return loaded;
  const Driver& d = driver();
  TORCH_CHECK(d.error.empty(), "pnex: kernel '", spec.kernel, "': ", d.error);
  auto image = std::make_shared<std::string>();
  std::string entry;
  {
    py::gil_scoped_acquire gil;
    auto result = spec.get_image(device, contiguous, variant, checked).cast<std::tuple<py::bytes, std::string>>();
    *image = std::string(std::get<0>(result));  // cubin, or NUL-terminated PTX
    entry = std::get<1>(result);
  }
  spec.images.push_back(image);
  CUmodule module = nullptr;
  CUresult r = d.moduleLoadData(&module, image->data());
  std::string hint;
  if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_INVALID_PTX) {
    hint = ". There is no cubin for this GPU's architecture, so the driver compiled the kernel's PTX and could not "
           "(PTX from a newer CUDA than the driver's): install nvJitLink (pip install nvidia-nvjitlink) so that pnex "
           "links a cubin itself, or update the NVIDIA driver";
  } else if (is_fault(r)) {
    hint = fault_hint(device < kMaxDevices ? g_last_kernel[device].load(std::memory_order_relaxed) : nullptr);
  }
  TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", spec.kernel, "': loading its code on cuda:", std::to_string(device),
              " failed: ", cu_error(r), hint);
  CUfunction fn = nullptr;
  r = d.moduleGetFunction(&fn, module, entry.c_str());
  TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", spec.kernel, "': entry not found: ", cu_error(r));
  slot.store(fn, std::memory_order_release);
  return fn;
}

// ---------------------------------------------------------------- autotuning
// The tuner's own calls launch one candidate, forced on the calling thread.
thread_local std::string t_forced_op;
thread_local int t_forced_candidate = -1;

void force_candidate(const std::string& op_name, int candidate) {
  t_forced_op = op_name;
  t_forced_candidate = candidate;
}

// Launches of one op on this thread run its checked variant (the %%pnex magic's first run).
thread_local std::string t_forced_check;

void force_checked(const std::string& op_name) { t_forced_check = op_name; }

constexpr int64_t kRecordSlots = 16;  // pnex_magic.checked.RECORD_SIZE

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

// The candidate block for this call: forced (the tuner's runs), else the table's
// choice for the call's key, else Python's (pnex_magic.launch.autotune.choose), which
// benchmarks unless the stream is capturing (args are then not passed).
int select_block(Spec& spec, const Values& v, c10::ArrayRef<c10::IValue> args, int device, bool contiguous,
                 CUstream stream) {
  const int count = static_cast<int>(spec.candidates.size());
  if (count <= 1 || !spec.choose || spec.choose.is_none()) return 0;
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
    int64_t value = evaluate(spec.key[i], v, spec, spec.key_text[i]);
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
  driver().streamIsCapturing(stream, &status);
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
      auto result = spec.choose(device, contiguous, key, call_args).cast<std::tuple<int, bool>>();
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

// Blocks per axis for `block`; returns the first axis over CUDA's grid limits, or -1.
int grid_for(const Spec& spec, const int64_t* n, const std::array<unsigned, 3>& block, std::array<unsigned, 3>& grid,
             int64_t& blocks_over) {
  for (size_t axis = 0; axis < spec.n_threads.size(); ++axis) {
    const int64_t blocks = (n[axis] + block[axis] - 1) / block[axis];
    if (blocks > (axis == 0 ? 2147483647LL : 65535LL)) {
      blocks_over = blocks;
      return static_cast<int>(axis);
    }
    grid[axis] = static_cast<unsigned>(blocks);
  }
  return -1;
}

// ---------------------------------------------------------------- the kernel
class PnexKernel final : public c10::OperatorKernel {
 public:
  explicit PnexKernel(std::shared_ptr<Spec> spec) : spec_(std::move(spec)) {}

  void operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
    Spec& spec = *spec_;
    const size_t nargs = spec.arguments.size();
    const size_t nparams = spec.params.size();
    TORCH_CHECK(stack->size() >= nargs, "pnex: ", spec.kernel, "() was called with ", std::to_string(stack->size()),
                " argument(s) on the dispatcher's stack; it takes ", std::to_string(nargs));
    auto args = torch::jit::last(*stack, nargs);

    Values v;
    v.tensors.assign(nparams, nullptr);
    v.ints.assign(nparams, 0);
    c10::SmallVector<at::Tensor, 4> outs;  // the outputs; inputs are read in place on the stack

    std::optional<c10::Device> device;
    int first = -1;
    bool contiguous = true;
    for (size_t a = 0; a < nargs; ++a) {
      const int pi = spec.arguments[a];
      const Param& p = spec.params[pi];
      const c10::IValue& iv = args[a];
      if (p.kind == SCALAR_PARAM) {
        if (iv.isInt()) v.ints[pi] = iv.toInt();
        else if (iv.isBool()) v.ints[pi] = iv.toBool();
        continue;
      }
      const at::Tensor& t = iv.toTensor();
      contiguous = contiguous && t.is_contiguous();
      TORCH_CHECK_TYPE(t.scalar_type() == p.dtype, "pnex: ", spec.kernel, "(): argument '", p.name,
                       "' must be a ", dtype_name(p.dtype), " tensor, got ", dtype_name(t.scalar_type()));
      TORCH_CHECK_VALUE(t.dim() == p.ndim, "pnex: ", spec.kernel, "(): argument '", p.name, "' must have ",
                        std::to_string(p.ndim), " dimension(s) ", p.describe, ", got ", std::to_string(t.dim()), " with shape ",
                        shape_str(t.sizes()));
      if (!device) {
        device = t.device();
        first = pi;
      } else {
        TORCH_CHECK_TYPE(t.device() == *device, "pnex: ", spec.kernel, "(): argument '", p.name, "' is on ",
                         t.device().str(), " but '", spec.params[first].name, "' is on ", device->str(),
                         "; all tensor arguments must be on one device");
      }
      v.tensors[pi] = &t;
    }
    TORCH_CHECK(device && device->is_cuda(), "pnex: ", spec.kernel, "(): the GPU launcher needs CUDA tensors");
    for (size_t a = 0; a < nargs; ++a) {
      const int pi = spec.arguments[a];
      const Param& p = spec.params[pi];
      if (p.kind == SCALAR_PARAM) continue;
      const at::Tensor& t = *v.tensors[pi];
      for (int64_t axis = 0; axis < p.ndim; ++axis) {
        if (!p.shape[axis]) continue;
        const int64_t expected = evaluate(*p.shape[axis], v, spec, p.shape_text[axis]);
        TORCH_CHECK_VALUE(t.size(axis) == expected, "pnex: ", spec.kernel, "(): argument '", p.name,
                          "' must have size ", p.shape_text[axis], " = ", std::to_string(expected), " on axis ",
                          std::to_string(axis), ", got ", std::to_string(t.size(axis)), " (shape ", shape_str(t.sizes()), ")");
      }
    }
    // As torch's in-place operators: an InMut must not have two elements in one location,
    // nor share memory with another argument (unless declared may_alias).
    for (const auto& [pi, message] : spec.internal_overlap) {
      TORCH_CHECK_VALUE(at::has_internal_overlap(*v.tensors[pi]) != at::MemOverlap::Yes, "pnex: ", message);
    }
    for (const auto& [written, other, message] : spec.overlap) {
      const at::MemOverlapStatus status = at::get_overlap_status(*v.tensors[written], *v.tensors[other]);
      TORCH_CHECK_VALUE(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial, "pnex: ",
                        message);
    }

    c10::cuda::CUDAGuard guard(*device);
    // Outputs straight from PyTorch's caching allocator (what at::empty does on CUDA,
    // without a second trip through the dispatcher), unless PyTorch is asked to fill
    // uninitialised memory.
    const bool fill_empty = at::globalContext().deterministicAlgorithms() &&
                            at::globalContext().deterministicFillUninitializedMemory();
    outs.reserve(spec.outputs.size());  // v.tensors points into it
    for (int pi : spec.outputs) {
      const Param& p = spec.params[pi];
      c10::SmallVector<int64_t, 6> sizes(p.ndim);
      for (int64_t axis = 0; axis < p.ndim; ++axis) {
        sizes[axis] = evaluate(*p.shape[axis], v, spec, p.shape_text[axis]);
        TORCH_CHECK_VALUE(sizes[axis] >= 0, "pnex: ", spec.kernel, "(): output '", p.name, "' would have size ",
                          p.shape_text[axis], " = ", std::to_string(sizes[axis]), " on axis ", std::to_string(axis),
                          "; sizes cannot be negative");
      }
      auto options = at::TensorOptions().dtype(p.dtype).device(*device);
      if (p.has_init) {
        outs.emplace_back(at::full(sizes, p.init, options));
      } else if (fill_empty) {
        outs.emplace_back(at::empty(sizes, options));
      } else {
        outs.emplace_back(at::detail::empty_generic(sizes, c10::cuda::CUDACachingAllocator::get(),
                                                    c10::DispatchKeySet(c10::DispatchKey::CUDA), p.dtype,
                                                    std::nullopt));
      }
      v.tensors[pi] = &outs.back();
    }

    // n_threads for a Tune variant (its values are those of the Tune parameters).
    int64_t n[3] = {1, 1, 1};
    auto threads_for = [&](int variant) {
      bool empty = false;
      if (!spec.tune_params.empty()) {
        const std::vector<int64_t>& values = spec.variants[variant];
        for (size_t t = 0; t < spec.tune_params.size(); ++t) v.ints[spec.tune_params[t]] = values[t];
      }
      for (size_t axis = 0; axis < spec.n_threads.size(); ++axis) {
        n[axis] = evaluate(spec.n_threads[axis], v, spec, spec.n_threads_text[axis]);
        TORCH_CHECK_VALUE(n[axis] >= 0, "pnex: ", spec.kernel, "(): n_threads[", std::to_string(axis), "] = ",
                          spec.n_threads_text[axis], " evaluates to ", std::to_string(n[axis]), ", which is negative");
        if (n[axis] == 0) empty = true;
      }
      return empty;
    };
    const bool empty = threads_for(0);

    if (!empty) {
      const int dev = device->index();
      TORCH_CHECK(driver().error.empty(), "pnex: kernel '", spec.kernel, "': ", driver().error);
      ensure_context(dev, spec.kernel);
      CUstream stream = reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(dev).stream());

      // The block: the default, or the autotuned choice; a choice whose grid exceeds
      // CUDA's limits for this call (the key buckets sizes) gives way to the first
      // candidate that fits.
      std::array<unsigned, 3> grid{1, 1, 1};
      int64_t blocks_over = 0;
      int chosen = select_block(spec, v, args, dev, contiguous, stream);
      if (spec.candidate_variant[chosen] != 0) threads_for(spec.candidate_variant[chosen]);
      int over = grid_for(spec, n, spec.candidates[chosen], grid, blocks_over);
      for (int c = 0; over >= 0 && c < static_cast<int>(spec.candidates.size()); ++c) {
        if (c == chosen) continue;
        threads_for(spec.candidate_variant[c]);
        int64_t ignored = 0;
        if (grid_for(spec, n, spec.candidates[c], grid, ignored) < 0) {
          chosen = c;
          over = -1;
        }
      }
      TORCH_CHECK_VALUE(over < 0, "pnex: ", spec.kernel, "(): the launch needs ", std::to_string(blocks_over),
                        " blocks on axis ", std::to_string(over), ", more than CUDA allows");
      const std::array<unsigned, 3>& block = spec.candidates[chosen];
      const int variant = spec.candidate_variant[chosen];
      // A checked launch (pnex_magic.checked): the checked variant, with a zeroed error
      // record as its last argument, read back after the launch.
      const bool checked = spec.check_always || (!t_forced_check.empty() && t_forced_check == spec.op_name);
      at::Tensor record;
      if (checked) {
        CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
        driver().streamIsCapturing(stream, &status);
        TORCH_CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE, "pnex: kernel '", spec.kernel,
                    "' runs checked launches (check=True, %%pnex --check or PNEX_CHECK=1), which read their error "
                    "record after every launch, so they cannot be captured in a CUDA graph; capture the op defined "
                    "without checks");
        record = at::zeros({kRecordSlots}, at::TensorOptions().dtype(at::kLong).device(*device));
      }

      // Numba's ABI: arrays are (meminfo, parent, nitems, itemsize, data, shape..., strides...).
      c10::SmallVector<uint64_t, 64> slots;
      for (size_t pi = 0; pi < nparams; ++pi) {
        const Param& p = spec.params[pi];
        if (p.kind == SCALAR_PARAM) {
          slots.push_back(pack_scalar(args[spec.arg_of_param[pi]], p.dtype));
        } else if (p.kind == UNUSED) {
          slots.push_back(0);
        } else if (p.kind == TUNE) {
          continue;  // a constant of the variant's code: no slot
        } else {
          const at::Tensor& t = *v.tensors[pi];
          const int64_t item = t.element_size();
          slots.push_back(0);
          slots.push_back(0);
          slots.push_back(static_cast<uint64_t>(t.numel()));
          slots.push_back(static_cast<uint64_t>(item));
          slots.push_back(reinterpret_cast<uint64_t>(t.data_ptr()));
          for (int64_t s : t.sizes()) slots.push_back(static_cast<uint64_t>(s));
          for (int64_t s : t.strides()) slots.push_back(static_cast<uint64_t>(s * item));
        }
      }
      if (checked) {  // Numba's ABI for a 1-D int64 array
        for (uint64_t slot : {uint64_t(0), uint64_t(0), uint64_t(kRecordSlots), uint64_t(8),
                              reinterpret_cast<uint64_t>(record.data_ptr()), uint64_t(kRecordSlots), uint64_t(8)})
          slots.push_back(slot);
      }
      c10::SmallVector<void*, 64> params(slots.size());
      for (size_t i = 0; i < slots.size(); ++i) params[i] = &slots[i];

      CUfunction fn = function_for(spec, dev, contiguous, variant, checked);
      const Driver& d = driver();
      CUresult r = d.launchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream,
                                  params.data(), nullptr);
      const char* previous = dev < kMaxDevices ? g_last_kernel[dev].exchange(spec.interned, std::memory_order_relaxed) : nullptr;
      if (r != CUDA_SUCCESS) {
        std::string hint;
        if (is_fault(r)) hint = fault_hint(previous);
        TORCH_CHECK(false, "pnex: kernel '", spec.kernel, "' could not be launched on cuda:", std::to_string(dev),
                    " (grid ", std::to_string(grid[0]), "x", std::to_string(grid[1]), "x", std::to_string(grid[2]),
                    ", block ", std::to_string(block[0]), "x", std::to_string(block[1]), "x",
                    std::to_string(block[2]), "): ", cu_error(r), hint);
      }
      if (launch_blocking()) {
        CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
        d.streamIsCapturing(stream, &status);
        if (status == CU_STREAM_CAPTURE_STATUS_NONE) {
          r = d.streamSynchronize(stream);
          TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", spec.kernel, "' faulted on cuda:", std::to_string(dev), ": ",
                      cu_error(r));
        }
      }
      if (checked) {
        const at::Tensor host = record.to(at::kCPU);  // waits for the kernel
        const int64_t* values = host.const_data_ptr<int64_t>();
        if (values[0] != 0) {
          std::string message;
          {
            py::gil_scoped_acquire gil;
            py::list items;
            for (int64_t i = 0; i < kRecordSlots; ++i) items.append(py::int_(values[i]));
            message = (!spec.describe || spec.describe.is_none()) ? std::string("an access out of bounds")
                                               : spec.describe(items).cast<std::string>();
          }
          TORCH_CHECK_INDEX(false, "pnex: ", message);
        }
      }
    }

    torch::jit::drop(*stack, nargs);
    for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
  }

 private:
  std::shared_ptr<Spec> spec_;
};

// ---------------------------------------------------------------- registration
c10::ScalarType scalar_type(const std::string& name) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"float16", c10::ScalarType::Half},   {"bfloat16", c10::ScalarType::BFloat16},
      {"float32", c10::ScalarType::Float},  {"float64", c10::ScalarType::Double},
      {"int8", c10::ScalarType::Char},      {"int16", c10::ScalarType::Short},
      {"int32", c10::ScalarType::Int},      {"int64", c10::ScalarType::Long},
      {"uint8", c10::ScalarType::Byte},     {"uint16", c10::ScalarType::UInt16},
      {"uint32", c10::ScalarType::UInt32},  {"uint64", c10::ScalarType::UInt64},
      {"bool", c10::ScalarType::Bool}};
  auto it = types.find(name);
  TORCH_CHECK(it != types.end(), "pnex: unknown dtype ", name);
  return it->second;
}

Program to_program(const py::handle& obj) {
  Program prog;
  for (auto item : obj) {
    auto t = item.cast<std::tuple<int64_t, int64_t, int64_t>>();
    prog.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
  }
  return prog;
}

struct Registration {
  std::unique_ptr<torch::Library> cuda;
  std::unique_ptr<torch::Library> autograd;
  std::unique_ptr<torch::Library> inplace;
};
std::map<std::string, Registration>& registry() {
  static auto* r = new std::map<std::string, Registration>();  // never destroyed: avoids exit-order issues
  return *r;
}

// torch < 2.12 has no hook to let the launcher register before CustomOpDef.__init__ puts its
// Python autograd (and ADInplaceOrView) kernels there, so ours replace them, and the dispatcher
// prints "Overriding a previously registered kernel ..." in every process.  Expected and
// harmless here (dropping ours brings theirs back): while we register, that warning about this
// op is dropped, as torch drops it for its own ADInplaceOrView kernel; every other warning goes
// to the handler that was in place.  (torch warns once per process for all operators.)
class DropOverrideWarning final : public c10::WarningHandler {
 public:
  explicit DropOverrideWarning(const std::string& name)
      : op_("operator: pnex::" + name), previous_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    const std::string& msg = warning.msg();
    const size_t at = msg.find(op_);
    const char next = at == std::string::npos || at + op_.size() >= msg.size() ? '\0' : msg[at + op_.size()];
    if (msg.find("Overriding a previously registered kernel") != std::string::npos && (next == '(' || next == '\n')) {
      return;
    }
    previous_->process(warning);
  }

 private:
  std::string op_;
  c10::WarningHandler* previous_;
};

void unregister_op(const std::string& name) { registry().erase(name); }

// The last pnex kernel launched on a device ("" if none): a fault is reported by CUDA at a
// later call, so Python names this one in its messages.
std::string last_kernel(int device) {
  if (device < 0 || device >= static_cast<int>(kMaxDevices)) return std::string();
  const char* name = g_last_kernel[device].load(std::memory_order_relaxed);
  return name == nullptr ? std::string() : std::string(name);
}

void drop_autograd_fallback(const std::string& name) {
  auto it = registry().find(name);
  if (it != registry().end()) it->second.autograd.reset();
}

// The op's autograd kernel (the Autograd key).  A call in which no tensor argument requires
// grad (or carries a forward-mode gradient) goes straight below autograd, as a native op's
// VariableType kernel does: no grad_fn, nothing to record.  Any other call goes on to torch's
// "not implemented" autograd fallback, which register_autograd puts at AutogradOther for this
// op: the lowest autograd key, which pnex's dense CPU and CUDA tensors never dispatch to
// (AutogradCPU and AutogradCUDA take the Autograd alias's kernel: this one), so only this
// redispatch reaches it.  The fallback walks the schema and allocates on every call; this
// kernel reads a pointer per tensor argument.
//
// With grad mode on, a call whose InMut argument requires grad is refused: autograd cannot see
// the kernel's writes (on a leaf, torch refuses in-place writes; on any other tensor the
// gradients would silently be wrong).  The check runs here, the last point where grad mode is
// the caller's, for every call (the op object, torch.ops.pnex, torch.compile's tracing on fake
// tensors).  pnex_magic.calls.inmut_grad_error makes the error, as it does for the Python
// launchers, so the message and the type (pnex's ArgumentTypeError) are the same; it is
// raised as the Python exception it is.  An op with an InMut argument always takes the
// fallback after the check (it bumps the written tensors' version counters the way torch
// does for such ops).
class AutogradKernel final : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(std::shared_ptr<const Spec> spec) : spec_(std::move(spec)) {
    for (size_t a = 0; a < spec_->arguments.size(); ++a) {
      const int kind = spec_->params[spec_->arguments[a]].kind;
      if (kind == INMUT) inmut_.push_back(a);
      if (kind == IN || kind == INMUT) tensors_.push_back(a);
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const bool grad = c10::GradMode::is_enabled();
    const size_t first = stack->size() - op.schema().arguments().size();
    if (grad) {
      for (size_t a : inmut_) {
        const c10::IValue& value = (*stack)[first + a];
        if (value.isTensor() && value.toTensor().requires_grad()) {
          refuse(spec_->params[spec_->arguments[a]].name, value.toTensor().is_leaf());
        }
      }
    }
    if (inmut_.empty() && plain(*stack, first, grad)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::AutogradOther) | (keys & c10::after_autograd_keyset),
                       stack);
  }

 private:
  // No tensor argument requires grad (with grad mode on) or has a forward-mode gradient.  A
  // tensor with no autograd metadata has neither.
  bool plain(const torch::jit::Stack& stack, size_t first, bool grad) const {
    for (size_t a : tensors_) {
      const c10::IValue& value = stack[first + a];
      if (!value.isTensor()) continue;
      const at::Tensor& t = value.toTensor();
      if (!t.defined() || t.unsafeGetTensorImpl()->autograd_meta() == nullptr) continue;
      if ((grad && t.requires_grad()) || t._fw_grad(/*level=*/0).defined()) return false;
    }
    return true;
  }

  [[noreturn]] void refuse(const std::string& param, bool leaf) const {
    py::gil_scoped_acquire gil;
    py::object error = py::module_::import("pnex_magic.calls").attr("inmut_grad_error")(spec_->kernel, param, leaf);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    throw py::error_already_set();
  }

  std::shared_ptr<const Spec> spec_;
  std::vector<size_t> inmut_;
  std::vector<size_t> tensors_;
};

// The op's C++ autograd kernels (so that a call runs no Python): the kernel above at Autograd,
// torch's "not implemented" fallback at AutogradOther.  One Library holds them, so dropping
// it (an autograd formula attached) drops both.
std::unique_ptr<torch::Library> register_autograd(const std::string& name, const std::shared_ptr<const Spec>& spec) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "pnex", std::nullopt, __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::dispatch(c10::DispatchKey::AutogradOther,
                                          torch::autograd::autogradNotImplementedFallback()));
  lib->impl(name.c_str(), torch::dispatch(c10::DispatchKey::Autograd,
                                          torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(spec))));
  return lib;
}

// The op object's call in C (pnex_magic.op.PnexOp's tp_call slot, installed by
// install_fast_call): a call with all its arguments positional, as many as the op takes, and
// every scalar of a type the op takes as it is, goes straight to the OpOverload's C++ entry,
// with no Python frame (PnexOp.__call__'s frame and checks cost about as much as the whole
// C++ entry's argument handling: benchmarks/overhead.py's "checks" and "frame" columns).
// The object's `_fast` attribute, (entry, number of arguments, ((index, types), ...)) or None,
// says what to call and check; PnexOp keeps it.  Anything else (keywords, a superseded op, a
// scalar to check, Dynamo tracing the op, which reads the class's Python __call__) takes
// the class's Python __call__.  An exception from the entry goes to the object's
// _call_failed(exc, args), which raises the error the Python __call__ would have raised.
ternaryfunc g_python_call = nullptr;
PyTypeObject* g_fast_type = nullptr;

PyObject* fast_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  static PyObject* fast_name = PyUnicode_InternFromString("_fast");
  static PyObject* failed_name = PyUnicode_InternFromString("_call_failed");
  if (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) {
    PyObject* fast = PyObject_GetAttr(self, fast_name);
    if (fast == nullptr) {
      PyErr_Clear();
    } else if (PyTuple_CheckExact(fast) && PyTuple_GET_SIZE(fast) == 3) {
      bool ok = PyTuple_GET_SIZE(args) == PyLong_AsSsize_t(PyTuple_GET_ITEM(fast, 1));
      PyObject* kinds = PyTuple_GET_ITEM(fast, 2);
      for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(kinds); ++k) {
        PyObject* item = PyTuple_GET_ITEM(kinds, k);
        const Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        PyObject* types = PyTuple_GET_ITEM(item, 1);
        PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(args, index)));
        bool found = false;
        for (Py_ssize_t t = 0; !found && t < PyTuple_GET_SIZE(types); ++t) found = PyTuple_GET_ITEM(types, t) == type;
        ok = found;
      }
      if (ok) {
        PyObject* result = PyObject_Call(PyTuple_GET_ITEM(fast, 0), args, nullptr);
        if (result == nullptr) {
          PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
          PyErr_Fetch(&type, &value, &traceback);
          PyErr_NormalizeException(&type, &value, &traceback);
          if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
          if (value == nullptr) {
            PyErr_Restore(type, value, traceback);
          } else {
            result = PyObject_CallMethodObjArgs(self, failed_name, value, args, nullptr);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
          }
        }
        Py_DECREF(fast);
        return result;
      }
    }
    Py_XDECREF(fast);
  }
  return g_python_call(self, args, kwargs);
}

// Give `cls` (PnexOp) the C call above; its Python __call__ stays what Python code, Dynamo
// and the fallback above see.  Idempotent; false if another class already has it.
bool install_fast_call(const py::object& cls) {
  if (!PyType_Check(cls.ptr())) throw py::type_error("install_fast_call: expected a class");
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  if (g_fast_type != nullptr) return g_fast_type == type && type->tp_call == fast_call;
  if (type->tp_call == nullptr) throw py::type_error("install_fast_call: the class defines no __call__");
  g_python_call = type->tp_call;
  g_fast_type = type;
  Py_INCREF(type);  // held for the process: the slot refers to it
  type->tp_call = fast_call;
  return true;
}

// spec: dict with kernel, entry, params (list of dicts), arguments, outputs, n_threads, n_threads_text,
// block, get_image and, for an autotuned op, candidates, key, key_text, key_bucket and choose.  Registers the CUDA kernel (and C++ autograd / ADInplaceOrView fallbacks so that
// nothing Python runs per call) for pnex::<name>.
void register_op(const std::string& name, const py::dict& d, bool autograd_fallback) {
  auto spec = std::make_shared<Spec>();
  spec->kernel = d["kernel"].cast<std::string>();
  bool mutates = false;
  for (auto item : d["params"]) {
    auto pd = item.cast<py::dict>();
    Param p;
    p.name = pd["name"].cast<std::string>();
    p.kind = pd["kind"].cast<int>();
    p.dtype = scalar_type(pd["dtype"].cast<std::string>());
    p.itemsize = pd["itemsize"].cast<int64_t>();
    p.ndim = pd["ndim"].cast<int64_t>();
    p.describe = pd["describe"].cast<std::string>();
    for (auto axis : pd["shape"]) {
      if (axis.is_none()) p.shape.emplace_back(std::nullopt);
      else p.shape.emplace_back(to_program(axis));
    }
    p.shape_text = pd["shape_text"].cast<std::vector<std::string>>();
    if (!pd["init"].is_none()) {
      p.has_init = true;
      p.init = pd["init"].cast<double>();
    }
    if (p.kind == INMUT) mutates = true;
    spec->params.push_back(std::move(p));
  }
  spec->op_name = name;
  spec->interned = intern(spec->kernel);
  spec->arguments = d["arguments"].cast<std::vector<int>>();
  spec->arg_of_param.assign(spec->params.size(), -1);
  for (size_t a = 0; a < spec->arguments.size(); ++a) spec->arg_of_param[spec->arguments[a]] = static_cast<int>(a);
  spec->outputs = d["outputs"].cast<std::vector<int>>();
  for (auto prog : d["n_threads"]) spec->n_threads.push_back(to_program(prog));
  spec->n_threads_text = d["n_threads_text"].cast<std::vector<std::string>>();
  // Block candidates (the first is the default block); an older description has "block" only.
  // A candidate is [x, y, z] or [x, y, z, variant] (the Tune variant it runs).
  auto as_block = [](const py::handle& obj, int* variant) {
    auto sizes = obj.cast<std::vector<unsigned>>();
    std::array<unsigned, 3> block{1, 1, 1};
    for (size_t i = 0; i < 3 && i < sizes.size(); ++i) block[i] = sizes[i];
    *variant = sizes.size() > 3 ? static_cast<int>(sizes[3]) : 0;
    return block;
  };
  int variant = 0;
  if (d.contains("candidates")) {
    for (auto c : d["candidates"]) {
      spec->candidates.push_back(as_block(c, &variant));
      spec->candidate_variant.push_back(variant);
    }
  }
  if (spec->candidates.empty()) {
    spec->candidates.push_back(as_block(d["block"], &variant));
    spec->candidate_variant.push_back(0);
  }
  if (d.contains("tune")) {
    spec->tune_params = d["tune"].cast<std::vector<int>>();
    spec->variants = d["variants"].cast<std::vector<std::vector<int64_t>>>();
  }
  size_t variants = std::max<size_t>(spec->variants.size(), 1);
  for (int cv : spec->candidate_variant) {
    TORCH_CHECK(cv >= 0 && static_cast<size_t>(cv) < variants, "pnex: kernel '", spec->kernel,
                "': a candidate names variant ", std::to_string(cv), " of ", std::to_string(variants));
  }
  for (const auto& values : spec->variants) {
    TORCH_CHECK(values.size() == spec->tune_params.size(), "pnex: kernel '", spec->kernel,
                "': a variant has ", std::to_string(values.size()), " Tune values for ",
                std::to_string(spec->tune_params.size()), " Tune parameters");
  }
  spec->allocate_functions(variants);
  if (spec->candidates.size() > 1) {
    for (auto prog : d["key"]) spec->key.push_back(to_program(prog));
    spec->key_text = d["key_text"].cast<std::vector<std::string>>();
    spec->key_bucket = d["key_bucket"].cast<bool>();
    if (d.contains("choose")) spec->choose = d["choose"];  // without it: the first candidate
  }
  for (auto item : d["internal_overlap"]) spec->internal_overlap.push_back(item.cast<std::pair<int, std::string>>());
  for (auto item : d["overlap"]) spec->overlap.push_back(item.cast<std::tuple<int, int, std::string>>());
  spec->get_image = d["get_image"];
  if (d.contains("describe")) spec->describe = d["describe"];
  if (d.contains("check")) spec->check_always = d["check"].cast<bool>();

  registry().erase(name);
  Registration reg;
  reg.cuda = std::make_unique<torch::Library>(torch::Library::IMPL, "pnex", c10::DispatchKey::CUDA, __FILE__,
                                              __LINE__);
  reg.cuda->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<PnexKernel>(spec)));
  DropOverrideWarning quiet(name);
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  if (autograd_fallback) reg.autograd = register_autograd(name, spec);
  if (mutates) {
    reg.inplace = std::make_unique<torch::Library>(torch::Library::IMPL, "pnex",
                                                   c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
    reg.inplace->impl(name.c_str(), torch::autograd::autogradNotImplementedInplaceOrViewFallback());
  }
  registry()[name] = std::move(reg);
}

std::string driver_error() { return driver().error; }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pnex_magic's generic GPU launcher";
  m.def("register_op", &register_op, py::arg("name"), py::arg("spec"), py::arg("autograd_fallback"));
  m.def("unregister_op", &unregister_op, py::arg("name"));
  m.def("drop_autograd_fallback", &drop_autograd_fallback, py::arg("name"));
  m.def("driver_error", &driver_error);
  m.def("force_candidate", &force_candidate, py::arg("op_name"), py::arg("candidate"),
        "Calls of op_name on this thread launch candidate `candidate` (-1: choose as usual)");
  m.def("last_kernel", &last_kernel, py::arg("device"));
  m.def("install_fast_call", &install_fast_call, py::arg("cls"),
        "Give the op class a C call slot that goes straight to each object's `_fast` entry");
  m.def("force_checked", &force_checked, py::arg("op_name"),
        "Launches of op_name on this thread run its checked variant (\"\": none)");
}
