// pnex_magic's C++ launcher: a kernel's hidden arguments, the device arrays it reads as
// globals (pnex_magic.snapshot).  Registration (launcher_register.cpp) reads them from the
// op's description, the tensors themselves; every launch (launcher_call.cpp) passes the same
// tensors after the kernel's parameters (append_hidden), reading their storage then, so an
// in-place update, or a CUDA graph captured later, sees the tensor's current memory.

#ifndef PNEX_LAUNCHER_HIDDEN_H_
#define PNEX_LAUNCHER_HIDDEN_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "launcher.h"

namespace pnex::launcher {

struct HiddenArray {
  std::string name;      // the global's name
  at::Tensor tensor;     // the global's tensor (a Numba device array: a view of it)
  c10::ScalarType dtype;  // what the code was compiled for
  int64_t ndim = 0;
  bool contiguous = true;
  std::string describe;  // e.g. "float32, 1-D, contiguous"
};

struct HiddenArrays {
  std::vector<HiddenArray> arrays;
};

}  // namespace pnex::launcher

#endif  // PNEX_LAUNCHER_HIDDEN_H_
