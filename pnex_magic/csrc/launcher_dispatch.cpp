// pnex_magic's C++ launcher: its registrations with PyTorch's dispatcher.
//
// register_kernels registers, for pnex::<name>: PnexKernel at the CUDA key (launcher_call.cpp),
// a C++ autograd kernel and torch's "not implemented" fallbacks (so that a call runs no Python
// until an autograd formula is attached), and ADInplaceOrView's for an op with an InMut.  Each
// group is one torch::Library, whose destruction removes its registrations (and brings back
// what was registered for the key before it: an op that began on the Python launcher finds
// its Python kernels again).  No pybind11 here (launcher_register.cpp is the Python side).

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <map>

#include "launcher.h"

namespace pnex::launcher {

namespace {

struct Registration {
  std::unique_ptr<torch::Library> cuda;
  std::unique_ptr<torch::Library> autograd;
  std::unique_ptr<torch::Library> inplace;
};
std::map<std::string, Registration>& registry() {
  static auto* r = new std::map<std::string, Registration>();  // never destroyed: avoids exit-order issues
  return *r;
}

// torch < 2.12 has no hook to let the launcher register before CustomOpDef.__init__ puts its
// Python autograd (and ADInplaceOrView) kernels there, so ours replace them, and the dispatcher
// prints "Overriding a previously registered kernel ..." in every process.  Expected and
// harmless here (dropping ours brings theirs back): while we register, that warning about this
// op is dropped, as torch drops it for its own ADInplaceOrView kernel; every other warning goes
// to the handler that was in place.  (torch warns once per process for all operators.)
class DropOverrideWarning final : public c10::WarningHandler {
 public:
  explicit DropOverrideWarning(const std::string& name)
      : op_("operator: pnex::" + name), previous_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    const std::string& msg = warning.msg();
    const size_t at = msg.find(op_);
    const char next = at == std::string::npos || at + op_.size() >= msg.size() ? '\0' : msg[at + op_.size()];
    if (msg.find("Overriding a previously registered kernel") != std::string::npos && (next == '(' || next == '\n')) {
      return;
    }
    previous_->process(warning);
  }

 private:
  std::string op_;
  c10::WarningHandler* previous_;
};

// The op's autograd kernel (the Autograd key).  A call in which no tensor argument requires
// grad (or carries a forward-mode gradient) goes straight below autograd, as a native op's
// VariableType kernel does: no grad_fn, nothing to record.  Any other call goes on to torch's
// "not implemented" autograd fallback, which register_autograd puts at AutogradOther for this
// op: the lowest autograd key, which pnex's dense CPU and CUDA tensors never dispatch to
// (AutogradCPU and AutogradCUDA take the Autograd alias's kernel: this one), so only this
// redispatch reaches it.  The fallback walks the schema and allocates on every call; this
// kernel reads a pointer per tensor argument.
//
// With grad mode on, a call whose InMut argument requires grad is refused: autograd cannot see
// the kernel's writes (on a leaf, torch refuses in-place writes; on any other tensor the
// gradients would silently be wrong).  The check runs here, the last point where grad mode is
// the caller's, for every call (the op object, torch.ops.pnex, torch.compile's tracing on fake
// tensors).  pnex_magic.calls.inmut_grad_error makes the error, as it does for the Python
// launchers, so the message and the type (pnex's ArgumentTypeError) are the same; it is
// raised as the Python exception it is.  An op with an InMut argument always takes the
// fallback after the check (it bumps the written tensors' version counters the way torch
// does for such ops).
class AutogradKernel final : public c10::OperatorKernel {
 public:
  explicit AutogradKernel(std::shared_ptr<const Spec> spec) : spec_(std::move(spec)) {
    for (size_t a = 0; a < spec_->arguments.size(); ++a) {
      const int kind = spec_->params[spec_->arguments[a]].kind;
      if (kind == INMUT) inmut_.push_back(a);
      if (kind == IN || kind == INMUT) tensors_.push_back(a);
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const bool grad = c10::GradMode::is_enabled();
    const size_t first = stack->size() - op.schema().arguments().size();
    if (grad) {
      for (size_t a : inmut_) {
        const c10::IValue& value = (*stack)[first + a];
        if (value.isTensor() && value.toTensor().requires_grad()) {
          refuse(spec_->params[spec_->arguments[a]].name, value.toTensor().is_leaf());
        }
      }
    }
    if (inmut_.empty() && plain(*stack, first, grad)) {
      at::AutoDispatchBelowADInplaceOrView guard;
      op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
      return;
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::AutogradOther) | (keys & c10::after_autograd_keyset),
                       stack);
  }

 private:
  // No tensor argument requires grad (with grad mode on) or has a forward-mode gradient.  A
  // tensor with no autograd metadata has neither.
  bool plain(const torch::jit::Stack& stack, size_t first, bool grad) const {
    for (size_t a : tensors_) {
      const c10::IValue& value = stack[first + a];
      if (!value.isTensor()) continue;
      const at::Tensor& t = value.toTensor();
      if (!t.defined() || t.unsafeGetTensorImpl()->autograd_meta() == nullptr) continue;
      if ((grad && t.requires_grad()) || t._fw_grad(/*level=*/0).defined()) return false;
    }
    return true;
  }

  [[noreturn]] void refuse(const std::string& param, bool leaf) const { refuse_inmut_grad(*spec_, param, leaf); }

  std::shared_ptr<const Spec> spec_;
  std::vector<size_t> inmut_;
  std::vector<size_t> tensors_;
};

// The op's C++ autograd kernels (so that a call runs no Python): the kernel above at Autograd,
// torch's "not implemented" fallback at AutogradOther.  An op with an InMut argument also gets
// the kernel at AutogradCPU and AutogradCUDA: an op that began on the Python launcher has its
// Python check of InMut arguments there (pnex_magic.op), and a kernel registered for a key
// itself comes before the Autograd alias's.  One Library holds them, so dropping it (an
// autograd formula attached) drops them all.
std::unique_ptr<torch::Library> register_autograd(const std::string& name, const std::shared_ptr<const Spec>& spec,
                                                  bool mutates) {
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "pnex", std::nullopt, __FILE__, __LINE__);
  lib->impl(name.c_str(), torch::dispatch(c10::DispatchKey::AutogradOther,
                                          torch::autograd::autogradNotImplementedFallback()));
  std::vector<c10::DispatchKey> keys{c10::DispatchKey::Autograd};
  if (mutates) {
    keys.push_back(c10::DispatchKey::AutogradCPU);
    keys.push_back(c10::DispatchKey::AutogradCUDA);
  }
  for (c10::DispatchKey key : keys) {
    lib->impl(name.c_str(),
              torch::dispatch(key, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<AutogradKernel>(spec))));
  }
  return lib;
}

}  // namespace

void register_kernels(const std::string& name, const std::shared_ptr<Spec>& spec, bool autograd_fallback) {
  const bool mutates =
      std::any_of(spec->params.begin(), spec->params.end(), [](const Param& p) { return p.kind == INMUT; });
  registry().erase(name);
  Registration reg;
  reg.cuda = std::make_unique<torch::Library>(torch::Library::IMPL, "pnex", c10::DispatchKey::CUDA, __FILE__,
                                              __LINE__);
  reg.cuda->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<PnexKernel>(spec)));
  DropOverrideWarning quiet(name);
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  if (autograd_fallback) reg.autograd = register_autograd(name, spec, mutates);
  if (mutates) {
    reg.inplace = std::make_unique<torch::Library>(torch::Library::IMPL, "pnex",
                                                   c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
    reg.inplace->impl(name.c_str(), torch::autograd::autogradNotImplementedInplaceOrViewFallback());
  }
  registry()[name] = std::move(reg);
}

void unregister_op(const std::string& name) { registry().erase(name); }

void drop_autograd_fallback(const std::string& name) {
  auto it = registry().find(name);
  if (it != registry().end()) it->second.autograd.reset();
}

}  // namespace pnex::launcher
