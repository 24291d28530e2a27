// pnex_magic's XLA FFI handler: pnex kernels launched by XLA, inside jax.jit.
//
// One plain shared library, compiled once per environment against the headers that
// ship with jaxlib (jax.ffi.include_dir()) and cuda.h, serves every pnex kernel.
// Python (pnex_magic/launch/xla.py) registers each kernel under an integer id, with its
// parameter table and its code per GPU architecture, before XLA compiles a call of it.
//
// The handler is stateful, in two XLA FFI stages:
//
// * instantiate (once per call site, when XLA builds the executable, outside any
//   stream or CUDA graph): reads the call's five attributes (the kernel id, the grid
//   and the block fixed when the JAX function was traced, the scalar arguments packed
//   into 8-byte slots, and a fill per result), finds the kernel, and loads its code into
//   the primary context of every device whose primary context is active (XLA's and
//   PyTorch's contexts are the primary ones), so that no module is loaded while a
//   stream is captured into a CUDA graph.  The LaunchState it returns is owned by XLA.
// * execute (every call): one relaxed array read finds what the first call on this
//   device validated (the function in the context of XLA's stream, and whether that
//   context is current, as XLA normally makes it; its dynamic shared memory checked and
//   opted in when it was loaded, shared_memory.h); then the arguments are packed in
//   Numba's kernel ABI, an Out(init=...) result is filled by cuMemsetD8/16/32Async on
//   XLA's stream, and cuLaunchKernel runs the kernel on it.  No lock, no map lookup, no
//   driver query on this path: the handler is marked command-buffer compatible
//   (xla::ffi::Traits::kCmdBufferCompatible), so XLA may record it into a CUDA graph.
//
// The parameter table has four int64 entries per kernel parameter, in declaration
// order: kind (pnex_magic.launch.description.KINDS), index, rank, item size.  The index
// of an In parameter is its operand; of an InMut or Out parameter, its result (an InMut
// result aliases its operand; an Out(init=...) whose value no memset pattern expresses
// aliases an operand XLA filled); of a Scalar, its slot in the scalars attribute.  XLA
// buffers are dense and row-major, so the code is the kernel's C-contiguous variant and
// strides follow from the sizes.  The fill attribute holds two entries per result: the
// memset width in bytes (0: no fill; 1, 2 or 4) and the bit pattern.
//
// The CUDA driver is reached through dlopen("libcuda.so.1") (cuda_driver.h): no nvcc,
// no link to libcuda, and the library loads on machines without a GPU.

#include "cuda_driver.h"
#include "cooperative.h"
#include "shared_memory.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

enum Kind : int64_t { IN = 0, INMUT = 1, OUT = 2, SCALAR = 3, UNUSED = 4, TUNE = 5 };

struct Param {
  int64_t kind, index, ndim, itemsize;
};

struct Image {
  std::string code;  // cubin, or NUL-terminated PTX
  std::string entry;
};

struct Loaded {
  CUcontext context = nullptr;
  CUfunction function = nullptr;
};

struct Kernel {
  std::string name;  // the user's kernel name, for messages (fixed at registration)
  std::vector<Param> params;  // fixed at registration
  std::atomic<bool> cooperative{false};  // it synchronises its grid (pnex_jax_set_cooperative)
  std::atomic<int64_t> shared{0};  // bytes of dynamic shared memory per block (pnex_jax_set_shared)
  std::mutex mutex;  // guards images and loaded
  std::map<int64_t, Image> images;  // by architecture, 10 * major + minor
  std::vector<Loaded> loaded;  // by context
};

std::mutex g_mutex;
std::unordered_map<int64_t, std::shared_ptr<Kernel>>& kernels() {
  static auto* k = new std::unordered_map<int64_t, std::shared_ptr<Kernel>>();  // never destroyed
  return *k;
}

std::shared_ptr<Kernel> find_kernel(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = kernels().find(id);
  return it == kernels().end() ? nullptr : it->second;
}

// Driver entry points only this handler uses (looked up beside cuda_driver.h's).
struct Extra {
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGetCount) deviceGetCount = nullptr;
  decltype(&::cuDevicePrimaryCtxGetState) primaryCtxGetState = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) primaryCtxRelease = nullptr;
  decltype(&::cuMemsetD8Async) memsetD8Async = nullptr;
  decltype(&::cuMemsetD16Async) memsetD16Async = nullptr;
  decltype(&::cuMemsetD32Async) memsetD32Async = nullptr;
  std::string error;
};

const Extra& extra() {
  static Extra e = [] {
    Extra e;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      e.error = "the CUDA driver library (libcuda.so.1) cannot be loaded: is an NVIDIA driver installed?";
      return e;
    }
    pnex::detail::bind(lib, "cuInit", e.init, e.error);
    pnex::detail::bind(lib, "cuDeviceGetCount", e.deviceGetCount, e.error);
    pnex::detail::bind(lib, "cuDevicePrimaryCtxGetState", e.primaryCtxGetState, e.error);
    pnex::detail::bind(lib, "cuDevicePrimaryCtxRelease_v2", e.primaryCtxRelease, e.error);
    pnex::detail::bind(lib, "cuMemsetD8Async", e.memsetD8Async, e.error);
    pnex::detail::bind(lib, "cuMemsetD16Async", e.memsetD16Async, e.error);
    pnex::detail::bind(lib, "cuMemsetD32Async", e.memsetD32Async, e.error);
    return e;
  }();
  return e;
}

ffi::Error fail(const Kernel& kernel, const std::string& what) {
  return ffi::Error::Internal("pnex: kernel '" + kernel.name + "': " + what);
}

// Makes `context` current on this thread for the scope, if it is not already.
class ContextScope {
 public:
  explicit ContextScope(CUcontext context) {
    const pnex::Driver& d = pnex::driver();
    CUcontext current = nullptr;
    d.ctxGetCurrent(&current);
    if (current != context) {
      result_ = d.ctxPushCurrent(context);
      pushed_ = result_ == CUDA_SUCCESS;
    }
  }
  ~ContextScope() {
    if (pushed_) {
      CUcontext popped = nullptr;
      pnex::driver().ctxPopCurrent(&popped);
    }
  }
  CUresult result() const { return result_; }

 private:
  bool pushed_ = false;
  CUresult result_ = CUDA_SUCCESS;
};

// The kernel's function in `context`, loading its code there on first use.  The
// caller holds kernel.mutex.
ffi::ErrorOr<CUfunction> load_locked(Kernel& kernel, CUcontext context, const std::string& where) {
  for (const Loaded& l : kernel.loaded) {
    if (l.context == context) return l.function;
  }
  const pnex::Driver& d = pnex::driver();
  ContextScope scope(context);
  if (scope.result() != CUDA_SUCCESS) {
    return ffi::Unexpected(fail(kernel, "cannot make the context of " + where + " current: " + pnex::cu_error(scope.result())));
  }
  CUdevice dev = 0;
  int major = 0, minor = 0;
  CUresult r = d.ctxGetDevice(&dev);
  if (r == CUDA_SUCCESS) r = d.deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == CUDA_SUCCESS) r = d.deviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "cannot query " + where + ": " + pnex::cu_error(r)));
  auto image = kernel.images.find(10 * major + minor);
  if (image == kernel.images.end()) {
    std::string have;
    for (const auto& entry : kernel.images) have += (have.empty() ? "sm_" : ", sm_") + std::to_string(entry.first);
    return ffi::Unexpected(fail(kernel, "no code for sm_" + std::to_string(10 * major + minor) + " (" + where +
                                            "); it was compiled for " +
                                            (have.empty() ? std::string("no architecture") : have) +
                                            ". Call the JAX function again after the GPU is visible to JAX"));
  }
  CUmodule module = nullptr;
  r = d.moduleLoadData(&module, image->second.code.data());
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "loading its code on " + where + " failed: " + pnex::cu_error(r)));
  CUfunction function = nullptr;
  r = d.moduleGetFunction(&function, module, image->second.entry.c_str());
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "entry not found: " + pnex::cu_error(r)));
  // Dynamic shared memory: refused above the device's limit, opted in above 48 KiB (once per load).
  const std::string problem = pnex::prepare_shared(kernel.name, function, dev, kernel.shared.load(), where);
  if (!problem.empty()) return ffi::Unexpected(ffi::Error::InvalidArgument("pnex: " + problem));
  kernel.loaded.push_back({context, function});
  return function;
}

// Load the kernel into the primary context of every device where that context is
// active (best effort: what fails here is reported by the first call on the device).
void preload(Kernel& kernel) {
  const pnex::Driver& d = pnex::driver();
  const Extra& e = extra();
  if (!d.error.empty() || !e.error.empty()) return;
  if (e.init(0) != CUDA_SUCCESS) return;
  int count = 0;
  if (e.deviceGetCount(&count) != CUDA_SUCCESS) return;
  std::lock_guard<std::mutex> lock(kernel.mutex);
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    unsigned flags = 0;
    int active = 0;
    if (d.deviceGet(&dev, i) != CUDA_SUCCESS) continue;
    if (e.primaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active) continue;
    CUcontext context = nullptr;
    if (d.primaryCtxRetain(&context, dev) != CUDA_SUCCESS) continue;
    (void)load_locked(kernel, context, "device " + std::to_string(i));
    e.primaryCtxRelease(dev);  // the context stays alive: it was active before the retain
  }
}

// What a call site launches on one device, validated by its first call there.
struct Ready {
  CUfunction function = nullptr;
  CUcontext context = nullptr;
  bool push = false;  // the stream's context is not current on XLA's thread (not seen in practice)
};

struct Fill {
  int64_t width = 0;  // 0: none; else bytes per memset element (1, 2 or 4)
  uint32_t pattern = 0;
};

constexpr int kMaxDevices = 64;  // ordinals at or above this take the slow path on every call

struct LaunchState {
  static ffi::TypeId id;

  Kernel* kernel = nullptr;  // registry entries are never destroyed
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  std::vector<uint64_t> scalars;
  std::vector<Fill> fills;  // by result
  bool blocking = false;  // PNEX_LAUNCH_BLOCKING
  std::array<std::atomic<const Ready*>, kMaxDevices> ready;  // by XLA device ordinal
  std::mutex mutex;  // the slow path
  std::vector<std::unique_ptr<Ready>> owned;

  LaunchState() {
    for (auto& r : ready) r.store(nullptr, std::memory_order_relaxed);
  }
};

ffi::TypeId LaunchState::id = {};

ffi::ErrorOr<std::unique_ptr<LaunchState>> instantiate(int64_t id, ffi::Span<const int64_t> grid,
                                                       ffi::Span<const int64_t> block,
                                                       ffi::Span<const int64_t> scalars,
                                                       ffi::Span<const int64_t> fill) {
  std::shared_ptr<Kernel> found = find_kernel(id);
  if (!found) {
    return ffi::Unexpected(ffi::Error::Internal(
        "pnex: no kernel with id " + std::to_string(id) +
        " is registered in this process (an executable compiled in another process? trace the JAX function in this one)"));
  }
  Kernel& kernel = *found;
  if (grid.size() != 3 || block.size() != 3) return ffi::Unexpected(fail(kernel, "grid and block must have 3 entries"));
  if (fill.size() % 2 != 0) return ffi::Unexpected(fail(kernel, "the fill attribute must have 2 entries per result"));
  auto state = std::make_unique<LaunchState>();
  state->kernel = &kernel;
  for (int i = 0; i < 3; ++i) {
    if (grid[i] < 0 || block[i] < 1) return ffi::Unexpected(fail(kernel, "negative grid or empty block"));
    state->grid[i] = static_cast<unsigned>(grid[i]);
    state->block[i] = static_cast<unsigned>(block[i]);
  }
  state->scalars.assign(scalars.begin(), scalars.end());
  for (size_t i = 0; i < fill.size(); i += 2) {
    int64_t width = fill[i];
    if (width != 0 && width != 1 && width != 2 && width != 4) {
      return ffi::Unexpected(fail(kernel, "a fill width must be 0, 1, 2 or 4 bytes"));
    }
    state->fills.push_back({width, static_cast<uint32_t>(fill[i + 1])});
  }
  for (const Param& p : kernel.params) {
    if (p.kind == SCALAR && (p.index < 0 || static_cast<size_t>(p.index) >= state->scalars.size())) {
      return ffi::Unexpected(fail(kernel, "scalar slot out of range"));
    }
  }
  state->blocking = pnex::launch_blocking();
  preload(kernel);
  return state;
}

// The first call of a call site on a device: find (or load) the function in the
// context of XLA's stream and remember it.
ffi::ErrorOr<const Ready*> prepare(LaunchState& state, int32_t device, CUstream stream) {
  Kernel& kernel = *state.kernel;
  const pnex::Driver& d = pnex::driver();
  if (!d.error.empty()) return ffi::Unexpected(fail(kernel, d.error));
  std::lock_guard<std::mutex> lock(state.mutex);
  bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    if (const Ready* ready = state.ready[device].load(std::memory_order_acquire)) return ready;
  }
  auto ready = std::make_unique<Ready>();
  CUresult r = d.streamGetCtx(stream, &ready->context);
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "cannot find the context of XLA's stream: " + pnex::cu_error(r)));
  {
    std::lock_guard<std::mutex> kernel_lock(kernel.mutex);
    auto function = load_locked(kernel, ready->context, "device " + std::to_string(device));
    if (function.has_error()) return ffi::Unexpected(function.error());
    ready->function = *function;
  }
  CUcontext current = nullptr;
  d.ctxGetCurrent(&current);
  ready->push = current != ready->context;
  if (kernel.cooperative.load()) {  // a grid sync: every block resident at once, or a clear refusal
    ContextScope scope(ready->context);
    CUdevice dev = 0;
    CUresult r = scope.result() == CUDA_SUCCESS ? d.ctxGetDevice(&dev) : scope.result();
    if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "cannot query device " + std::to_string(device) + ": " + pnex::cu_error(r)));
    const std::string problem = pnex::cooperative_problem(kernel.name, ready->function, dev, state.grid, state.block,
                                                          static_cast<size_t>(kernel.shared.load()));
    if (!problem.empty()) return ffi::Unexpected(ffi::Error::InvalidArgument("pnex: " + problem));
  }
  const Ready* result = ready.get();
  state.owned.push_back(std::move(ready));
  if (cached) state.ready[device].store(result, std::memory_order_release);
  return result;
}

ffi::Error launch(CUstream stream, int32_t device, LaunchState* state, ffi::RemainingArgs args,
                  ffi::RemainingRets rets) {
  if (state == nullptr || state->kernel == nullptr) {
    return ffi::Error::Internal("pnex: the launch has no state (XLA did not run the handler's instantiate stage)");
  }
  Kernel& kernel = *state->kernel;
  const Ready* ready = device >= 0 && device < kMaxDevices ? state->ready[device].load(std::memory_order_acquire) : nullptr;
  if (ready == nullptr) {
    auto prepared = prepare(*state, device, stream);
    if (prepared.has_error()) return prepared.error();
    ready = *prepared;
  }
  const pnex::Driver& d = pnex::driver();

  // Numba's ABI: arrays are (meminfo, parent, nitems, itemsize, data, shape..., strides...).
  thread_local std::vector<uint64_t> slots;
  thread_local std::vector<void*> pointers;
  slots.clear();
  for (const Param& p : kernel.params) {
    if (p.kind == SCALAR) {
      slots.push_back(state->scalars[p.index]);
      continue;
    }
    if (p.kind == UNUSED) {
      slots.push_back(0);
      continue;
    }
    if (p.kind == TUNE) continue;  // a constant of the variant's code (one kernel id per variant): no slot
    void* data = nullptr;
    ffi::Span<const int64_t> dims;
    size_t element = 0;  // bytes of one buffer element
    if (p.kind == IN) {
      auto buffer = args.get<ffi::AnyBuffer>(p.index);
      if (buffer.has_error()) return fail(kernel, "operand " + std::to_string(p.index) + ": " + buffer.error().message());
      data = buffer->untyped_data();
      dims = buffer->dimensions();
      element = ffi::ByteWidth(buffer->element_type());
    } else {
      auto buffer = rets.get<ffi::AnyBuffer>(p.index);
      if (buffer.has_error()) return fail(kernel, "result " + std::to_string(p.index) + ": " + buffer.error().message());
      data = (*buffer)->untyped_data();
      dims = (*buffer)->dimensions();
      element = ffi::ByteWidth((*buffer)->element_type());
    }
    // A record dtype (xoroshiro128p): the buffer's last axis holds each record's words, and is no
    // axis of the kernel's array (its item size is the record's).
    const size_t rank = static_cast<int64_t>(element) < p.itemsize ? dims.size() - 1 : dims.size();
    if (static_cast<int64_t>(rank) != p.ndim || dims.size() < rank) {
      return fail(kernel, "a buffer of rank " + std::to_string(dims.size()) + " where rank " + std::to_string(p.ndim) +
                              " was traced");
    }
    int64_t nitems = 1;
    for (size_t axis = 0; axis < rank; ++axis) nitems *= dims[axis];
    slots.push_back(0);
    slots.push_back(0);
    slots.push_back(static_cast<uint64_t>(nitems));
    slots.push_back(static_cast<uint64_t>(p.itemsize));
    slots.push_back(reinterpret_cast<uint64_t>(data));
    for (size_t axis = 0; axis < rank; ++axis) slots.push_back(static_cast<uint64_t>(dims[axis]));
    const size_t first_stride = slots.size();
    slots.resize(first_stride + rank);
    int64_t stride = p.itemsize;  // C-contiguous, in bytes
    for (size_t axis = rank; axis-- > 0;) {
      slots[first_stride + axis] = static_cast<uint64_t>(stride);
      stride *= dims[axis];
    }
  }
  pointers.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) pointers[i] = &slots[i];

  std::unique_ptr<ContextScope> scope;
  if (ready->push) {
    scope = std::make_unique<ContextScope>(ready->context);
    if (scope->result() != CUDA_SUCCESS) {
      return fail(kernel, "cannot make the device's context current: " + pnex::cu_error(scope->result()));
    }
  }
  // Out(init=...) results: filled on XLA's stream, before the kernel writes them.
  for (size_t i = 0; i < state->fills.size() && i < rets.size(); ++i) {
    const Fill& fill = state->fills[i];
    if (fill.width == 0) continue;
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return fail(kernel, "result " + std::to_string(i) + ": " + buffer.error().message());
    size_t bytes = (*buffer)->size_bytes();
    if (bytes == 0) continue;
    CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>((*buffer)->untyped_data());
    const Extra& e = extra();
    if (!e.error.empty()) return fail(kernel, e.error);
    CUresult r = fill.width == 1   ? e.memsetD8Async(ptr, static_cast<unsigned char>(fill.pattern), bytes, stream)
                 : fill.width == 2 ? e.memsetD16Async(ptr, static_cast<unsigned short>(fill.pattern), bytes / 2, stream)
                                   : e.memsetD32Async(ptr, fill.pattern, bytes / 4, stream);
    if (r != CUDA_SUCCESS) return fail(kernel, "filling result " + std::to_string(i) + " failed: " + pnex::cu_error(r));
  }
  const unsigned* grid = state->grid;
  const unsigned* block = state->block;
  const unsigned shared = static_cast<unsigned>(kernel.shared.load(std::memory_order_relaxed));
  CUresult r = kernel.cooperative.load(std::memory_order_relaxed)
                   ? d.launchCooperativeKernel(ready->function, grid[0], grid[1], grid[2], block[0], block[1],
                                               block[2], shared, stream, pointers.data())
                   : d.launchKernel(ready->function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                                    stream, pointers.data(), nullptr);
  if (r != CUDA_SUCCESS) {
    std::string hint;
    if (pnex::is_fault(r)) {
      hint = "; this error is left by an earlier kernel on this device. Set PNEX_LAUNCH_BLOCKING=1 to name the "
             "kernel that faulted";
    }
    return fail(kernel, "could not be launched on device " + std::to_string(device) + " (grid " +
                            std::to_string(grid[0]) + "x" + std::to_string(grid[1]) + "x" + std::to_string(grid[2]) +
                            ", block " + std::to_string(block[0]) + "x" + std::to_string(block[1]) + "x" +
                            std::to_string(block[2]) + "): " + pnex::cu_error(r) + hint);
  }
  if (state->blocking) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    d.streamIsCapturing(stream, &status);
    if (status == CU_STREAM_CAPTURE_STATUS_NONE) {
      r = d.streamSynchronize(stream);
      if (r != CUDA_SUCCESS) return fail(kernel, "faulted on device " + std::to_string(device) + ": " + pnex::cu_error(r));
    }
  }
  return ffi::Error::Success();
}

// The state's type, registered with XLA by Python (jax.ffi.register_ffi_type).
const XLA_FFI_TypeInfo kStateTypeInfo = ffi::MakeTypeInfo<LaunchState>();

}  // namespace

// Built with -fvisibility=hidden: only these symbols are exported.
#define PNEX_EXPORT __attribute__((visibility("default")))

extern "C" PNEX_EXPORT XLA_FFI_Error* PnexJaxInstantiate(XLA_FFI_CallFrame* call_frame);
extern "C" PNEX_EXPORT XLA_FFI_Error* PnexJaxLaunch(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PnexJaxInstantiate, instantiate,
                              ffi::Ffi::BindInstantiate()
                                  .Attr<int64_t>("kernel")
                                  .Attr<ffi::Span<const int64_t>>("grid")
                                  .Attr<ffi::Span<const int64_t>>("block")
                                  .Attr<ffi::Span<const int64_t>>("scalars")
                                  .Attr<ffi::Span<const int64_t>>("fill"));

// Nothing here breaks CUDA-graph capture: kernels and memsets on XLA's stream only, no
// allocation, no synchronisation while the stream is captured, no module load once
// instantiate preloaded the code (a device whose context was not active then loads it
// on its first call, which XLA makes outside capture unless that first call is itself
// recorded into a command buffer).
XLA_FFI_DEFINE_HANDLER_SYMBOL(PnexJaxLaunch, launch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Ctx<ffi::State<LaunchState>>()
                                  .RemainingArgs()
                                  .RemainingRets(),
                              {ffi::Traits::kCmdBufferCompatible});

extern "C" {

// The state's type id (XLA writes the id it assigns) and type info, for
// jax.ffi.register_ffi_type.
PNEX_EXPORT void* pnex_jax_state_type_id() { return &LaunchState::id; }
PNEX_EXPORT const void* pnex_jax_state_type_info() { return &kStateTypeInfo; }

// Register kernel `id`: its name and its parameter table (4 entries per parameter, see
// the top of this file).  An id names one kernel (Python derives it from the kernel's
// source and interface), so registering an id again changes nothing: a launch on
// another thread may be reading the table.  Returns 0.
PNEX_EXPORT int pnex_jax_register(int64_t id, const char* name, int64_t nparams, const int64_t* table) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (kernels().count(id)) return 0;
  auto kernel = std::make_shared<Kernel>();
  kernel->name = name;
  for (int64_t i = 0; i < nparams; ++i) {
    kernel->params.push_back({table[4 * i], table[4 * i + 1], table[4 * i + 2], table[4 * i + 3]});
  }
  kernels()[id] = std::move(kernel);
  return 0;
}

// Kernel `id` synchronises its grid (cuda.cg.this_grid().sync()): it is launched cooperatively,
// and a call site whose grid cannot be resident at once is refused (cooperative.h).  Returns 0,
// or -1 when no kernel `id` is registered.
PNEX_EXPORT int pnex_jax_set_cooperative(int64_t id) {
  auto kernel = find_kernel(id);
  if (!kernel) return -1;
  kernel->cooperative.store(true);
  return 0;
}

// Kernel `id` launches with `bytes` of dynamic shared memory per block (shared_bytes=; an id per
// Tune variant, so one number): checked against each device's limit and opted in where its code
// loads (shared_memory.h), passed as sharedMemBytes at every launch.  Call it before the first
// call site is instantiated.  Returns 0, or -1 when no kernel `id` is registered.
PNEX_EXPORT int pnex_jax_set_shared(int64_t id, int64_t bytes) {
  auto kernel = find_kernel(id);
  if (!kernel) return -1;
  kernel->shared.store(bytes);
  return 0;
}

// Add kernel `id`'s code for architecture `arch` (10 * major + minor).  Returns 0, or -1
// when no kernel `id` is registered.
PNEX_EXPORT int pnex_jax_add_image(int64_t id, int64_t arch, const char* code, int64_t size, const char* entry) {
  auto kernel = find_kernel(id);
  if (!kernel) return -1;
  std::lock_guard<std::mutex> lock(kernel->mutex);
  kernel->images[arch] = Image{std::string(code, static_cast<size_t>(size)), std::string(entry)};
  return 0;
}

// Which architectures kernel `id` has code for, written to `out` (at most `capacity`);
// returns how many there are, or -1 when no kernel `id` is registered.
PNEX_EXPORT int64_t pnex_jax_archs(int64_t id, int64_t* out, int64_t capacity) {
  auto kernel = find_kernel(id);
  if (!kernel) return -1;
  std::lock_guard<std::mutex> lock(kernel->mutex);
  int64_t n = 0;
  for (const auto& entry : kernel->images) {
    if (n < capacity) out[n] = entry.first;
    ++n;
  }
  return n;
}

// How many contexts kernel `id` is loaded in (tests: instantiate preloads it), or -1
// when no kernel `id` is registered.
PNEX_EXPORT int64_t pnex_jax_loaded(int64_t id) {
  auto kernel = find_kernel(id);
  if (!kernel) return -1;
  std::lock_guard<std::mutex> lock(kernel->mutex);
  return static_cast<int64_t>(kernel->loaded.size());
}

// Empty, or why the CUDA driver cannot be used.
PNEX_EXPORT const char* pnex_jax_driver_error() { return pnex::driver().error.c_str(); }

}  // extern "C"
