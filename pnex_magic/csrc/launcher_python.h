// pnex_magic's C++ launcher: the op's Python callables (launcher_register.cpp, the one unit
// that includes pybind11; the others reach Python through the functions launcher.h declares).

#ifndef PNEX_LAUNCHER_PYTHON_H_
#define PNEX_LAUNCHER_PYTHON_H_

#include <pybind11/pybind11.h>

#include "launcher.h"

namespace pnex::launcher {

namespace py = pybind11;

struct Callbacks {
  py::object get_image;  // callable(device_index, contiguous, variant, checked) -> (cubin or PTX bytes, entry)
  py::object choose;     // callable(device_index, contiguous, key, args or None) -> (candidate, final)
  py::object describe;   // callable(error record as a list) -> message ("" for none)

  ~Callbacks() {
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
};

}  // namespace pnex::launcher

#endif  // PNEX_LAUNCHER_PYTHON_H_
