// pnex_magic's XLA FFI handler: pnex kernels launched by XLA, inside jax.jit.
//
// One plain shared library, compiled once per environment against the headers that
// ship with jaxlib (jax.ffi.include_dir()) and cuda.h, serves every pnex kernel.
// Python (pnex_magic/launch/xla.py) registers each kernel under an integer id, with its
// parameter table and its code per GPU architecture; XLA calls PnexJaxLaunch with the
// buffers it allocated, the stream it runs on and four attributes: the kernel id, the
// grid and the block (fixed when the JAX function was traced), and the scalar
// arguments, already packed into 8-byte slots.  The handler loads the kernel on a device the first
// time it runs there, packs Numba's kernel ABI and calls cuLaunchKernel on XLA's stream.
//
// The parameter table has four int64 entries per kernel parameter, in declaration
// order: kind (pnex_magic.launch.description.KINDS), index, rank, item size.  The index
// of an In parameter is its operand; of an InMut or Out parameter, its result (InMut
// results alias their operand, Out(init=...) results alias an operand XLA filled); of a
// Scalar, its slot in the scalars attribute.  XLA buffers are dense and row-major, so
// the code is the kernel's C-contiguous variant and strides follow from the sizes.
//
// The CUDA driver is reached through dlopen("libcuda.so.1") (cuda_driver.h): no nvcc,
// no link to libcuda, and the library loads on machines without a GPU.

#include "cuda_driver.h"

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

enum Kind : int64_t { IN = 0, INMUT = 1, OUT = 2, SCALAR = 3, UNUSED = 4 };

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
  std::map<int64_t, Image> images;  // by architecture, 10 * major + minor
  std::mutex mutex;
  std::vector<Loaded> loaded;  // by device ordinal
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

ffi::Error fail(const Kernel& kernel, const std::string& what) {
  return ffi::Error::Internal("pnex: kernel '" + kernel.name + "': " + what);
}

// Makes `context` current on this thread for the scope (XLA normally has it current
// already; then this costs one thread-local read).
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

// The kernel loaded in the context of XLA's stream on `device`, on first use there.
ffi::ErrorOr<Loaded> load(Kernel& kernel, int32_t device, CUstream stream) {
  std::lock_guard<std::mutex> lock(kernel.mutex);
  if (device >= 0 && static_cast<size_t>(device) < kernel.loaded.size() && kernel.loaded[device].function) {
    return kernel.loaded[device];
  }
  const pnex::Driver& d = pnex::driver();
  Loaded loaded;
  CUresult r = d.streamGetCtx(stream, &loaded.context);
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "cannot find the context of XLA's stream: " + pnex::cu_error(r)));
  ContextScope scope(loaded.context);
  if (scope.result() != CUDA_SUCCESS) {
    return ffi::Unexpected(fail(kernel, "cannot make the device's context current: " + pnex::cu_error(scope.result())));
  }
  CUdevice dev = 0;
  int major = 0, minor = 0;
  r = d.ctxGetDevice(&dev);
  if (r == CUDA_SUCCESS) r = d.deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == CUDA_SUCCESS) r = d.deviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "cannot query the device: " + pnex::cu_error(r)));
  auto image = kernel.images.find(10 * major + minor);
  if (image == kernel.images.end()) {
    std::string have;
    for (const auto& entry : kernel.images) have += (have.empty() ? "sm_" : ", sm_") + std::to_string(entry.first);
    return ffi::Unexpected(fail(kernel, "no code for sm_" + std::to_string(10 * major + minor) + " (device " +
                                            std::to_string(device) + "); it was compiled for " +
                                            (have.empty() ? std::string("no architecture") : have) +
                                            ". Call the JAX function again after the GPU is visible to JAX"));
  }
  CUmodule module = nullptr;
  r = d.moduleLoadData(&module, image->second.code.data());
  if (r != CUDA_SUCCESS) {
    return ffi::Unexpected(fail(kernel, "loading its code on device " + std::to_string(device) + " failed: " + pnex::cu_error(r)));
  }
  r = d.moduleGetFunction(&loaded.function, module, image->second.entry.c_str());
  if (r != CUDA_SUCCESS) return ffi::Unexpected(fail(kernel, "entry not found: " + pnex::cu_error(r)));
  if (device >= 0) {
    if (static_cast<size_t>(device) >= kernel.loaded.size()) kernel.loaded.resize(device + 1);
    kernel.loaded[device] = loaded;
  }
  return loaded;
}

ffi::Error launch(CUstream stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets, int64_t id,
                  ffi::Span<const int64_t> grid, ffi::Span<const int64_t> block, ffi::Span<const int64_t> scalars) {
  std::shared_ptr<Kernel> found = find_kernel(id);
  if (!found) {
    return ffi::Error::Internal("pnex: no kernel with id " + std::to_string(id) +
                                " is registered in this process (a JAX function traced in another process?)");
  }
  Kernel& kernel = *found;
  const pnex::Driver& d = pnex::driver();
  if (!d.error.empty()) return fail(kernel, d.error);
  if (grid.size() != 3 || block.size() != 3) return fail(kernel, "grid and block must have 3 entries");

  // Numba's ABI: arrays are (meminfo, parent, nitems, itemsize, data, shape..., strides...).
  thread_local std::vector<uint64_t> slots;
  thread_local std::vector<void*> pointers;
  slots.clear();
  for (const Param& p : kernel.params) {
    if (p.kind == SCALAR) {
      if (p.index < 0 || static_cast<size_t>(p.index) >= scalars.size()) return fail(kernel, "scalar slot out of range");
      slots.push_back(static_cast<uint64_t>(scalars[p.index]));
      continue;
    }
    if (p.kind == UNUSED) {
      slots.push_back(0);
      continue;
    }
    void* data = nullptr;
    ffi::Span<const int64_t> dims;
    if (p.kind == IN) {
      auto buffer = args.get<ffi::AnyBuffer>(p.index);
      if (buffer.has_error()) return fail(kernel, "operand " + std::to_string(p.index) + ": " + buffer.error().message());
      data = buffer->untyped_data();
      dims = buffer->dimensions();
    } else {
      auto buffer = rets.get<ffi::AnyBuffer>(p.index);
      if (buffer.has_error()) return fail(kernel, "result " + std::to_string(p.index) + ": " + buffer.error().message());
      data = (*buffer)->untyped_data();
      dims = (*buffer)->dimensions();
    }
    if (static_cast<int64_t>(dims.size()) != p.ndim) {
      return fail(kernel, "a buffer of rank " + std::to_string(dims.size()) + " where rank " + std::to_string(p.ndim) +
                              " was traced");
    }
    int64_t nitems = 1;
    for (int64_t s : dims) nitems *= s;
    slots.push_back(0);
    slots.push_back(0);
    slots.push_back(static_cast<uint64_t>(nitems));
    slots.push_back(static_cast<uint64_t>(p.itemsize));
    slots.push_back(reinterpret_cast<uint64_t>(data));
    for (int64_t s : dims) slots.push_back(static_cast<uint64_t>(s));
    const size_t first_stride = slots.size();
    slots.resize(first_stride + dims.size());
    int64_t stride = p.itemsize;  // C-contiguous, in bytes
    for (size_t axis = dims.size(); axis-- > 0;) {
      slots[first_stride + axis] = static_cast<uint64_t>(stride);
      stride *= dims[axis];
    }
  }
  pointers.resize(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) pointers[i] = &slots[i];

  auto loaded = load(kernel, device, stream);
  if (loaded.has_error()) return loaded.error();
  ContextScope scope(loaded->context);
  if (scope.result() != CUDA_SUCCESS) {
    return fail(kernel, "cannot make the device's context current: " + pnex::cu_error(scope.result()));
  }
  CUresult r = d.launchKernel(loaded->function, static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]),
                              static_cast<unsigned>(grid[2]), static_cast<unsigned>(block[0]),
                              static_cast<unsigned>(block[1]), static_cast<unsigned>(block[2]), 0, stream,
                              pointers.data(), nullptr);
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
  if (pnex::launch_blocking()) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    d.streamIsCapturing(stream, &status);
    if (status == CU_STREAM_CAPTURE_STATUS_NONE) {
      r = d.streamSynchronize(stream);
      if (r != CUDA_SUCCESS) return fail(kernel, "faulted on device " + std::to_string(device) + ": " + pnex::cu_error(r));
    }
  }
  return ffi::Error::Success();
}

}  // namespace

// Built with -fvisibility=hidden: only these symbols are exported.
#define PNEX_EXPORT __attribute__((visibility("default")))

extern "C" PNEX_EXPORT XLA_FFI_Error* PnexJaxLaunch(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PnexJaxLaunch, launch,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<CUstream>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("kernel")
                                  .Attr<ffi::Span<const int64_t>>("grid")
                                  .Attr<ffi::Span<const int64_t>>("block")
                                  .Attr<ffi::Span<const int64_t>>("scalars"));

extern "C" {

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

// Empty, or why the CUDA driver cannot be used.
PNEX_EXPORT const char* pnex_jax_driver_error() { return pnex::driver().error.c_str(); }

}  // extern "C"
