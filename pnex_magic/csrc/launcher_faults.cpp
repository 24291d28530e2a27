// pnex_magic's C++ launcher: fault naming.  See launcher_faults.h.

#include "launcher_faults.h"

#include <array>
#include <atomic>
#include <mutex>
#include <set>

#include "cuda_driver.h"

namespace pnex::launcher {

namespace {
// device -> the last pnex kernel launched there: a pointer swapped atomically per launch
// (no string copy, no lock).
std::array<std::atomic<const char*>, kMaxDevices> g_last_kernel{};
}  // namespace

const char* intern(const std::string& name) {
  static std::mutex mutex;
  static auto* names = new std::set<std::string>();  // never destroyed: read until exit
  std::lock_guard<std::mutex> lock(mutex);
  return names->insert(name).first->c_str();
}

const char* swap_last_kernel(int device, const char* kernel) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return g_last_kernel[device].exchange(kernel, std::memory_order_relaxed);
}

const char* last_kernel_on(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return g_last_kernel[device].load(std::memory_order_relaxed);
}

std::string last_kernel(int device) {
  const char* name = last_kernel_on(device);
  return name == nullptr ? std::string() : std::string(name);
}

std::string fault_hint(const char* previous) {
  if (pnex::launch_blocking())
    return "; launches are synchronised (PNEX_LAUNCH_BLOCKING / CUDA_LAUNCH_BLOCKING), so this kernel faulted, "
           "unless a kernel outside pnex did just before it";
  return "; this error is left by an earlier kernel on this device" +
         (previous == nullptr || !*previous
              ? std::string()
              : " (the last pnex kernel launched there was '" + std::string(previous) + "')") +
         ". Set PNEX_LAUNCH_BLOCKING=1 (or CUDA_LAUNCH_BLOCKING=1) to name the kernel that faulted";
}

}  // namespace pnex::launcher
