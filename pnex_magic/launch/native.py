"""The C++ launcher: one extension (``csrc/launcher*.cpp``), built once per
environment, that registers each pnex op's CUDA kernel with PyTorch's dispatcher.

:class:`NativeLauncher` owns that registration: :meth:`~NativeLauncher.register`
hands the C++ side the op's launch description
(:func:`~pnex_magic.launch.description.describe_launch`) and a callback that
returns the kernel's code for a device's architecture; the C++ side registers a
boxed functor for the CUDA dispatch key (and C++ autograd and ADInplaceOrView
fallbacks, so that a call runs no Python until an autograd formula is attached).
GPU calls then go from the dispatcher straight to ``cuLaunchKernel``.

An autotuned op also hands over a ``choose`` callback: the C++ side keeps a
key → block table and calls it (with the GIL) on the first call of each key; the
callback asks :func:`pnex_magic.launch.autotune.choose`, whose benchmark calls the
op again through the dispatcher with a candidate forced (:func:`forced_candidate`).

The first run in an environment
-------------------------------
Building the extension takes tens of seconds, so no call waits for it.  Where it
is not built yet, the first op definition starts its build in a background process
(:mod:`.background`) and the op's CUDA calls go through the Python driver launcher
(:class:`~pnex_magic.launch.driver.DriverLauncher`) meanwhile.  Once the build is
there, the ops registered meanwhile *switch*: the C++ side registers its kernels
for them on top of the op's Python ones (the dispatcher keeps every registration
of a key and serves the newest; the Python kernels stay registered underneath, so a
call already running in them finishes there), :data:`install_fast_call` gives the
op class its C call slot, and an autograd formula attached meanwhile is kept (the
C++ autograd kernel is then not registered).  The switch happens at the first op
call through an op object (or op definition, or CUDA call through the Python
launcher) that finds the build there, at most every half second, and only while no
other op-object call is in flight on any thread (:func:`call`): torch's dispatcher
updates a table entry without any lock against a call reading it on another thread,
so pnex changes an op's registration only when its own calls are out of the
dispatcher.  ``PNEX_LAUNCHER=native`` builds in the foreground instead (the first
definition waits, with a progress line); ``PNEX_LAUNCHER=driver`` never uses the
C++ launcher.  Where it cannot be built (no host compiler, no CUDA headers, a
failed build, a cache folder that cannot be written), one note per process says
why, and the Python launcher serves.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..calls import launch_info
from ..errors import KernelCompileError
from . import autotune, background, build, checks
from .description import describe_launch
from .driver import DriverLauncher
from .kernel import Kernel


__all__ = [
    "NativeLauncher", "load_launcher", "available", "native_wanted", "forced_candidate", "last_kernel", "prepare",
    "wait", "call", "registered", "status", "timing_note",
]

log = logging.getLogger(__name__)

#: The launcher's translation units, by concern (see csrc/launcher.h), compiled in
#: parallel by ninja; each includes only the torch headers it needs.
SOURCES = tuple(build.CSRC / f"launcher_{part}.cpp" for part in ("faults", "call", "autotune", "dispatch", "register"))
#: Its own headers, part of the build key: the internal ones and the dlopen'd driver
#: table (shared with jax_ffi.cpp).
HEADERS = tuple(build.CSRC / name for name in ("launcher.h", "launcher_faults.h", "launcher_python.h", "cuda_driver.h"))
#: Where a launcher built elsewhere would be found, used without any build (none ships
#: with pnex_magic: see the README's "How it works").
PREBUILT = Path(__file__).resolve().parent.parent / "prebuilt"
_module: Any = None
_load_lock = threading.Lock()

_CFLAGS = ["-O2"]


def _ldflags() -> list[str]:
    torch_lib = str(Path(torch.__file__).parent / "lib")
    return [f"-L{torch_lib}", "-lc10_cuda", "-ldl"]


def _build_key(*includes: str) -> str:
    return build.build_key([*SOURCES, *HEADERS], list(includes), _CFLAGS + _ldflags())


def launcher_build(verbose: bool = False) -> build.Build:
    """The launcher's :class:`~pnex_magic.launch.build.Build` here (a clear
    ``KernelCompileError`` where the CUDA headers are missing)."""
    return build.Build(
        "pnex_launcher", "extension", "C++ launcher", tuple(map(str, SOURCES)),
        includes=tuple(build.cuda_headers("C++ launcher", crt=True)), cflags=tuple(_CFLAGS),
        ldflags=tuple(_ldflags()), headers=tuple(map(str, HEADERS)), verbose=verbose,
    )


def _prebuilt() -> Any | None:
    """A launcher shipped in the package (``prebuilt/launcher.json`` names its module, its
    library and the torch versions, major.minor, it serves), imported without any
    build; ``None`` where there is none for this torch (none ships with pnex_magic)."""
    try:
        manifest = json.loads((PREBUILT / "launcher.json").read_text())
        serves = ".".join(torch.__version__.split("+")[0].split(".")[:2]) in manifest["torch"]
        return build.import_library(manifest["module"], PREBUILT / manifest["library"]) if serves else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_launcher(verbose: bool = False, built_only: bool = False):
    """Import the launcher, building it first (in the foreground) if it is not built;
    ``built_only``: import it only if it is built already (``None`` otherwise)."""
    if _module is not None:
        return _module
    with _load_lock:
        if _module is not None:
            return _module
        module = _prebuilt()
        if module is None:
            target = _target(verbose)
            if not built_only:
                background.build_now(target)
            module = build.import_built(target.name, target.folder)
            if module is None and not built_only:
                raise KernelCompileError(f"pnex built its C++ launcher in {target.folder}, but it does not import")
        if module is not None:
            _loaded(module)
        return _module


def _loaded(module: Any) -> None:
    global _module
    _module = module
    _module.force_checked(checks.forced_name())  # this thread's checked launches, if any
    _install_fast_call()


def force_checked(op_name: str) -> None:
    """Launches of ``op_name`` on this thread run its checked variant ("": none)."""
    if _module is not None:
        _module.force_checked(op_name)


checks.follow(force_checked)  # the C++ side decides per launch: it follows checks.checked_launches


_fast_call_class: list[type] = []


def install_fast_call(cls: type) -> bool:
    """Give the op class ``cls`` the launcher's C call slot (calls with positional
    arguments go to each object's ``_fast`` entry with no Python frame) once the
    launcher is loaded and no op waits for it (an op waiting for the switch counts its
    calls in :func:`call`, which the slot would skip); returns whether it has it now."""
    if cls not in _fast_call_class:
        _fast_call_class.append(cls)
    return _install_fast_call()


def _install_fast_call() -> bool:
    if _module is None or _pending or not _fast_call_class:
        return False
    return bool(_module.install_fast_call(_fast_call_class[0]))


def last_kernel(device: int) -> str:
    """The kernel the C++ launcher launched last on cuda:``device`` ("" if none)."""
    return _module.last_kernel(device) if _module is not None else ""


def native_wanted() -> bool:
    return os.environ.get("PNEX_LAUNCHER", "auto") != "driver" and torch.cuda.is_available()


def _foreground() -> bool:
    """``PNEX_LAUNCHER=native``: build the launcher before the first op uses it."""
    return os.environ.get("PNEX_LAUNCHER", "auto") == "native"


def available() -> bool:
    """Whether the launcher is built and loaded (does not build it)."""
    return _module is not None


def registered(op_name: str) -> bool:
    """Whether the C++ launcher's kernels serve ``op_name``'s CUDA calls."""
    return op_name in _registered


# ---------------------------------------------------------------------------- the switch
#
# Ops registered while the launcher builds (_pending, by op name) wait for the switch;
# op names with an autograd formula attached (_autograd) keep CustomOpDef's autograd
# kernel when they switch.  Op-object calls in flight are counted (call()) while any op
# waits: the switch happens only while none is.

_pending: dict[str, Kernel] = {}
_autograd: set[str] = set()
_registered: set[str] = set()
_gate = threading.Condition()
_in_flight = 0  # op-object calls in flight, on every thread (counted while ops wait)
_draining = False  # the launcher is built: new calls wait while those in flight finish
_local = threading.local()  # .depth: this thread's op-object calls in flight (nested calls pass)
_next_poll = 0.0
_POLL_SECONDS = 0.5
_noted: list[str] = []  # the one note of this process (why the Python launcher serves)
_restarted = False


def call(fn: Callable[..., Any], args: tuple) -> Any:
    """Run an op-object call ``fn(*args)``.  While ops wait for the C++ launcher, the
    call is counted as in flight; once the launcher is built, the ops switch at the
    first moment with no call in flight: a call that finds it built waits (if others
    are in flight) until the last of them has switched the ops, and then runs on the
    C++ launcher.  Calls made inside a call on the same thread pass."""
    global _in_flight
    if not _pending:
        return fn(*args)
    depth = getattr(_local, "depth", 0)
    with _gate:
        if depth == 0:
            _poll_locked()
            while _draining and _pending:
                _gate.wait()
        _in_flight += 1
    _local.depth = depth + 1
    try:
        return fn(*args)
    finally:
        _local.depth = depth
        with _gate:
            _in_flight -= 1
            if _in_flight == 0 and _draining:
                _switch_locked()


def poll() -> None:
    """Look whether the launcher is built, at most every half second, and switch the
    waiting ops (at once if no op-object call is in flight, else when the last one
    ends); called where a CUDA call reaches the Python launcher, and at op definitions."""
    if _pending and time.monotonic() >= _next_poll:
        with _gate:
            _poll_locked()


def _poll_locked(force: bool = False) -> None:
    """:func:`poll`'s work, ``_gate`` held."""
    global _next_poll, _restarted, _draining
    now = time.monotonic()
    if not _pending or _draining or (now < _next_poll and not force):
        return
    _next_poll = now + _POLL_SECONDS
    try:
        target = _target()
    except KernelCompileError as exc:  # the headers went away: nothing to switch to
        _give_up(str(exc))
        return
    found = background.state(target)
    if found == "built":
        if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
            _next_poll = now  # not while a CUDA graph is being captured: at the next call after it
            return
        _draining = True
        if _in_flight == 0:
            _switch_locked()
    elif found == "failed":
        _give_up(background.problem(target) or "its build failed")
    elif found == "none" and not _restarted:  # the build process was killed: once more
        _restarted = True
        background.start(target)
    elif found == "none":
        _give_up(f"the C++ launcher's build process ended twice before it was done (killed? its output: "
                 f"{background.log_path(target)})")


def _switch_locked() -> None:
    """Switch the waiting ops (``_gate`` held, no op-object call in flight) and let the
    calls waiting for it go."""
    global _draining
    try:
        _switch(_target())
    finally:
        _draining = False
        _gate.notify_all()


_targets: dict[bool, build.Build] = {}


def _target(verbose: bool = False) -> build.Build:
    """:func:`launcher_build`, looked up once per process."""
    found = _targets.get(verbose)
    if found is None:
        found = _targets[verbose] = launcher_build(verbose)
    return found


def _switch(target: build.Build) -> None:
    """Load the built launcher and move every waiting op onto it (``_gate`` held, no
    op-object call in flight)."""
    try:
        with _load_lock:
            module = _module or build.import_built(target.name, target.folder)
            if module is None:
                raise KernelCompileError(f"pnex built its C++ launcher in {target.folder}, but it does not import")
            if _module is None:
                _loaded(module)
    except Exception as exc:  # noqa: BLE001 - the Python launcher keeps serving
        _give_up(f"its build in {target.folder} does not load ({type(exc).__name__}: {exc})")
        return
    for name, definition in list(_pending.items()):
        try:
            _register(name, definition)
        except Exception as exc:  # noqa: BLE001 - this op stays on the Python launcher
            log.warning("pnex: kernel %r stays on the Python launcher: %s", definition.spec.name, exc)
        _pending.pop(name, None)
    _install_fast_call()
    log.debug("pnex: the C++ launcher serves CUDA calls now")


def _register(name: str, definition: Kernel) -> None:
    _module.register_op(name, launcher_spec(definition), name not in _autograd)
    _registered.add(name)


def _give_up(why: str) -> None:
    """The waiting ops stay on the Python launcher: say why, once per process."""
    _pending.clear()
    note(why)


def note(why: str) -> None:
    """The one note of a process whose GPU calls go through the Python launcher."""
    if _noted:
        return
    _noted.append(why)
    log.warning(
        "pnex: CUDA calls go through the Python launcher (tens of microseconds a call, against a few for the C++ "
        "launcher): %s", why,
    )


def prepare() -> None:
    """Make the launcher ready early (``%load_ext``'s warm-up): import it if it is built,
    else start its build in the background.  Says nothing; the first op definition that
    cannot use it says why."""
    if not native_wanted() or _module is not None:
        return
    if _prebuilt_or_built() is None:
        _start_build(say=False)


def _start_build(verbose: bool = False, *, say: bool = True) -> build.Build | None:
    """Start the launcher's build in a background process unless it is built or being
    built; returns the build, or ``None`` where it cannot be built here: then, with
    ``say``, the note says why and the ops waiting for it stay on the Python launcher."""
    try:
        target = _target(verbose)
        why = background.problem(target)
    except KernelCompileError as exc:  # no CUDA headers
        target, why = None, str(exc)
    if why is not None:
        if say:
            _give_up(why)
        return None
    background.start(target)
    return target


def _prebuilt_or_built() -> Any | None:
    """The launcher, imported now if it is there (shipped or built), unless ops wait for
    the switch (which moves them when no call is in flight)."""
    if _module is not None or _pending:
        return _module
    try:
        return load_launcher(built_only=True)
    except KernelCompileError:  # no CUDA headers: there is none
        return None


def wait(timeout: float | None = None) -> bool:
    """Wait until the C++ launcher serves CUDA calls, every op defined so far included
    (starting its build if none runs); ``False`` where it cannot (the note says why), or
    when ``timeout`` seconds pass first."""
    if not native_wanted():
        return False
    deadline = None if timeout is None else time.monotonic() + timeout
    if not _pending and _prebuilt_or_built() is not None:
        return True
    target = _start_build()
    if target is None:
        return False
    found = background.wait(target, None if deadline is None else max(0.0, deadline - time.monotonic()))
    if found == "built" and not _pending:
        return _prebuilt_or_built() is not None
    with _gate:
        if found != "building":
            _poll_locked(force=True)  # built: switch now, or once the calls in flight end
        while _pending and _draining:  # op-object calls in flight on other threads
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            _gate.wait(left)
    return _module is not None and not _pending


def timing_note(op_name: str) -> str:
    """What a timing of ``op_name``'s CUDA calls should say about the launcher it went
    through ("" for the C++ launcher)."""
    if registered(op_name) or not native_wanted():
        return ""
    if op_name in _pending:
        return "through the Python launcher (the C++ launcher is being built: the cell's next run times it)"
    return "through the Python launcher (no C++ launcher here: see %pnex_doctor)"


def status() -> str:
    """The C++ launcher's state in this process, in words (``%pnex_doctor``)."""
    if _module is not None:
        return "loaded" + (f"; {len(_pending)} op(s) wait for the switch" if _pending else "")
    if _noted:
        return f"not used: {_noted[0]}"
    try:
        found = background.state(_target())
    except KernelCompileError as exc:
        return f"cannot be built: {exc}"
    return {"built": "built, not loaded yet", "building": "building in the background", "failed": "its build failed",
            "none": "not built yet"}[found]


def launcher_spec(definition: Kernel) -> dict[str, Any]:
    """What the C++ side registers: the launch description plus ``get_image`` and,
    for an autotuned op, ``choose``."""

    def get_image(device_index: int, contiguous: bool, variant: int = 0, checked: bool = False) -> tuple[bytes, str]:
        arch = "sm_%d%d" % torch.cuda.get_device_capability(device_index)
        return definition.kernel_image(arch, "C" if contiguous else "A", variant, checked=checked)

    def describe(record: list[int]) -> str:
        error = definition.violation_error(record)
        return "" if error is None else str(error)

    def choose(device_index: int, contiguous: bool, key: tuple[int, ...], args: tuple | None) -> tuple[int, bool]:
        # args is None while the stream is capturing: nothing may run then.
        return autotune.choose(
            definition, device_index=device_index, layout="C" if contiguous else "A", key=tuple(key),
            capturing=args is None, runner=lambda: _runner(definition, device_index, args),
        )

    return {
        **describe_launch(definition.spec), "get_image": get_image, "choose": choose, "describe": describe,
        "check": bool(getattr(definition.options, "check", False)),
    }


@contextlib.contextmanager
def forced_candidate(op_name: str, index: int) -> Iterator[None]:
    """Calls of ``op_name`` on this thread launch candidate ``index`` (the tuner's runs)."""
    _module.force_candidate(op_name, index)
    try:
        yield
    finally:
        _module.force_candidate("", -1)


def _runner(definition: Kernel, device_index: int, args: tuple) -> autotune.Runner:
    """Candidates run through the dispatcher, on copies of the ``InMut`` arguments."""
    spec = definition.spec
    op = getattr(torch.ops.pnex, definition.op_name).default
    inmut = [i for i, p in enumerate(spec.arguments) if p.role == "inmut"]
    values = list(args)
    for i in inmut:
        values[i] = args[i].clone()

    def run(index: int) -> list[torch.Tensor]:
        with forced_candidate(definition.op_name, index):
            out = op(*values)
        outs = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
        return outs + [values[i] for i in inmut]

    def reset() -> None:
        for i in inmut:
            values[i].copy_(args[i])

    def n_threads(variant: int) -> tuple[int, ...]:
        return launch_info(spec, args, variant=variant).n_threads

    return autotune.Runner(run, reset, n_threads, torch.device("cuda", device_index))


class NativeLauncher:
    """CUDA calls through the C++ launcher, registered with the dispatcher per op."""

    name = "native"

    def __init__(self) -> None:
        self._fallback = DriverLauncher()

    def register(self, definition: Kernel) -> bool:
        """Register the op's CUDA kernel with the dispatcher; ``False`` where the C++
        launcher is not ready (the op is then served by the Python launcher, and
        switches when the background build is done), cannot be built here (one note
        says why), or the kernel has no compiled code."""
        if not native_wanted() or not definition.compiles:
            return False
        poll()
        module = _prebuilt_or_built()
        if module is None and _foreground() and not _pending:
            try:
                module = load_launcher(verbose=definition.options.verbose)
            except KernelCompileError as exc:
                note(str(exc).splitlines()[0])
                return False
        if module is None:
            return self._wait_for_build(definition)
        try:
            _register(definition.op_name, definition)
        except Exception as exc:  # noqa: BLE001 - the Python launcher still works
            note(f"registering kernel {definition.spec.name!r} failed: {exc}")
            return False
        return True

    def _wait_for_build(self, definition: Kernel) -> bool:
        """The op starts on the Python launcher; it waits for the switch if the launcher
        can be built (its build is started), else the note says why not."""
        if _start_build(definition.options.verbose) is not None:
            with _gate:
                _pending[definition.op_name] = definition
        return False

    def last_kernel(self, device: int) -> str:
        """The pnex kernel launched last on cuda:``device``, by either launcher ("" if none)."""
        return last_kernel(device) or self._fallback.last_kernel(device)

    def unregister(self, op_name: str) -> None:
        """Drop what an earlier definition of ``op_name`` left: its C++ registration, its
        place among the ops waiting for the switch."""
        with _gate:
            _pending.pop(op_name, None)
        _autograd.discard(op_name)
        _registered.discard(op_name)
        if _module is not None:
            _module.unregister_op(op_name)

    def autograd_registered(self, definition: Kernel) -> None:
        """An autograd formula now exists: drop the C++ "not implemented" autograd
        kernel (an op that switches later keeps CustomOpDef's)."""
        _autograd.add(definition.op_name)
        if _module is not None:
            _module.drop_autograd_fallback(definition.op_name)

    def candidate(self, definition: Kernel, values: Sequence[Any], device: torch.device) -> int:
        """The launch candidate of a call the Python launcher serves (registered ops
        choose in C++)."""
        return self._fallback.candidate(definition, values, device)

    def launch(
        self,
        definition: Kernel,
        values: Sequence[Any],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        device: torch.device,
        variant: int = 0,
    ) -> None:
        """Calls of a registered op never reach Python; this serves the others (waiting
        for the switch, or where the C++ launcher cannot be built) through the Python
        launcher."""
        poll()
        self._fallback.launch(definition, values, grid, block, device, variant)
