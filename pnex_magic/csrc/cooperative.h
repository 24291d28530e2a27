// pnex_magic: cooperative launches, for kernels that synchronise their whole grid
// (cuda.cg.this_grid().sync()).  Shared by the PyTorch launcher (launcher_call.cpp)
// and the XLA handler (jax_ffi.cpp); pnex_magic/launch/cooperative.py is the Python
// launcher's side, with the same message.
//
// A grid sync waits until every block of the grid has arrived, so every block must be
// resident on the GPU at once: cuLaunchCooperativeKernel refuses a grid of more blocks
// than cuOccupancyMaxActiveBlocksPerMultiprocessor (for the block size, the kernel's
// registers and shared memory, static and dynamic) times the SMs.  pnex checks that
// first, and says so in the user's terms instead of CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
// The occupancy figure is kept per (function, threads per block, dynamic shared memory):
// one query per block size.
//
// No iostreams (see cuda_driver.h).

#ifndef PNEX_COOPERATIVE_H_
#define PNEX_COOPERATIVE_H_

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_driver.h"

namespace pnex {

namespace detail {
struct Occupancy {
  CUfunction fn;
  unsigned threads;
  size_t shared;
  int per_sm;
  int sms;
};
}  // namespace detail

// Why `grid` blocks of `block` threads of `fn`, each with `shared` bytes of dynamic shared
// memory, cannot all be resident on `device` at once ("" when they can, or when the driver
// cannot tell: the launch then reports it).
inline std::string cooperative_problem(const std::string& kernel, CUfunction fn, CUdevice device,
                                       const unsigned grid[3], const unsigned block[3], size_t shared = 0) {
  static std::mutex mutex;
  static std::vector<detail::Occupancy> known;
  const Driver& d = driver();
  const unsigned threads = block[0] * block[1] * block[2];
  int per_sm = -1, sms = -1;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const detail::Occupancy& o : known) {
      if (o.fn == fn && o.threads == threads && o.shared == shared) {
        per_sm = o.per_sm;
        sms = o.sms;
      }
    }
  }
  if (per_sm < 0) {
    int supported = 0;
    if (d.deviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, device) == CUDA_SUCCESS &&
        !supported) {
      return "kernel '" + kernel + "' synchronises its grid (cuda.cg.this_grid().sync()), which needs a cooperative "
             "launch, and this GPU does not support cooperative launches";
    }
    if (d.occupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, static_cast<int>(threads), shared) != CUDA_SUCCESS ||
        d.deviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device) != CUDA_SUCCESS) {
      return "";
    }
    std::lock_guard<std::mutex> lock(mutex);
    known.push_back({fn, threads, shared, per_sm, sms});
  }
  const int64_t blocks = int64_t(grid[0]) * grid[1] * grid[2];
  const int64_t limit = int64_t(per_sm) * sms;
  if (blocks <= limit) return "";
  return "kernel '" + kernel + "' synchronises its grid (cuda.cg.this_grid().sync()), so every block must be "
         "resident on the GPU at once, but this launch has " + std::to_string(blocks) + " blocks of " +
         std::to_string(threads) + " threads and the GPU holds at most " + std::to_string(per_sm) +
         " such blocks per SM x " + std::to_string(sms) + " SMs = " + std::to_string(limit) +
         " (for this block size and the kernel's registers and shared memory). Launch at most " +
         std::to_string(limit) + " blocks: fewer threads (n_threads) with a grid-stride loop over the data, or "
         "blocks that use fewer registers or less shared memory";
}

}  // namespace pnex

#endif  // PNEX_COOPERATIVE_H_
