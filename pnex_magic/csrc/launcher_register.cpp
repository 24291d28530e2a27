// pnex_magic's C++ launcher: its Python side.  The Python module, the op's Python
// callables, the op class's C call slot.
//
// register_op turns the op's launch description (pnex_magic.launch.description, a dict)
// into a Spec and has launcher_dispatch.cpp register its kernels with the dispatcher.
// install_fast_call gives PnexOp a C call slot.  The only unit that includes pybind11
// (5 s of the build's CPU on its own): the others reach Python through the functions here.

#include <ATen/ops/empty.h>
#include <pybind11/stl.h>
// THPVariable_Check / THPVariable_Unpack: the tensors a kernel reads as globals (read_hidden).
#include <torch/csrc/autograd/python_variable.h>

#include "launcher_hidden.h"
#include "launcher_python.h"

namespace pnex::launcher {

namespace {
// A program from its Python description: a list of (opcode, a, b).
Program to_program(const py::handle& obj) {
  Program prog;
  for (auto item : obj) {
    auto t = item.cast<std::tuple<int64_t, int64_t, int64_t>>();
    prog.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
  }
  return prog;
}

// The rules of jit(requires=...) from their description (pnex_magic.conditions.programs).
std::vector<Rule> to_rules(const py::handle& items) {
  std::vector<Rule> rules;
  for (auto item : items) {
    auto rd = item.cast<py::dict>();
    Rule rule;
    rule.text = rd["text"].cast<std::string>();
    if (rd.contains("why")) rule.why = rd["why"].cast<std::string>();
    rule.condition = to_program(rd["program"]);
    for (auto term : rd["terms"]) {
      auto pair = term.cast<py::sequence>();
      rule.terms.emplace_back(pair[0].cast<std::string>(), to_program(pair[1]));
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

// The hidden arguments from their Python description: per device array the kernel reads
// as a global, (name, tensor, dtype, ndim, contiguous, describe); null when there is none.
std::shared_ptr<const HiddenArrays> read_hidden(const py::handle& items) {
  auto hidden = std::make_shared<HiddenArrays>();
  for (auto item : items) {
    auto entry = item.cast<py::tuple>();
    PyObject* tensor = entry[1].ptr();
    TORCH_CHECK(THPVariable_Check(tensor), "pnex: a hidden argument's value is not a tensor");
    HiddenArray h;
    h.name = entry[0].cast<std::string>();
    h.tensor = THPVariable_Unpack(tensor);  // the same tensor: an in-place update is seen
    h.dtype = scalar_type(entry[2].cast<std::string>());
    h.ndim = entry[3].cast<int64_t>();
    h.contiguous = entry[4].cast<bool>();
    h.describe = entry[5].cast<std::string>();
    hidden->arrays.push_back(std::move(h));
  }
  if (hidden->arrays.empty()) return nullptr;
  return hidden;
}

}  // namespace

std::pair<std::string, std::string> kernel_image(const Spec& spec, int device, bool contiguous, int variant,
                                                 bool checked) {
  py::gil_scoped_acquire gil;
  auto result =
      spec.python->get_image(device, contiguous, variant, checked).cast<std::tuple<py::bytes, std::string>>();
  return {std::string(std::get<0>(result)), std::get<1>(result)};
}

void refuse_inmut_grad(const Spec& spec, const std::string& param, bool leaf) {
  py::gil_scoped_acquire gil;
  py::object error = py::module_::import("pnex_magic.calls").attr("inmut_grad_error")(spec.kernel, param, leaf);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

std::pair<int, bool> python_choose(const Spec& spec, int device, bool contiguous, c10::ArrayRef<int64_t> key,
                                   PyObject* args) {
  int candidate = 0;
  bool final = false;
  std::string error;
  {
    py::gil_scoped_acquire gil;
    py::object call_args = args == nullptr ? py::none() : py::reinterpret_steal<py::object>(args);
    try {
      py::tuple values(key.size());
      for (size_t i = 0; i < key.size(); ++i) values[i] = py::int_(key[i]);
      auto result = spec.python->choose(device, contiguous, values, call_args).cast<std::tuple<int, bool>>();
      candidate = std::get<0>(result);
      final = std::get<1>(result);
    } catch (py::error_already_set& e) {
      error = py::str(e.type().attr("__name__")).cast<std::string>() + ": " + py::str(e.value()).cast<std::string>();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  TORCH_CHECK(error.empty(), "pnex: kernel '", spec.kernel, "': choosing its block failed: ", error);
  return {candidate, final};
}

bool has_chooser(const Spec& spec) { return spec.python->choose && !spec.python->choose.is_none(); }

std::string describe_violation(const Spec& spec, const int64_t* record) {
  py::gil_scoped_acquire gil;
  const py::object& describe = spec.python->describe;
  if (!describe || describe.is_none()) return "an access out of bounds";
  py::list items;
  for (int64_t i = 0; i < kRecordSlots; ++i) items.append(py::int_(record[i]));
  return describe(items).cast<std::string>();
}

namespace {

// The op object's call in C (pnex_magic.op.PnexOp's tp_call slot, installed by
// install_fast_call): a call with all its arguments positional, as many as the op takes, and
// every scalar of a type the op takes as it is, goes straight to the OpOverload's C++ entry,
// with no Python frame (PnexOp.__call__'s frame and checks cost about as much as the whole
// C++ entry's argument handling: benchmarks/overhead.py's "checks" and "frame" columns).
// The object's `_fast` attribute, (entry, number of arguments, ((index, types), ...)) or None,
// says what to call and check; PnexOp keeps it.  Anything else (keywords, a superseded op, a
// scalar to check, Dynamo tracing the op, which reads the class's Python __call__) takes
// the class's Python __call__.  An exception from the entry goes to the object's
// _call_failed(exc, args), which raises the error the Python __call__ would have raised.
ternaryfunc g_python_call = nullptr;
PyTypeObject* g_fast_type = nullptr;

PyObject* fast_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  static PyObject* fast_name = PyUnicode_InternFromString("_fast");
  static PyObject* failed_name = PyUnicode_InternFromString("_call_failed");
  if (kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) {
    PyObject* fast = PyObject_GetAttr(self, fast_name);
    if (fast == nullptr) {
      PyErr_Clear();
    } else if (PyTuple_CheckExact(fast) && PyTuple_GET_SIZE(fast) == 3) {
      bool ok = PyTuple_GET_SIZE(args) == PyLong_AsSsize_t(PyTuple_GET_ITEM(fast, 1));
      PyObject* kinds = PyTuple_GET_ITEM(fast, 2);
      for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(kinds); ++k) {
        PyObject* item = PyTuple_GET_ITEM(kinds, k);
        const Py_ssize_t index = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
        PyObject* types = PyTuple_GET_ITEM(item, 1);
        PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(PyTuple_GET_ITEM(args, index)));
        bool found = false;
        for (Py_ssize_t t = 0; !found && t < PyTuple_GET_SIZE(types); ++t) found = PyTuple_GET_ITEM(types, t) == type;
        ok = found;
      }
      if (ok) {
        PyObject* result = PyObject_Call(PyTuple_GET_ITEM(fast, 0), args, nullptr);
        if (result == nullptr) {
          PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
          PyErr_Fetch(&type, &value, &traceback);
          PyErr_NormalizeException(&type, &value, &traceback);
          if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
          if (value == nullptr) {
            PyErr_Restore(type, value, traceback);
          } else {
            result = PyObject_CallMethodObjArgs(self, failed_name, value, args, nullptr);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(traceback);
          }
        }
        Py_DECREF(fast);
        return result;
      }
    }
    Py_XDECREF(fast);
  }
  return g_python_call(self, args, kwargs);
}

// Give `cls` (PnexOp) the C call above; its Python __call__ stays what Python code, Dynamo
// and the fallback above see.  Idempotent; false if another class already has it.
bool install_fast_call(const py::object& cls) {
  if (!PyType_Check(cls.ptr())) throw py::type_error("install_fast_call: expected a class");
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  if (g_fast_type != nullptr) return g_fast_type == type && type->tp_call == fast_call;
  if (type->tp_call == nullptr) throw py::type_error("install_fast_call: the class defines no __call__");
  g_python_call = type->tp_call;
  g_fast_type = type;
  Py_INCREF(type);  // held for the process: the slot refers to it
  type->tp_call = fast_call;
  return true;
}

// spec: dict with kernel, entry, params (list of dicts), arguments, outputs, n_threads, n_threads_text,
// block, get_image, shared (bytes of dynamic shared memory per Tune variant), requires (the rules
// of jit(requires=...), where there are any) and, for an autotuned op, candidates, key, key_text,
// key_bucket and choose.
// Registers the CUDA kernel (and C++ autograd / ADInplaceOrView fallbacks so that nothing
// Python runs per call) for pnex::<name>.
void register_op(const std::string& name, const py::dict& d, bool autograd_fallback) {
  auto spec = std::make_shared<Spec>();
  spec->python = std::make_shared<Callbacks>();
  spec->kernel = d["kernel"].cast<std::string>();
  for (auto item : d["params"]) {
    auto pd = item.cast<py::dict>();
    Param p;
    p.name = pd["name"].cast<std::string>();
    p.kind = pd["kind"].cast<int>();
    p.dtype = scalar_type(pd["dtype"].cast<std::string>());
    p.itemsize = pd["itemsize"].cast<int64_t>();
    p.ndim = pd["ndim"].cast<int64_t>();
    p.describe = pd["describe"].cast<std::string>();
    for (auto axis : pd["shape"]) {
      if (axis.is_none()) p.shape.emplace_back(std::nullopt);
      else p.shape.emplace_back(to_program(axis));
    }
    p.shape_text = pd["shape_text"].cast<std::vector<std::string>>();
    if (!pd["init"].is_none()) {
      p.has_init = true;
      p.init = pd["init"].cast<double>();
    }
    if (pd.contains("lanes")) {  // a record dtype
      p.lanes = pd["lanes"].cast<int64_t>();
      p.record_message = pd["record_message"].cast<std::string>();
    }
    spec->params.push_back(std::move(p));
  }
  spec->op_name = name;
  spec->interned = intern(spec->kernel);
  spec->arguments = d["arguments"].cast<std::vector<int>>();
  spec->arg_of_param.assign(spec->params.size(), -1);
  for (size_t a = 0; a < spec->arguments.size(); ++a) spec->arg_of_param[spec->arguments[a]] = static_cast<int>(a);
  spec->outputs = d["outputs"].cast<std::vector<int>>();
  for (auto prog : d["n_threads"]) spec->n_threads.push_back(to_program(prog));
  spec->n_threads_text = d["n_threads_text"].cast<std::vector<std::string>>();
  // Block candidates (the first is the default block); an older description has "block" only.
  // A candidate is [x, y, z] or [x, y, z, variant] (the Tune variant it runs).
  auto as_block = [](const py::handle& obj, int* variant) {
    auto sizes = obj.cast<std::vector<unsigned>>();
    std::array<unsigned, 3> block{1, 1, 1};
    for (size_t i = 0; i < 3 && i < sizes.size(); ++i) block[i] = sizes[i];
    *variant = sizes.size() > 3 ? static_cast<int>(sizes[3]) : 0;
    return block;
  };
  int variant = 0;
  if (d.contains("candidates")) {
    for (auto c : d["candidates"]) {
      spec->candidates.push_back(as_block(c, &variant));
      spec->candidate_variant.push_back(variant);
    }
  }
  if (spec->candidates.empty()) {
    spec->candidates.push_back(as_block(d["block"], &variant));
    spec->candidate_variant.push_back(0);
  }
  if (d.contains("tune")) {
    spec->tune_params = d["tune"].cast<std::vector<int>>();
    spec->variants = d["variants"].cast<std::vector<std::vector<int64_t>>>();
  }
  size_t variants = std::max<size_t>(spec->variants.size(), 1);
  for (int cv : spec->candidate_variant) {
    TORCH_CHECK(cv >= 0 && static_cast<size_t>(cv) < variants, "pnex: kernel '", spec->kernel,
                "': a candidate names variant ", std::to_string(cv), " of ", std::to_string(variants));
  }
  for (const auto& values : spec->variants) {
    TORCH_CHECK(values.size() == spec->tune_params.size(), "pnex: kernel '", spec->kernel,
                "': a variant has ", std::to_string(values.size()), " Tune values for ",
                std::to_string(spec->tune_params.size()), " Tune parameters");
  }
  if (d.contains("shared")) {  // dynamic shared memory per variant (absent before shared_bytes: none)
    spec->shared = d["shared"].cast<std::vector<int64_t>>();
    TORCH_CHECK(spec->shared.size() == variants, "pnex: kernel '", spec->kernel, "': dynamic shared memory for ",
                std::to_string(spec->shared.size()), " Tune variant(s) of ", std::to_string(variants));
  }
  spec->allocate_functions(variants);
  if (spec->candidates.size() > 1) {
    for (auto prog : d["key"]) spec->key.push_back(to_program(prog));
    spec->key_text = d["key_text"].cast<std::vector<std::string>>();
    spec->key_bucket = d["key_bucket"].cast<bool>();
    if (d.contains("choose")) spec->python->choose = d["choose"];  // without it: the first candidate
  }
  for (auto item : d["internal_overlap"]) spec->internal_overlap.push_back(item.cast<std::pair<int, std::string>>());
  for (auto item : d["overlap"]) spec->overlap.push_back(item.cast<std::tuple<int, int, std::string>>());
  if (d.contains("requires")) spec->rules = to_rules(d["requires"]);  // jit(requires=...) (absent: none)
  spec->python->get_image = d["get_image"];
  if (d.contains("describe")) spec->python->describe = d["describe"];
  if (d.contains("check")) spec->check_always = d["check"].cast<bool>();
  if (d.contains("cooperative")) spec->cooperative = d["cooperative"].cast<bool>();
  if (d.contains("cluster_dims")) {
    const auto dims = d["cluster_dims"].cast<std::vector<unsigned>>();
    for (size_t axis = 0; axis < dims.size() && axis < 3; ++axis) spec->cluster[axis] = dims[axis];
  }
  if (d.contains("hidden")) spec->hidden = read_hidden(d["hidden"]);

  register_kernels(name, spec, autograd_fallback);
}

}  // namespace

std::string driver_error() { return driver().error; }

// For tests without a GPU: the first rule broken by a call whose tensors have `sizes` (per
// parameter; empty for a scalar) and whose integer scalars are `ints` (per parameter), as
// check_arguments words it ("" if none), and the value of each rule's condition.
std::pair<std::string, std::vector<int64_t>> check_rules(const py::handle& rules_description, const std::string& kernel,
                                                         const std::vector<std::vector<int64_t>>& sizes,
                                                         const std::vector<int64_t>& ints) {
  const std::vector<Rule> rules = to_rules(rules_description);
  std::vector<at::Tensor> tensors;
  tensors.reserve(sizes.size());
  Values v;
  for (size_t i = 0; i < sizes.size(); ++i) {
    tensors.push_back(at::empty(sizes[i], at::TensorOptions().device(at::kMeta)));
    v.tensors.push_back(&tensors.back());
    v.ints.push_back(i < ints.size() ? ints[i] : 0);
  }
  std::vector<int64_t> values;
  for (const Rule& rule : rules) values.push_back(evaluate(rule.condition, v, kernel, rule.text));
  return {broken_rule(rules, v, kernel), values};
}

}  // namespace pnex::launcher

namespace launcher = pnex::launcher;
namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pnex_magic's generic GPU launcher";
  m.def("register_op", &launcher::register_op, py::arg("name"), py::arg("spec"), py::arg("autograd_fallback"));
  m.def("unregister_op", &launcher::unregister_op, py::arg("name"));
  m.def("drop_autograd_fallback", &launcher::drop_autograd_fallback, py::arg("name"));
  m.def("driver_error", &launcher::driver_error);
  m.def("force_candidate", &launcher::force_candidate, py::arg("op_name"), py::arg("candidate"),
        "Calls of op_name on this thread launch candidate `candidate` (-1: choose as usual)");
  m.def("last_kernel", &launcher::last_kernel, py::arg("device"));
  m.def("install_fast_call", &launcher::install_fast_call, py::arg("cls"),
        "Give the op class a C call slot that goes straight to each object's `_fast` entry");
  m.def("force_checked", &launcher::force_checked, py::arg("op_name"),
        "Launches of op_name on this thread run its checked variant (\"\": none)");
  m.def("check_rules", &launcher::check_rules, py::arg("rules"), py::arg("kernel"), py::arg("sizes"), py::arg("ints"),
        "For tests: the message of the first rule of jit(requires=...) broken, and each rule's value");
}
