// pnex_magic: the CUDA driver API, reached through dlopen("libcuda.so.1").
//
// pnex's native launchers build with a host C++ compiler and the CUDA headers alone
// (no nvcc, no link to libcuda): the driver's entry points are looked up once, on
// first use, and a missing driver becomes a message (Driver::error) instead of a
// load failure.  Signatures come from cuda.h (decltype), so they cannot drift.
//
// No iostreams here: a libstdc++ other than the host application's may be loaded, and
// its locale facets crash when mixed (seen with the system g++ against torch's wheels).

#ifndef PNEX_CUDA_DRIVER_H_
#define PNEX_CUDA_DRIVER_H_

#include <cuda.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace pnex {

struct Driver {
  decltype(&::cuModuleLoadData) moduleLoadData = nullptr;
  decltype(&::cuModuleGetFunction) moduleGetFunction = nullptr;
  decltype(&::cuLaunchKernel) launchKernel = nullptr;
  decltype(&::cuLaunchCooperativeKernel) launchCooperativeKernel = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor) occupancyMaxActiveBlocksPerMultiprocessor = nullptr;
  decltype(&::cuGetErrorName) getErrorName = nullptr;
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuStreamSynchronize) streamSynchronize = nullptr;
  decltype(&::cuStreamIsCapturing) streamIsCapturing = nullptr;
  decltype(&::cuStreamGetCtx) streamGetCtx = nullptr;
  decltype(&::cuFuncSetAttribute) funcSetAttribute = nullptr;
  decltype(&::cuFuncGetAttribute) funcGetAttribute = nullptr;
  decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
  decltype(&::cuCtxSetCurrent) ctxSetCurrent = nullptr;
  decltype(&::cuCtxPushCurrent) ctxPushCurrent = nullptr;
  decltype(&::cuCtxPopCurrent) ctxPopCurrent = nullptr;
  decltype(&::cuCtxGetDevice) ctxGetDevice = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primaryCtxRetain = nullptr;
  std::string error;  // empty when every entry point was found
};

namespace detail {
template <typename F>
void bind(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("libcuda.so.1 has no symbol ") + name;
}
}  // namespace detail

// The driver's entry points, looked up on first use.
inline const Driver& driver() {
  static Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      d.error = "the CUDA driver library (libcuda.so.1) cannot be loaded: is an NVIDIA driver installed?";
      return d;
    }
    // The names cuda.h maps its functions to (e.g. cuCtxPushCurrent -> cuCtxPushCurrent_v2).
    detail::bind(lib, "cuModuleLoadData", d.moduleLoadData, d.error);
    detail::bind(lib, "cuModuleGetFunction", d.moduleGetFunction, d.error);
    detail::bind(lib, "cuLaunchKernel", d.launchKernel, d.error);
    detail::bind(lib, "cuLaunchCooperativeKernel", d.launchCooperativeKernel, d.error);
    detail::bind(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", d.occupancyMaxActiveBlocksPerMultiprocessor,
                 d.error);
    detail::bind(lib, "cuGetErrorName", d.getErrorName, d.error);
    detail::bind(lib, "cuGetErrorString", d.getErrorString, d.error);
    detail::bind(lib, "cuStreamSynchronize", d.streamSynchronize, d.error);
    detail::bind(lib, "cuStreamIsCapturing", d.streamIsCapturing, d.error);
    detail::bind(lib, "cuStreamGetCtx", d.streamGetCtx, d.error);
    detail::bind(lib, "cuFuncSetAttribute", d.funcSetAttribute, d.error);
    detail::bind(lib, "cuFuncGetAttribute", d.funcGetAttribute, d.error);
    detail::bind(lib, "cuCtxGetCurrent", d.ctxGetCurrent, d.error);
    detail::bind(lib, "cuCtxSetCurrent", d.ctxSetCurrent, d.error);
    detail::bind(lib, "cuCtxPushCurrent_v2", d.ctxPushCurrent, d.error);
    detail::bind(lib, "cuCtxPopCurrent_v2", d.ctxPopCurrent, d.error);
    detail::bind(lib, "cuCtxGetDevice", d.ctxGetDevice, d.error);
    detail::bind(lib, "cuDeviceGet", d.deviceGet, d.error);
    detail::bind(lib, "cuDeviceGetAttribute", d.deviceGetAttribute, d.error);
    detail::bind(lib, "cuDevicePrimaryCtxRetain", d.primaryCtxRetain, d.error);
    return d;
  }();
  return d;
}

// "CUDA_ERROR_X (n): description" for a driver result.
inline std::string cu_error(CUresult r) {
  const Driver& d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.getErrorName) d.getErrorName(r, &name);
  if (d.getErrorString) d.getErrorString(r, &text);
  return std::string(name ? name : "CUDA error") + " (" + std::to_string(static_cast<int>(r)) +
         "): " + (text ? text : "unknown");
}

// Whether a result is a sticky fault left by an earlier kernel on the device.
inline bool is_fault(CUresult r) {
  return r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED || r == CUDA_ERROR_ASSERT ||
         r == CUDA_ERROR_ILLEGAL_INSTRUCTION || r == CUDA_ERROR_MISALIGNED_ADDRESS;
}

// PNEX_LAUNCH_BLOCKING=1 (or CUDA_LAUNCH_BLOCKING=1): synchronise after every launch,
// so that a faulting kernel is named at its own launch.
inline bool launch_blocking() {
  static bool blocking = [] {
    const char* a = std::getenv("PNEX_LAUNCH_BLOCKING");
    const char* b = std::getenv("CUDA_LAUNCH_BLOCKING");
    return (a && std::string(a) == "1") || (b && std::string(b) == "1");
  }();
  return blocking;
}

}  // namespace pnex

#endif  // PNEX_CUDA_DRIVER_H_
