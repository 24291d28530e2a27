// pnex_magic: dynamic shared memory (a kernel's shared_bytes, cuda.shared.array(0, dtype)).
// Shared by the PyTorch launcher (launcher_call.cpp) and the XLA handler (jax_ffi.cpp);
// pnex_magic/launch/shared.py is the Python launcher's side, with the same message.
//
// A launch passes the bytes as cuLaunchKernel's sharedMemBytes.  Above 48 KiB per block
// (static plus dynamic) CUDA needs the function's opt-in,
// cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), made once when the
// function is loaded.  A request above what the device allows a block
// (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, less the kernel's static shared
// memory) is refused then, in the user's terms, instead of CUDA_ERROR_INVALID_VALUE at launch.
//
// No iostreams (see cuda_driver.h).

#ifndef PNEX_SHARED_MEMORY_H_
#define PNEX_SHARED_MEMORY_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda_driver.h"

namespace pnex {

// Shared memory (static plus dynamic) a block may use without the function's opt-in.
constexpr int64_t kDefaultSharedLimit = 48 * 1024;

// Makes the loaded function `fn` launchable with `bytes` of dynamic shared memory per block on
// `device` (`where` names it: "cuda:0"): "" when it is (opted in above 48 KiB), else why not.
inline std::string prepare_shared(const std::string& kernel, CUfunction fn, CUdevice device, int64_t bytes,
                                  const std::string& where) {
  if (bytes <= 0) return "";
  const Driver& d = driver();
  int static_bytes = 0, most = 0;
  CUresult r = d.funcGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn);
  if (r == CUDA_SUCCESS) r = d.deviceGetAttribute(&most, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device);
  if (r != CUDA_SUCCESS) {
    return "kernel '" + kernel + "': querying the shared memory a block may use on " + where + " failed: " + cu_error(r);
  }
  if (static_bytes + bytes > most) {
    const std::string left = std::to_string(std::max<int64_t>(int64_t(most) - static_bytes, 0));
    return "kernel '" + kernel + "': shared_bytes asks for " + std::to_string(bytes) +
           " B of dynamic shared memory per block, but " + where + " allows a block at most " + std::to_string(most) +
           " B of shared memory (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), and the kernel's static "
           "shared memory takes " + std::to_string(static_bytes) + " B of it, which leaves " + left +
           " B for shared_bytes. Ask for at most " + left + " B (fewer pipeline stages or smaller tiles), or run it "
           "on a GPU with more shared memory";
  }
  if (static_bytes + bytes > kDefaultSharedLimit) {
    r = d.funcSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes));
    if (r != CUDA_SUCCESS) {
      return "kernel '" + kernel + "': opting in to " + std::to_string(bytes) +
             " B of dynamic shared memory per block (cuFuncSetAttribute) failed: " + cu_error(r);
    }
  }
  return "";
}

}  // namespace pnex

#endif  // PNEX_SHARED_MEMORY_H_
