// pnex_magic's C++ launcher: one call, from the dispatcher to cuLaunchKernel.
//
// PnexKernel is the op's CUDA kernel at the dispatcher.  In the order a call meets them:
//
// * the postfix programs: a shape check, an output's size, n_threads and the autotune key
//   are each a small program (pnex_magic.expressions compiles them, and
//   pnex_magic.launch.description hands them over), evaluated on the call's sizes and
//   integer scalars;
// * the argument checks, those of the Python launchers (pnex_magic.calls) with the same
//   messages: dtype, rank, one device, each declared size, and, as torch's in-place
//   operators, no InMut with two elements in one location nor sharing memory with another
//   argument (unless declared may_alias);
// * the outputs, from PyTorch's caching allocator on the inputs' device; the launch
//   candidate (launcher_autotune.cpp); the kernel's code for the device, loaded on first
//   use (with its dynamic shared memory checked and opted in, shared_memory.h); Numba's
//   kernel ABI; cuLaunchKernel on PyTorch's current stream (so CUDA graphs and
//   torch.compile(mode="reduce-overhead") capture it);
// * checked launches (pnex_magic.checking): the kernel's checked variant with a zeroed
//   error record as its last argument, read back after the launch: every launch of an op
//   defined with check=True, and those of the op force_checked names on this thread (the
//   %%pnex magic's first run on its --args);
// * hidden arguments (launcher_hidden.h): the device arrays the kernel reads as globals,
//   passed after its parameters (and the record), the same tensors at every launch.
//
// These three concerns share one translation unit: each unit of the launcher pays 4-6 s
// of CPU for the torch headers it includes (2026-11-25, g++ 12), and these three need the
// same ones, so apart they cost 16 s of CPU where together they cost 7 s, on machines of
// two cores (Colab) as everywhere (benchmarks/launcher_build.py).

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstring>
#include <map>

#include "cooperative.h"
#include "launcher.h"
#include "launcher_hidden.h"
#include "shared_memory.h"

namespace pnex::launcher {

// ---------------------------------------------------------------- programs

namespace {
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
}  // namespace

int64_t evaluate(const Program& prog, const Values& v, const std::string& kernel, const std::string& what) {
  int64_t stack[64];
  int sp = 0;
  for (const Instr& ins : prog) {
    switch (ins.op) {
      case CONST: stack[sp++] = ins.a; break;
      case SIZE: stack[sp++] = v.tensors[ins.a]->size(ins.b); break;
      case NUMEL: stack[sp++] = v.tensors[ins.a]->numel(); break;
      case SCALAR: stack[sp++] = v.ints[ins.a]; break;
      case NEG: stack[sp - 1] = -stack[sp - 1]; break;
      case NOT: stack[sp - 1] = stack[sp - 1] == 0; break;
      default: {
        int64_t r = stack[--sp];
        int64_t l = stack[sp - 1];
        int64_t out = 0;
        if ((ins.op == FLOORDIV || ins.op == MOD) && r == 0) {
          TORCH_CHECK_VALUE(false, "pnex: ", kernel, "(): division by zero while evaluating ", what);
        }
        switch (ins.op) {
          case ADD: out = l + r; break;
          case SUB: out = l - r; break;
          case MUL: out = l * r; break;
          case FLOORDIV: out = floordiv(l, r); break;
          case MOD: out = pymod(l, r); break;
          case MIN: out = std::min(l, r); break;
          case MAX: out = std::max(l, r); break;
          case LT: out = l < r; break;
          case LE: out = l <= r; break;
          case GT: out = l > r; break;
          case GE: out = l >= r; break;
          case EQ: out = l == r; break;
          case NE: out = l != r; break;
          case AND: out = l != 0 && r != 0; break;
          case OR: out = l != 0 || r != 0; break;
          default: TORCH_CHECK(false, "pnex: bad opcode ", std::to_string(ins.op));
        }
        stack[sp - 1] = out;
      }
    }
  }
  return stack[0];
}

std::string broken_rule(const std::vector<Rule>& rules, const Values& v, const std::string& kernel) {
  for (size_t i = 0; i < rules.size(); ++i) {
    const Rule& rule = rules[i];
    if (evaluate(rule.condition, v, kernel, rule.text) != 0) continue;
    std::string shown;
    for (const auto& [text, program] : rule.terms) {
      shown += (shown.empty() ? "" : ", ") + text + " = " + std::to_string(evaluate(program, v, kernel, text));
    }
    return kernel + "(): the call breaks requires[" + std::to_string(i) + "] `" + rule.text + "`" +
           (shown.empty() ? "" : " (" + shown + ")") + (rule.why.empty() ? "" : ": " + rule.why);
  }
  return "";
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

std::string shape_str(c10::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  if (sizes.size() == 1) out += ",";
  return out + ")";
}

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

// ---------------------------------------------------------------- argument checks

std::pair<c10::Device, bool> check_arguments(const Spec& spec, c10::ArrayRef<c10::IValue> args, Values& v) {
  const size_t nargs = spec.arguments.size();
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
    if (p.lanes > 1) {  // a record dtype: `lanes` words per record on a dense last axis
      TORCH_CHECK_VALUE(t.dim() == p.ndim + 1 && t.size(-1) == p.lanes && t.stride(-1) == 1, "pnex: ",
                        p.record_message, ", got shape ", shape_str(t.sizes()), " with strides ",
                        shape_str(t.strides()));
    } else {
      TORCH_CHECK_VALUE(t.dim() == p.ndim, "pnex: ", spec.kernel, "(): argument '", p.name, "' must have ",
                        std::to_string(p.ndim), " dimension(s) ", p.describe, ", got ", std::to_string(t.dim()),
                        " with shape ", shape_str(t.sizes()));
    }
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
      const int64_t expected = evaluate(*p.shape[axis], v, spec.kernel, p.shape_text[axis]);
      TORCH_CHECK_VALUE(t.size(axis) == expected, "pnex: ", spec.kernel, "(): argument '", p.name,
                        "' must have size ", p.shape_text[axis], " = ", std::to_string(expected), " on axis ",
                        std::to_string(axis), ", got ", std::to_string(t.size(axis)), " (shape ",
                        shape_str(t.sizes()), ")");
    }
  }
  for (const auto& [pi, message] : spec.internal_overlap) {
    TORCH_CHECK_VALUE(at::has_internal_overlap(*v.tensors[pi]) != at::MemOverlap::Yes, "pnex: ", message);
  }
  for (const auto& [written, other, message] : spec.overlap) {
    const at::MemOverlapStatus status = at::get_overlap_status(*v.tensors[written], *v.tensors[other]);
    TORCH_CHECK_VALUE(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial, "pnex: ",
                      message);
  }
  const std::string broken = broken_rule(spec.rules, v, spec.kernel);  // jit(requires=...)
  TORCH_CHECK_VALUE(broken.empty(), "pnex: ", broken);
  return {*device, contiguous};
}

// ---------------------------------------------------------------- checked launches
namespace {
thread_local std::string t_forced_check;
}  // namespace

void force_checked(const std::string& op_name) { t_forced_check = op_name; }

bool checked_launch(const Spec& spec) {
  return spec.check_always || (!t_forced_check.empty() && t_forced_check == spec.op_name);
}

at::Tensor error_record(const Spec& spec, c10::Device device, CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  pnex::driver().streamIsCapturing(stream, &status);
  TORCH_CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE, "pnex: kernel '", spec.kernel,
              "' runs checked launches (check=True, %%pnex --check or PNEX_CHECK=1), which read their error "
              "record after every launch, so they cannot be captured in a CUDA graph; capture the op defined "
              "without checks");
  return at::zeros({kRecordSlots}, at::TensorOptions().dtype(at::kLong).device(device));
}

void raise_violation(const Spec& spec, const at::Tensor& record) {
  const at::Tensor host = record.to(at::kCPU);  // waits for the kernel
  const int64_t* values = host.const_data_ptr<int64_t>();
  if (values[0] == 0) return;
  TORCH_CHECK_INDEX(false, "pnex: ", describe_violation(spec, values));
}

namespace {

// Numba's ABI for an array: (meminfo, parent, nitems, itemsize, data, shape..., strides... in bytes).
// lanes > 1: a record dtype, whose tensor's last axis holds the words of each record (itemsize
// `lanes` words, and that axis not an axis of the array).
void pack_array(const at::Tensor& t, int64_t lanes, c10::SmallVector<uint64_t, 64>& slots) {
  const int64_t item = t.element_size();
  const int64_t axes = t.dim() - (lanes > 1 ? 1 : 0);
  slots.push_back(0);
  slots.push_back(0);
  slots.push_back(static_cast<uint64_t>(t.numel() / lanes));
  slots.push_back(static_cast<uint64_t>(item * lanes));
  slots.push_back(reinterpret_cast<uint64_t>(t.data_ptr()));
  for (int64_t axis = 0; axis < axes; ++axis) slots.push_back(static_cast<uint64_t>(t.size(axis)));
  for (int64_t axis = 0; axis < axes; ++axis) slots.push_back(static_cast<uint64_t>(t.stride(axis) * item));
}

}  // namespace

// ---------------------------------------------------------------- hidden arguments

void append_hidden(const Spec& spec, c10::Device device, c10::SmallVector<uint64_t, 64>& slots) {
  if (!spec.hidden) return;
  for (const HiddenArray& h : spec.hidden->arrays) {
    const at::Tensor& t = h.tensor;
    // The messages of pnex_magic.launch.hidden (the Python launchers').
    TORCH_CHECK_TYPE(t.device() == device, "pnex: ", spec.kernel, "(): the kernel reads the global '", h.name,
                     "', a tensor on ", t.device().str(), ", but this call's tensors are on ", device.str(),
                     "; pnex passes such a global to the kernel as it is (a hidden argument, never copied). Keep it "
                     "on the device of the calls (move it there and define the kernel again), or pass it as a "
                     "parameter");
    const bool same = t.scalar_type() == h.dtype && t.dim() == h.ndim && (!h.contiguous || t.is_contiguous());
    TORCH_CHECK(same, "pnex: ", spec.kernel, "(): the kernel reads the global '", h.name, "', which was a ",
                h.describe, " array when the kernel was defined and is now ", dtype_name(t.scalar_type()), ", ",
                std::to_string(t.dim()), "-D, ", t.is_contiguous() ? "contiguous" : "strided",
                "; its code was compiled for the former. Define the kernel again (re-run its definition)");
    pack_array(t, 1, slots);
  }
}

// ---------------------------------------------------------------- the call

namespace {

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
  auto [code, entry] = kernel_image(spec, device, contiguous, variant, checked);
  auto image = std::make_shared<std::string>(std::move(code));  // cubin, or NUL-terminated PTX
  spec.images.push_back(image);
  CUmodule module = nullptr;
  CUresult r = d.moduleLoadData(&module, image->data());
  std::string hint;
  if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION || r == CUDA_ERROR_INVALID_PTX) {
    hint = ". There is no cubin for this GPU's architecture, so the driver compiled the kernel's PTX and could not "
           "(PTX from a newer CUDA than the driver's): install nvJitLink (pip install nvidia-nvjitlink) so that pnex "
           "links a cubin itself, or update the NVIDIA driver";
  } else if (is_fault(r)) {
    hint = fault_hint(last_kernel_on(device));
  }
  TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", spec.kernel, "': loading its code on cuda:", std::to_string(device),
              " failed: ", cu_error(r), hint);
  CUfunction fn = nullptr;
  r = d.moduleGetFunction(&fn, module, entry.c_str());
  TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", spec.kernel, "': entry not found: ", cu_error(r));
  if (spec.shared_bytes(variant) > 0) {  // refused above the device's limit, opted in above 48 KiB
    CUdevice cu_device = 0;
    r = d.deviceGet(&cu_device, device);
    TORCH_CHECK(r == CUDA_SUCCESS, "pnex: kernel '", spec.kernel, "': cannot find cuda:", std::to_string(device), ": ",
                cu_error(r));
    const std::string problem =
        prepare_shared(spec.kernel, fn, cu_device, spec.shared_bytes(variant), "cuda:" + std::to_string(device));
    TORCH_CHECK(problem.empty(), "pnex: ", problem);
  }
  slot.store(fn, std::memory_order_release);
  return fn;
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

// The outputs, straight from PyTorch's caching allocator (what at::empty does on CUDA,
// without a second trip through the dispatcher), unless PyTorch is asked to fill
// uninitialised memory; `v` points at them.
void allocate_outputs(const Spec& spec, c10::Device device, Values& v, c10::SmallVector<at::Tensor, 4>& outs) {
  const bool fill_empty = at::globalContext().deterministicAlgorithms() &&
                          at::globalContext().deterministicFillUninitializedMemory();
  outs.reserve(spec.outputs.size());  // v.tensors points into it
  for (int pi : spec.outputs) {
    const Param& p = spec.params[pi];
    c10::SmallVector<int64_t, 6> sizes(p.ndim);
    for (int64_t axis = 0; axis < p.ndim; ++axis) {
      sizes[axis] = evaluate(*p.shape[axis], v, spec.kernel, p.shape_text[axis]);
      TORCH_CHECK_VALUE(sizes[axis] >= 0, "pnex: ", spec.kernel, "(): output '", p.name, "' would have size ",
                        p.shape_text[axis], " = ", std::to_string(sizes[axis]), " on axis ", std::to_string(axis),
                        "; sizes cannot be negative");
    }
    auto options = at::TensorOptions().dtype(p.dtype).device(device);
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
}

}  // namespace

void PnexKernel::operator()(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack* stack) {
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
  const auto [device, contiguous] = check_arguments(spec, args, v);

  c10::cuda::CUDAGuard guard(device);
  allocate_outputs(spec, device, v, outs);

  // n_threads for a Tune variant (its values are those of the Tune parameters).
  int64_t n[3] = {1, 1, 1};
  auto threads_for = [&](int variant) {
    bool empty = false;
    if (!spec.tune_params.empty()) {
      const std::vector<int64_t>& values = spec.variants[variant];
      for (size_t t = 0; t < spec.tune_params.size(); ++t) v.ints[spec.tune_params[t]] = values[t];
    }
    for (size_t axis = 0; axis < spec.n_threads.size(); ++axis) {
      n[axis] = evaluate(spec.n_threads[axis], v, spec.kernel, spec.n_threads_text[axis]);
      TORCH_CHECK_VALUE(n[axis] >= 0, "pnex: ", spec.kernel, "(): n_threads[", std::to_string(axis), "] = ",
                        spec.n_threads_text[axis], " evaluates to ", std::to_string(n[axis]), ", which is negative");
      if (n[axis] == 0) empty = true;
    }
    return empty;
  };
  const bool empty = threads_for(0);

  if (!empty) {
    const int dev = device.index();
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
    if (spec.cluster[0]) {  // thread-block clusters: launched only whole (pnex_magic/clusters.py, same words)
      std::string bad;
      for (int axis = 0; axis < 3; ++axis) {
        if (grid[axis] % spec.cluster[axis] == 0) continue;
        bad += std::string(bad.empty() ? "" : ", ") + "xyz"[axis] + ": " + std::to_string(grid[axis]) +
               " blocks, not a multiple of " + std::to_string(spec.cluster[axis]);
      }
      auto dims = [](const auto& d, const char* sep) {
        return std::to_string(d[0]) + sep + std::to_string(d[1]) + sep + std::to_string(d[2]);
      };
      TORCH_CHECK_VALUE(bad.empty(), spec.kernel, "(): the grid (", dims(grid, " x "),
                        " blocks) is not a whole number of clusters of cluster_dims=(", dims(spec.cluster, ", "),
                        ") (", bad, "); the GPU launches clusters only whole. Give n_threads a multiple of "
                        "cluster_dims x threads_per_block on each axis (or pad the problem)");
    }
    const std::array<unsigned, 3>& block = spec.candidates[chosen];
    const int variant = spec.candidate_variant[chosen];
    // A checked launch: the checked variant, with a zeroed error record as its last
    // argument, read back after the launch.
    const bool checked = checked_launch(spec);
    at::Tensor record;
    if (checked) record = error_record(spec, device, stream);

    // Numba's ABI: arrays are (meminfo, parent, nitems, itemsize, data, shape..., strides...).
    c10::SmallVector<uint64_t, 64> slots;
    c10::SmallVector<at::Tensor, 1> seeds;  // alive until the launch is queued
    for (size_t pi = 0; pi < nparams; ++pi) {
      const Param& p = spec.params[pi];
      if (p.kind == SCALAR_PARAM) {
        slots.push_back(pack_scalar(args[spec.arg_of_param[pi]], p.dtype));
      } else if (p.kind == UNUSED) {
        slots.push_back(0);
      } else if (p.kind == TUNE) {
        continue;  // a constant of the variant's code: no slot
      } else if (p.kind == SEED) {
        // pnex.random's seed: drawn from PyTorch's generator of the device for this call (one random_(),
        // which a CUDA graph replays with a new value), except in the tuner's own runs, which compare
        // candidates on one fixed seed and leave the generator as it was.
        auto options = at::TensorOptions().dtype(at::kLong).device(device);
        seeds.push_back(tuning_call(spec) ? at::zeros({1}, options)
                                          : at::empty({1}, options).random_(INT64_MIN, std::optional<int64_t>()));
        pack_array(seeds.back(), 1, slots);
      } else {
        pack_array(*v.tensors[pi], p.lanes, slots);
      }
    }
    if (checked) pack_array(record, 1, slots);  // the error record, a 1-D int64 array
    append_hidden(spec, device, slots);  // the device arrays the kernel reads as globals, last
    c10::SmallVector<void*, 64> params(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) params[i] = &slots[i];

    CUfunction fn = function_for(spec, dev, contiguous, variant, checked);
    const unsigned shared = static_cast<unsigned>(spec.shared_bytes(variant));  // cuda.shared.array(0, dtype)
    const Driver& d = driver();
    CUresult r;
    if (spec.cooperative) {  // a grid sync: every block resident at once, or a clear refusal
      CUdevice cu_device = 0;
      d.deviceGet(&cu_device, dev);
      const std::string problem = cooperative_problem(spec.kernel, fn, cu_device, grid.data(), block.data(), shared);
      TORCH_CHECK(problem.empty(), "pnex: ", problem);
      r = d.launchCooperativeKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream,
                                    params.data());
    } else {
      r = d.launchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params.data(),
                         nullptr);
    }
    const char* previous = swap_last_kernel(dev, spec.interned);
    if (r != CUDA_SUCCESS) {
      std::string hint;
      if (is_fault(r)) hint = fault_hint(previous);
      TORCH_CHECK(false, "pnex: kernel '", spec.kernel, "' could not be launched on cuda:", std::to_string(dev),
                  " (grid ", std::to_string(grid[0]), "x", std::to_string(grid[1]), "x", std::to_string(grid[2]),
                  ", block ", std::to_string(block[0]), "x", std::to_string(block[1]), "x",
                  std::to_string(block[2]), shared ? ", " + std::to_string(shared) + " B dynamic shared memory" : "",
                  "): ", cu_error(r), hint);
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
    if (checked) raise_violation(spec, record);
  }

  torch::jit::drop(*stack, nargs);
  for (at::Tensor& t : outs) stack->emplace_back(std::move(t));
}

}  // namespace pnex::launcher
