// pnex_magic's C++ launcher: fault naming (launcher_faults.cpp).
//
// CUDA reports a kernel's fault (an illegal address) at a later call, so the launcher
// keeps the last pnex kernel launched on each device and names it in its messages.
// No torch header here: the translation unit that defines these compiles in a second.

#ifndef PNEX_LAUNCHER_FAULTS_H_
#define PNEX_LAUNCHER_FAULTS_H_

#include <string>

namespace pnex::launcher {

// Devices a process may use (c10 allows fewer): per-device tables are fixed arrays.
constexpr int kMaxDevices = 128;

// A kernel's name, interned for the life of the process (a pointer that never dangles).
const char* intern(const std::string& name);

// Records `kernel` (interned) as the last pnex kernel launched on `device`; returns the
// one launched there before it (nullptr if none, or a device beyond kMaxDevices).
const char* swap_last_kernel(int device, const char* kernel);

// The last pnex kernel launched on `device` (nullptr if none).
const char* last_kernel_on(int device);

// The last pnex kernel launched on `device` ("" if none): what Python names in its messages.
std::string last_kernel(int device);

// What to add to a sticky fault (an earlier kernel's illegal access, found by this call);
// `previous` is the last pnex kernel launched on the device.
std::string fault_hint(const char* previous);

}  // namespace pnex::launcher

#endif  // PNEX_LAUNCHER_FAULTS_H_
