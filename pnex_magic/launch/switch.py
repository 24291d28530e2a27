"""The CUDA launcher of an op, and the first run in an environment: ops are served at
once by the Python driver launcher while the C++ launcher builds in the background,
and switch to it when it is built, in the same process.

:class:`NativeLauncher` is the launcher pnex registers for CUDA tensors.  Where the
C++ launcher (:mod:`.native`) is loaded, or shipped, or built (then imported), an op
registers its own dispatcher kernels there at once.  Where it is not built yet, the
first op definition starts its build in a background process (:mod:`.background`) and
the op's CUDA calls go through the Python driver launcher
(:class:`~pnex_magic.launch.driver.DriverLauncher`) meanwhile.  Once the build is
there, the ops registered meanwhile *switch*: the C++ side registers its kernels for
them on top of the op's Python ones (the dispatcher keeps every registration of a
key and serves the newest; the Python kernels stay registered underneath, so a call
already running in them finishes there), the op class gets its C call slot, and an
autograd formula attached meanwhile is kept (the C++ autograd kernels are then not
registered).

When: at the first op-object call (or op definition, or CUDA call through the
Python launcher) that finds the build there, at most every half second, never
during a CUDA-graph capture, and only when no op-object call is in flight on any
thread (:func:`call` counts them while ops wait; a call that finds the build there
while others are in flight waits until the last of them has switched): torch's
dispatcher writes an op's table entry with no lock against a call reading it on
another thread, so pnex changes an op's registration only when its own calls are out
of the dispatcher.  ``PNEX_LAUNCHER=native`` builds in the foreground instead (the
first definition waits, with a progress line); ``PNEX_LAUNCHER=driver`` never uses
the C++ launcher.  Where it cannot be built (no host compiler, no CUDA headers, a
failed build, a cache folder that cannot be written), one note per process says why
(:func:`note`), and the Python launcher serves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import KernelCompileError
from . import background, build, native
from .driver import DriverLauncher
from .kernel import Kernel

__all__ = ["NativeLauncher", "call", "poll", "prepare", "wait", "note", "status", "timing_note", "waiting"]

log = logging.getLogger(__name__)

# Ops registered while the launcher builds (_pending, by op name) wait for the switch;
# op names with an autograd formula attached (_autograd) keep CustomOpDef's autograd
# kernel when they switch.  Op-object calls in flight are counted (call()) while any op
# waits: the switch happens only while none is.

_pending: dict[str, Kernel] = {}
_autograd: set[str] = set()
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
    global _next_poll, _draining
    now = time.monotonic()
    if not _pending or _draining or (now < _next_poll and not force):
        return
    _next_poll = now + _POLL_SECONDS
    try:
        target = native._target()
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
    elif found == "none":
        _restart(target)


def _restart(target: build.Build) -> bool:
    """The build process ended before it was done (killed): start it once more; the
    second time, give up (the note says so).  Returns ``False`` when it gave up."""
    global _restarted
    if not _restarted:
        _restarted = True
        background.start(target)
        return True
    _give_up(f"the C++ launcher's build process ended twice before it was done (killed? its output: "
             f"{background.log_path(target)})")
    return False


def _switch_locked() -> None:
    """Switch the waiting ops (``_gate`` held, no op-object call in flight) and let the
    calls waiting for it go."""
    global _draining
    try:
        _switch(native._target())
    finally:
        _draining = False
        _gate.notify_all()


def _switch(target: build.Build) -> None:
    """Load the built launcher and move every waiting op onto it (``_gate`` held, no
    op-object call in flight)."""
    try:
        if native.load_launcher(built_only=True) is None:
            raise KernelCompileError(f"pnex built its C++ launcher in {target.folder}, but it does not import")
    except Exception as exc:  # noqa: BLE001 - the Python launcher keeps serving
        _give_up(f"its build in {target.folder} does not load ({type(exc).__name__}: {exc})")
        return
    for name, definition in list(_pending.items()):
        try:
            native.register(definition, autograd_fallback=name not in _autograd)
        except Exception as exc:  # noqa: BLE001 - this op stays on the Python launcher
            log.warning("pnex: kernel %r stays on the Python launcher: %s", definition.spec.name, exc)
        _pending.pop(name, None)
    native.hold_fast_call(False)
    log.debug("pnex: the C++ launcher serves CUDA calls now")


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
    if not native.native_wanted() or native.available():
        return
    if _prebuilt_or_built() is None:
        _start_build(say=False)


def _start_build(verbose: bool = False, *, say: bool = True) -> build.Build | None:
    """Start the launcher's build in a background process unless it is built or being
    built; returns the build, or ``None`` where it cannot be built here: then, with
    ``say``, the note says why and the ops waiting for it stay on the Python launcher."""
    try:
        target = native._target(verbose)
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
    if native.available() or _pending:
        return native._module
    try:
        return native.load_launcher(built_only=True)
    except KernelCompileError:  # no CUDA headers: there is none
        return None


def wait(timeout: float | None = None) -> bool:
    """Wait until the C++ launcher serves CUDA calls, every op defined so far included
    (starting its build if none runs, and once more if its build process ends before it
    is done); ``False`` where it cannot (the note says why), or when ``timeout`` seconds
    pass first."""
    if not native.native_wanted():
        return False
    deadline = None if timeout is None else time.monotonic() + timeout
    if not _pending and _prebuilt_or_built() is not None:
        return True
    target = _start_build()
    if target is None:
        return False
    while True:
        found = background.wait(target, None if deadline is None else max(0.0, deadline - time.monotonic()))
        if found == "built" and not _pending:
            return _prebuilt_or_built() is not None
        if found == "building":  # the time is up
            break
        with _gate:
            # built: switch now, or once the calls in flight end; failed: give up (the note
            # says why); none, the build process ended before it was done (killed): once
            # more, and wait for that build too (returning then, after the restart, let
            # the caller go on without the launcher although a build was under way).
            if not _pending:  # no op waits for the switch: none or failed
                if found == "none" and _restart(target):
                    continue
                if found == "failed":
                    _give_up(background.problem(target) or "its build failed")
                break
            _poll_locked(force=True)
            if found != "none" or not _pending or _draining:
                break
    with _gate:
        while _pending and _draining:  # op-object calls in flight on other threads
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            _gate.wait(left)
    return native.available() and not _pending


def waiting(op_name: str) -> bool:
    """Whether ``op_name``'s CUDA calls go through the Python launcher only until the
    C++ launcher being built takes them over."""
    return op_name in _pending and not native.registered(op_name)


def timing_note(op_name: str) -> str:
    """What a timing of ``op_name``'s CUDA calls should say about the launcher it went
    through ("" for the C++ launcher)."""
    if native.registered(op_name) or not native.native_wanted():
        return ""
    if waiting(op_name):
        return "through the Python launcher (the C++ launcher is being built: the cell's next run times it)"
    return "through the Python launcher (no C++ launcher here: see %pnex_doctor)"


def status() -> str:
    """The C++ launcher's state in this process, in words (``%pnex_doctor``)."""
    if native.available():
        return "loaded" + (f"; {len(_pending)} op(s) wait for the switch" if _pending else "")
    if _noted:
        return f"not used: {_noted[0]}"
    try:
        found = background.state(native._target())
    except KernelCompileError as exc:
        return f"cannot be built: {exc}"
    return {"built": "built, not loaded yet", "building": "building in the background", "failed": "its build failed",
            "none": "not built yet"}[found]


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
        if not native.native_wanted() or not definition.compiles:
            return False
        poll()
        module = _prebuilt_or_built()
        if module is None and native._foreground() and not _pending:
            try:
                module = native.load_launcher(verbose=definition.options.verbose)
            except KernelCompileError as exc:
                note(str(exc).splitlines()[0])
                return False
        if module is None:
            return self._wait_for_build(definition)
        try:
            native.register(definition)
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
                native.hold_fast_call(True)  # its calls are counted in call(), which the slot would skip
        return False

    def last_kernel(self, device: int) -> str:
        """The pnex kernel launched last on cuda:``device``, by either launcher ("" if none)."""
        return native.last_kernel(device) or self._fallback.last_kernel(device)

    def unregister(self, op_name: str) -> None:
        """Drop what an earlier definition of ``op_name`` left: its C++ registration, its
        place among the ops waiting for the switch."""
        with _gate:
            _pending.pop(op_name, None)
        _autograd.discard(op_name)
        native.unregister(op_name)

    def autograd_registered(self, definition: Kernel) -> None:
        """An autograd formula now exists: drop the C++ "not implemented" autograd
        kernel (an op that switches later keeps CustomOpDef's)."""
        _autograd.add(definition.op_name)
        native.drop_autograd_fallback(definition.op_name)

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
