"""IPython front end: the ``%%pnex`` cell magic, ``%pnex_cache`` and ``%pnex_doctor``.

``%load_ext pnex_magic`` registers them.  The magic parses its options (declared
once with ``IPython.core.magic_arguments``, which also writes ``%%pnex?``), runs
the cell, and hands the kernel to the same core as :func:`pnex_magic.jit`
(:func:`pnex_magic.jit.define` with :class:`~pnex_magic.definition.JitOptions`):
same cache, same operator registration.

How a cell runs
---------------
The cell executes in a *copy* of the notebook's namespace in which ``In``,
``InMut``, ``Out``, ``Scalar``, ``Unused`` and ``cuda`` are the pnex annotations
and ``numba.cuda``; the notebook's ``In``/``Out`` history is never touched.  The
kernel's ``__globals__`` is that copy, so Numba and the cache key see the values
of the constants and device functions the kernel reads as they were when the
cell ran.  Its code is compiled under a pseudo-file registered with
``linecache`` whose line numbers are the cell's own (line 1 is the ``%%pnex``
line), so tracebacks, Numba's messages and ``inspect.getsource`` point into the
cell.

What is bound
-------------
Only after everything succeeded: the kernel's name is bound to the op, and every
other name the cell (re)defined is bound too (constants, device functions,
imports), so later cells can use them.  The pnex names injected into the cell are
not bound, nor are other annotated kernels the cell holds (pick one with
``--name``).  On failure nothing is bound.  Interface and example-argument errors
are found before the op is registered; if a later step fails (the kernel faults on
the example arguments, attaching a backward fails), the op had already replaced an
earlier op of the same name in torch's dispatcher, so that earlier definition is
registered again and the name is bound to it (a new op object: the old one's
dispatcher handle went stale when it was replaced).

Errors
------
A failing cell raises one exception from :mod:`pnex_magic.errors` whose message
starts with ``cell line N:``; in IPython it prints as that message and the
offending line, without a traceback through pnex (``_render_traceback_``).
Whatever the compilers printed is captured at the file-descriptor level (as
Cython's magic does) and shown folded, never in the server's terminal; it is
also in the exception's ``compiler_log``.  Option errors are ``UsageError``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import html
import io
import keyword
import linecache
import logging
import os
import re
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Iterator
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

__all__ = [
    "PnexMagics",
    "load_ipython_extension",
    "unload_ipython_extension",
    "capture_output",
    "CacheListing",
    "DoctorReport",
    "doctor",
]

# Names the notebook's history owns: never written by %%pnex.
_HISTORY_NAMES = frozenset({"In", "Out", "_ih", "_oh", "_dh", "_", "__", "___", "_i", "_ii", "_iii"})
_HISTORY_RE = re.compile(r"_(?:i+|i?\d+)")


def _injected_names() -> dict[str, Any]:
    """The names every %%pnex cell sees without importing them."""
    from numba import cuda

    from .spec import In, InMut, Out, Scalar, Unused

    return {"In": In, "InMut": InMut, "Out": Out, "Scalar": Scalar, "Unused": Unused, "cuda": cuda}


# --------------------------------------------------------------------------- output capture


@dataclasses.dataclass
class Captured:
    """Text captured by :func:`capture_output` (filled in when the block exits)."""

    text: str = ""


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


@contextlib.contextmanager
def capture_output() -> Iterator[Captured]:
    """Capture everything printed inside the block: by Python (``sys.stdout``,
    ``sys.stderr``, warnings, logging's last-resort handler) and by native
    libraries writing to file descriptors 1 and 2 (NVVM, ptxas), which in a Jupyter
    kernel would otherwise land in the server's terminal."""
    captured = Captured()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    tmp = tempfile.TemporaryFile()
    saved: list[tuple[int, int]] = []
    for fd in (1, 2):
        try:
            saved.append((fd, os.dup(fd)))
            os.dup2(tmp.fileno(), fd)
        except OSError:
            pass
    out, err = io.StringIO(), io.StringIO()
    caught: list[warnings.WarningMessage] = []
    # pnex's own log records (e.g. "not compiled: no NVVM") go into the capture too.
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package_log = logging.getLogger("pnex_magic")
    package_log.addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield captured
    finally:
        package_log.removeHandler(handler)
        _flush_c_stdio()
        for fd, dup in saved:
            os.dup2(dup, fd)
            os.close(dup)
        tmp.seek(0)
        native = tmp.read().decode("utf-8", "replace")
        tmp.close()
        parts = [out.getvalue(), err.getvalue(), native]
        parts += [f"{w.category.__name__}: {w.message}" for w in caught or ()]
        captured.text = "\n".join(p.rstrip("\n") for p in parts if p and p.strip())


# --------------------------------------------------------------------------- helpers


def _in_kernel(shell) -> bool:
    return getattr(shell, "kernel", None) is not None


def _unquote(token: str) -> str:
    """IPython splits magic lines keeping quotes (``"a, b"`` stays quoted): drop them."""
    token = token.strip()
    if len(token) >= 2 and token[0] == token[-1] and token[0] in "\"'":
        try:
            value = ast.literal_eval(token)
        except (ValueError, SyntaxError):
            return token
        if isinstance(value, str):
            return value
    return token


def _join(tokens: list[str] | None) -> str | None:
    return None if tokens is None else " ".join(_unquote(t) for t in tokens).strip()


def _split_expressions(text: str) -> list[str]:
    """``"a.size(1), a.size(0)"`` or ``"(x, y)"`` → one expression per launch axis."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        return [text.strip()]
    if isinstance(tree.body, ast.Tuple):
        return [ast.get_source_segment(text.strip(), e) or "" for e in tree.body.elts]
    return [text.strip()]


def _describe_previous(value: Any, new_qualname: str) -> str:
    from .op import PnexOp

    if isinstance(value, PnexOp):
        return f"the earlier pnex op {getattr(value, '_qualname', '?')}"
    return _a(type(value).__name__)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _has_pnex_annotation(fn: types.FunctionType) -> bool:
    injected = _injected_names()
    kinds = tuple(injected[n] for n in ("In", "InMut", "Out", "Scalar"))
    for name, ann in getattr(fn, "__annotations__", {}).items():
        if name == "return":
            continue
        if isinstance(ann, kinds) or ann is injected["Unused"] or isinstance(ann, injected["Unused"]):
            return True
        if isinstance(ann, str) and re.search(r"\b(In|InMut|Out|Scalar|Unused)\b", ann):
            return True
    return False


def _all_params_annotated(fn: types.FunctionType) -> bool:
    code = fn.__code__
    names = code.co_varnames[: code.co_argcount]
    ann = getattr(fn, "__annotations__", {})
    return bool(names) and all(n in ann for n in names)


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _restore_registration(previous: Any, state: dict, new_op: Any) -> Any:
    """Register the definition of ``previous`` (a pnex op of the same qualified name
    that ``new_op`` just replaced in torch's dispatcher) again, with its autograd
    formula; ``state`` is ``previous.__dict__`` as it was before ``new_op`` was made.
    Returns the op object now registered, or ``None`` if there is nothing to restore.
    Every op object of the name, ``previous`` included, then calls the restored kernel."""
    from .op import PnexOp, make_op

    qualname = f"{state.get('_namespace')}::{state.get('_name')}"
    if not isinstance(previous, PnexOp) or qualname != getattr(new_op, "_qualname", None):
        return None
    restored = make_op(state["_pnex"])
    backward = state.get("_backward_fn")
    if backward is not None:
        restored.register_autograd(backward, setup_context=state.get("_setup_context_fn"))
    return restored


class _CellFailure(Exception):
    """Internal: carries the exception to raise and the cell line it points at."""

    def __init__(self, error: BaseException, line: int | None):
        super().__init__(str(error))
        self.error = error
        self.line = line


def _render_traceback(exc: BaseException, source_lines: list[str], line: int | None) -> list[str]:
    red, bold, dim, reset = "\x1b[31m", "\x1b[1m", "\x1b[2m", "\x1b[0m"
    out = [f"{red}{bold}{type(exc).__name__}{reset}: {exc}"]
    if line is not None and 1 <= line <= len(source_lines):
        for n in range(max(1, line - 1), min(len(source_lines), line + 1) + 1):
            marker = "--> " if n == line else "    "
            text = source_lines[n - 1].rstrip("\n")
            style = bold if n == line else dim
            out.append(f"{style}{marker}{n:>3} | {text}{reset}")
    log = getattr(exc, "compiler_log", "") or ""
    if log.strip():
        out.append(f"{dim}(full compiler log: {log.count(chr(10)) + 1} lines, folded above in a notebook; "
                   f"also in sys.last_value.compiler_log){reset}")
    return out


# --------------------------------------------------------------------------- the magics


@dataclasses.dataclass
class _Options:
    n_threads: str | tuple[str, ...]
    threads_per_block: int | tuple[int, ...] | None
    to_extension: bool
    max_registers: int | None
    cache_id: str | None
    verbose: bool
    arch: str | None
    args: str | None
    eager: str | None
    name: str | None
    force: bool
    output: str | None
    backward_of: str | None


@magics_class
class PnexMagics(Magics):
    """``%%pnex``, ``%pnex_cache`` and ``%pnex_doctor``."""

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--n-threads", dest="n_threads", action="append", nargs="+", metavar="EXPR",
        help="Total threads per launch axis, as an expression over the kernel's parameters "
             "(e.g. a.numel()). Repeat it, or give comma-separated expressions, for 2-D/3-D "
             "launches in X, Y, Z order. Required.",
    )
    @magic_arguments.argument(
        "--threads-per-block", dest="threads_per_block", metavar="N[,N[,N]]",
        help="Block shape, one size per launch axis, without spaces (default 256, 16,16 or 8,8,4).",
    )
    @magic_arguments.argument(
        "--to-extension", dest="to_extension", action="store_true",
        help="Accepted for compatibility with jit(to_extension=True).",
    )
    @magic_arguments.argument(
        "--max-registers", dest="max_registers", type=int, metavar="N",
        help="Cap on registers per thread (ptxas -maxrregcount); excess spills to local memory.",
    )
    @magic_arguments.argument(
        "--cache-id", dest="cache_id", metavar="ID",
        help="Name of the on-disk cache slot for this kernel (as jit(cache_id=...)).",
    )
    @magic_arguments.argument(
        "--verbose", action="store_true",
        help="Print the compile steps, the compiler output and what was bound.",
    )
    @magic_arguments.argument(
        "--arch", metavar="sm_XY",
        help="Target architecture to compile and inspect for (default: the GPU's, else $PNEX_ARCH, "
             "else sm_75). GPU launches always use the GPU's own.",
    )
    @magic_arguments.argument(
        "--args", dest="args", nargs="+", metavar="EXPR",
        help="Example arguments: an expression evaluated in the notebook's namespace giving the "
             "op's arguments (a tuple, or one value). The op runs on them (through the CUDA "
             "simulator for CPU tensors), and the report shows the concrete grid.",
    )
    @magic_arguments.argument(
        "--eager", nargs="+", metavar="EXPR",
        help="A PyTorch callable taking the same arguments: the reference the op is checked "
             "against (max abs/rel error) and, on a GPU, timed against. Needs --args.",
    )
    @magic_arguments.argument(
        "--name", metavar="NAME",
        help="Which function in the cell is the kernel, when several are annotated.",
    )
    @magic_arguments.argument(
        "--force", action="store_true",
        help="Recompile even if the build cache holds this kernel.",
    )
    @magic_arguments.argument(
        "-o", "--output", metavar="VAR",
        help="Store the report object (a PnexReport) in the notebook variable VAR.",
    )
    @magic_arguments.argument(
        "--backward-of", dest="backward_of", metavar="FORWARD_NAME",
        help="Attach this cell's op as the backward of the pnex op FORWARD_NAME "
             "(pnex_magic.autograd.attach_backward).",
    )
    @cell_magic
    def pnex(self, line: str, cell: str):
        """Compile the Numba-CUDA kernel in this cell into a PyTorch operator.

        The cell holds a function whose parameters are annotated In, InMut, Out,
        Scalar or Unused (these names, and ``cuda``, need no import here; the
        notebook's In/Out history is left alone), and may define device functions
        and constants it uses. It runs in a copy of the notebook's namespace; when
        everything succeeded, the op is bound to the kernel's name and the other
        names the cell defined are bound too. A report (signature, launch,
        PTX/SASS, resources, timing) is shown under the cell. A failing cell
        raises one error pointing at its line and binds nothing.

        Example::

            %%pnex --n-threads a.numel() --args (x,) --eager torch.clone
            def copy(a: In("f32", (None,)), result: Out("f32", "a")):
                i = cuda.grid(1)
                if i < a.shape[0]:
                    result[i] = a[i]
        """
        opts = self._parse(line)
        return _CellRun(self.shell, opts, cell).run()

    def _parse(self, line: str) -> _Options:
        try:
            ns = magic_arguments.parse_argstring(self.pnex, line)
        except ValueError as exc:  # unbalanced quotes
            raise UsageError(f"%%pnex: cannot split the options: {exc}") from None
        if not ns.n_threads:
            raise UsageError("%%pnex needs --n-threads EXPR (e.g. --n-threads a.numel()); see %%pnex?")
        exprs: list[str] = []
        for group in ns.n_threads:
            exprs += _split_expressions(_join(group) or "")
        if any(not e for e in exprs):
            raise UsageError(f"--n-threads: empty expression in {exprs!r}")
        if len(exprs) > 3:
            raise UsageError(f"--n-threads: at most 3 launch axes (X, Y, Z), got {len(exprs)}: {', '.join(exprs)}")
        tpb: int | tuple[int, ...] | None = None
        if ns.threads_per_block:
            text = _unquote(ns.threads_per_block).strip("()")
            try:
                sizes = tuple(int(p) for p in text.split(",") if p.strip())
            except ValueError:
                raise UsageError(f"--threads-per-block expects N[,N[,N]] (positive ints), got {text!r}") from None
            if not sizes or any(s <= 0 for s in sizes) or len(sizes) > 3:
                raise UsageError(f"--threads-per-block expects 1 to 3 positive ints, got {text!r}")
            tpb = sizes[0] if len(sizes) == 1 else sizes
        if ns.max_registers is not None and ns.max_registers <= 0:
            raise UsageError(f"--max-registers must be a positive int, got {ns.max_registers}")
        arch = None if ns.arch is None else _unquote(ns.arch)
        if arch is not None:
            from .compiler import arch_name, parse_arch
            from .errors import KernelDefinitionError

            try:
                arch = arch_name(parse_arch(arch))
            except KernelDefinitionError as exc:
                raise UsageError(f"--arch: {exc}") from None
        for key in ("output", "name", "backward_of", "cache_id"):
            if getattr(ns, key) is not None:
                setattr(ns, key, _unquote(getattr(ns, key)))
        for flag, value in (("--output", ns.output), ("--name", ns.name), ("--backward-of", ns.backward_of)):
            if value is not None and (not value.isidentifier() or keyword.iskeyword(value)):
                raise UsageError(f"{flag} expects a Python name, got {value!r}")
        if ns.output in _HISTORY_NAMES:
            raise UsageError(f"--output {ns.output}: that name is IPython's history; pick another")
        eager = _join(ns.eager)
        args = _join(ns.args)
        if eager and not args:
            raise UsageError("--eager needs --args: the reference is called on the example arguments")
        return _Options(
            n_threads=exprs[0] if len(exprs) == 1 else tuple(exprs),
            threads_per_block=tpb,
            to_extension=ns.to_extension,
            max_registers=ns.max_registers,
            cache_id=ns.cache_id,
            verbose=ns.verbose,
            arch=arch,
            args=args,
            eager=eager,
            name=ns.name,
            force=ns.force,
            output=ns.output,
            backward_of=ns.backward_of,
        )

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--clear", action="store_true", help="Remove cached builds (all, or those matching --kernel)."
    )
    @magic_arguments.argument("--kernel", metavar="NAME", help="Only entries whose kernel name contains NAME.")
    @line_magic
    def pnex_cache(self, line: str):
        """List (or clear) the compiled kernels in pnex's on-disk build cache.

        Builds are stored under $PNEX_CACHE_DIR (else ~/.cache/pnex_magic), keyed by
        the kernel's source, the values it reads, its options, the target
        architecture and the toolchain versions; only successful builds are
        stored. %%pnex --force recompiles without reading the cache.
        """
        ns = magic_arguments.parse_argstring(self.pnex_cache, line)
        from . import cache

        entries = [e for e in cache.entries() if not ns.kernel or ns.kernel in str(e.meta.get("kernel", ""))]
        if ns.clear:
            import shutil

            for entry in entries:
                shutil.rmtree(entry.path, ignore_errors=True)
            return CacheListing.collect(removed=len(entries))
        return CacheListing.collect(entries=entries)

    @line_magic
    def pnex_doctor(self, line: str = ""):
        """Check what this environment can do: GPU and driver, PyTorch's CUDA build,
        the CUDA compiler wheels numba-cuda found (NVVM, nvJitLink, NVRTC), whether
        SASS can be shown, the build cache; and what to install when something is
        missing."""
        if line.strip():
            raise UsageError("%pnex_doctor takes no options")
        return doctor()


def load_ipython_extension(ip) -> None:
    """``%load_ext pnex_magic``: register ``%%pnex``, ``%pnex_cache`` and ``%pnex_doctor``."""
    ip.register_magics(PnexMagics)


def unload_ipython_extension(ip) -> None:
    magics = ip.magics_manager.magics
    for kind, name in (("cell", "pnex"), ("line", "pnex_cache"), ("line", "pnex_doctor")):
        magics[kind].pop(name, None)
    ip.magics_manager.registry.pop("PnexMagics", None)


# --------------------------------------------------------------------------- one cell


class _CellRun:
    """One execution of a %%pnex cell: run the code, compile, check, report, bind."""

    def __init__(self, shell, opts: _Options, cell: str):
        self.shell = shell
        self.opts = opts
        # A blank first line stands for the %%pnex line, so that line numbers in
        # tracebacks, Numba's messages and reports are the cell's own.
        self.source = "\n" + cell
        self.source_lines = self.source.splitlines(keepends=True)
        self.filename = ""
        self.fn: types.FunctionType | None = None
        self.compile_log = ""

    # ------------------------------------------------------------------ driver

    def run(self) -> None:
        opts = self.opts
        steps = 3 + bool(opts.args) + bool(opts.eager) + 1
        from .widget import Progress

        progress = Progress(steps, enabled=_in_kernel(self.shell))
        try:
            report = self._build(progress)
        except UsageError:
            progress.finish()
            raise
        except _CellFailure as failure:
            error = self._finalise_error(failure)
            log = getattr(error, "compiler_log", "") or ""
            shown = False
            if log.strip() and _in_kernel(self.shell):
                from .widget import LogDisplay

                shown = progress.finish(LogDisplay("compiler log", log))
                if not shown:
                    from IPython.display import display

                    display(LogDisplay("compiler log", log))
            else:
                progress.finish()
            # One exception: the internal wrapper is not chained; a wrapped user error
            # (SyntaxError, NameError, ...) stays reachable as __cause__.
            raise error from error.__cause__
        except BaseException:
            progress.finish()
            raise
        if opts.verbose:
            if self.compile_log.strip():
                print(self.compile_log)
            print(f"pnex: {report.binding_text()}")
        if not progress.finish(report):
            from IPython.display import display

            display(report)
        return None

    def _finalise_error(self, failure: _CellFailure) -> BaseException:
        error = failure.error
        line = failure.line
        message = str(error)
        if line is not None and not message.startswith("cell line"):
            prefix = "cell line 1 (the %%pnex line)" if line == 1 else f"cell line {line}"
            error.args = (f"{prefix}: {message}",) + tuple(error.args[1:])
        if self.compile_log.strip():
            previous = (getattr(error, "compiler_log", "") or "").rstrip()
            with contextlib.suppress(Exception):
                error.compiler_log = f"{previous}\n\n{self.compile_log}".strip() if previous else self.compile_log
        error.cell_line = line
        lines = self.source_lines
        error._render_traceback_ = lambda: _render_traceback(error, lines, line)
        return error

    # ------------------------------------------------------------------ steps

    def _build(self, progress):
        from .errors import PnexError
        from .op import PnexOp

        opts = self.opts
        user_ns = self.shell.user_ns

        progress.step("running the cell")
        ns, defined = self._execute()
        kernel_name, fn, skipped = self._select_kernel(defined)
        self.fn = fn
        if kernel_name in _HISTORY_NAMES:
            raise UsageError(f"the kernel may not be called {kernel_name!r}: that name is IPython's history")
        forward = None
        if opts.backward_of:
            forward = user_ns.get(opts.backward_of)
            if not isinstance(forward, PnexOp):
                what = "not defined" if opts.backward_of not in user_ns else _a(type(forward).__name__)
                raise UsageError(
                    f"--backward-of {opts.backward_of}: that name is {what}, not a pnex op; "
                    f"define the forward kernel first (with %%pnex or pnex.jit)"
                )
        visible = dict(user_ns)
        visible.update({k: v for k, v in defined.items() if k != kernel_name})
        args = eager = eager_run = None
        if opts.args:
            args = self._evaluate("--args", opts.args, visible)
            args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        if opts.eager:
            eager = self._evaluate("--eager", opts.eager, visible)
            if not callable(eager):
                raise _CellFailure(PnexError(
                    f"--eager {opts.eager}: that is {_a(type(eager).__name__)}, not a callable; give a PyTorch "
                    f"function taking the op's arguments, e.g. --eager torch.clone or --eager \"lambda a, b: a + b\""
                ), 1)
            progress.step(f"running the eager reference {opts.eager}")
            eager_run = self._run_eager(eager, args)

        progress.step(f"compiling {kernel_name}")
        # Check the interface, and the example arguments against it, before the op is
        # registered: registering replaces any op of the same name in torch's
        # dispatcher, which a failing cell should not do.
        spec = self._check_spec(fn)
        launch = None
        if args is not None:
            try:
                launch = _launch_for(spec, args)
            except PnexError as exc:
                raise _CellFailure(_prefixed(exc, f"--args {opts.args}: "), 1) from None
        previous_value = user_ns.get(kernel_name, _MISSING)
        # Defining the op points earlier op objects of its name at the new registration
        # (see pnex_magic.op._redirect_earlier): remember what the previous one was.
        previous_state = dict(getattr(previous_value, "__dict__", {}))
        op = self._define(fn)
        try:
            return self._after_define(
                progress, op, kernel_name, ns, defined, skipped, args, eager, eager_run, forward, previous_value, launch
            )
        except BaseException:
            # The kernel compiled and was registered, then failed (on the example
            # arguments, or attaching the backward): register the previous op of this
            # name again and bind that, so the name keeps meaning what it meant.
            if previous_value is not _MISSING:
                restored = None
                with contextlib.suppress(Exception):
                    restored = _restore_registration(previous_value, previous_state, op)
                if restored is not None:
                    user_ns[kernel_name] = restored
            raise

    def _after_define(
        self, progress, op, kernel_name, ns, defined, skipped, args, eager, eager_run, forward, previous_value, launch
    ):
        from . import timing
        from .errors import PnexError
        from .widget import Disassembly, PnexReport, disassemble

        opts = self.opts
        user_ns = self.shell.user_ns
        spec = op._pnex.spec
        timing_result = None
        n_values = grid = block = None
        if args is not None:
            n_values, grid, block = launch
            self._warn_if_slow(args, grid, block)
            progress.step(f"running {kernel_name} on --args")
            if _on_cuda(args):
                # The first GPU launch compiles for the device's architecture: do it here,
                # where the compilers' output is captured.
                with capture_output() as captured:
                    op._pnex.compiled(_device_arch(args))
                self._add_log(captured.text)
            op_copies = timing.clone_args(args)
            try:
                with _no_grad():
                    op_out = op(*op_copies)
            except PnexError as exc:
                raise _CellFailure(_prefixed(exc, f"--args {opts.args}: "), 1) from None
            except Exception as exc:
                raise _CellFailure(PnexError(
                    f"--args {opts.args}: calling {kernel_name} on them raised {type(exc).__name__}: {exc}"
                ), 1) from None
            if eager is not None or _on_cuda(args):
                progress.step("checking against eager" + (" and timing on the GPU" if _on_cuda(args) else ""))
            spec_args = spec.arguments
            try:
                timing_result = timing.evaluate(
                    op, args, eager,
                    output_names=[p.name for p in spec.outputs],
                    mutated=[i for i, p in enumerate(spec_args) if p.role == "inmut"],
                    mutated_names=[p.name for p in spec_args if p.role == "inmut"],
                    name=kernel_name,
                    eager_name=opts.eager or "eager",
                    op_run=(op_out, op_copies),
                    eager_run=eager_run,
                )
            except PnexError as exc:
                raise _CellFailure(exc, 1) from None

        progress.step("inspecting the build")
        with capture_output() as captured:
            kernel_report, not_compiled = _kernel_report(op, opts.arch, grid, block)
        self._add_log(captured.text)
        sass = Disassembly(None, None, not_compiled or "no cubin")
        if not not_compiled:
            compiled = op._pnex.compiled(opts.arch)
            sass = disassemble(compiled.cubin)

        if forward is not None:
            try:
                from . import autograd
            except ImportError as exc:
                raise UsageError(f"--backward-of needs pnex_magic.autograd, which is not available: {exc}") from None
            try:
                autograd.attach_backward(forward, op)
            except PnexError as exc:
                raise _CellFailure(_prefixed(exc, f"--backward-of {opts.backward_of}: "), 1) from None
            except Exception as exc:
                err = PnexError(f"--backward-of {opts.backward_of}: {type(exc).__name__}: {exc}")
                raise _CellFailure(err, 1) from None

        # Everything succeeded: bind.
        previous = "" if previous_value is _MISSING else _describe_previous(previous_value, op._qualname)
        also = tuple(sorted(k for k in defined if k != kernel_name and k not in skipped))
        user_ns[kernel_name] = op
        for name in also:
            user_ns[name] = defined[name]
        _prune_globals(ns, self.code_names, defined)
        report = PnexReport(
            kernel=kernel_report,
            op=op,
            bound_name=kernel_name,
            previous=previous,
            also_bound=also,
            timing=timing_result,
            sass=sass,
            n_threads_values=n_values,
            compile_log=self.compile_log,
            skipped=tuple(skipped),
            backward_of=opts.backward_of,
            eager_text=opts.eager,
            args_text=opts.args,
            not_compiled=not_compiled,
        )
        if opts.output:
            user_ns[opts.output] = report
        return report

    def _add_log(self, text: str) -> None:
        if text and text.strip():
            self.compile_log = (self.compile_log + "\n" + text).strip()

    def _execute(self) -> tuple[dict[str, Any], dict[str, Any]]:
        compiler = getattr(self.shell, "compile", None)
        number = getattr(self.shell, "execution_count", 0)
        if compiler is not None and hasattr(compiler, "cache"):
            self.filename = compiler.cache(self.source, number, raw_code=self.source)
        else:
            self.filename = f"<pnex-cell-{number}-{abs(hash(self.source)) & 0xFFFFFFFF:x}>"
            linecache.cache[self.filename] = (len(self.source), None, self.source_lines, self.filename)
        try:
            # dont_inherit: this module's `from __future__ import annotations` must
            # not turn the cell's annotations into strings.
            code = compile(self.source, self.filename, "exec", dont_inherit=True)
        except SyntaxError as exc:
            from .errors import KernelDefinitionError

            detail = f"invalid Python: {exc.msg}"
            if exc.text:
                detail += f"\n    {exc.text.rstrip()}"
                if exc.offset:
                    detail += "\n    " + " " * (exc.offset - 1) + "^"
            err = KernelDefinitionError(detail)
            err.__cause__ = exc
            raise _CellFailure(err, exc.lineno) from None
        self.code_names = _code_names(code)
        ns = dict(self.shell.user_ns)
        injected = _injected_names()
        ns.update(injected)
        before = dict(ns)
        try:
            _exec_cell(code, ns)
        except Exception as exc:
            from .errors import KernelDefinitionError

            line = _line_in(exc.__traceback__, self.filename)
            hint = ""
            if isinstance(exc, TypeError) and re.search(r"__init__\(\) missing", str(exc)):
                hint = "; tensor annotations take a dtype and a shape: In(dtype, shape), Out(dtype, shape[, init])"
            elif isinstance(exc, NameError):
                hint = "; define or import it in this cell or an earlier one"
            err = KernelDefinitionError(f"running the cell raised {type(exc).__name__}: {exc}{hint}")
            err.__cause__ = exc
            raise _CellFailure(err, line) from None
        defined = {}
        for key, value in ns.items():
            if key.startswith("__") and key.endswith("__"):
                continue
            if key in _HISTORY_NAMES or _HISTORY_RE.fullmatch(key):
                continue
            if key in before and before[key] is value:
                continue
            if key in injected and value is injected[key]:
                continue
            defined[key] = value
        return ns, defined

    def _select_kernel(self, defined: dict[str, Any]) -> tuple[str, types.FunctionType, list[str]]:
        from .errors import KernelDefinitionError

        functions = {
            k: v for k, v in defined.items()
            if isinstance(v, types.FunctionType) and v.__code__.co_filename == self.filename
        }
        annotated = sorted((k for k, v in functions.items() if _has_pnex_annotation(v)),
                           key=lambda k: functions[k].__code__.co_firstlineno)
        if self.opts.name:
            if self.opts.name not in functions:
                listing = ", ".join(annotated or functions) or "none"
                raise UsageError(f"--name {self.opts.name}: the cell defines no function of that name "
                                 f"(its functions: {listing})")
            chosen = self.opts.name
        elif len(annotated) == 1:
            chosen = annotated[0]
        elif len(annotated) > 1:
            raise UsageError(f"the cell defines {len(annotated)} annotated kernels ({', '.join(annotated)}); "
                             f"choose one with --name")
        else:
            candidates = [k for k, v in functions.items() if _all_params_annotated(v)]
            if len(candidates) != 1:
                hint = ""
                wrapped = []
                for k, v in defined.items():
                    inner = getattr(v, "py_func", None) or getattr(getattr(v, "_pnex", None), "fn", None)
                    if isinstance(inner, types.FunctionType) and _has_pnex_annotation(inner):
                        wrapped.append(k)
                if wrapped:
                    hint = (f"; {', '.join(wrapped)} is already wrapped (by @cuda.jit or pnex.jit): "
                            f"remove the decorator, %%pnex compiles the plain function")
                err = KernelDefinitionError(
                    "the cell defines no kernel: write a function whose parameters are annotated with "
                    "In(dtype, shape), InMut(...), Out(...), Scalar(dtype) or Unused" + hint
                )
                raise _CellFailure(err, 2)
            chosen = candidates[0]
        skipped = [k for k in annotated if k != chosen]
        return chosen, functions[chosen], skipped

    def _evaluate(self, flag: str, text: str, namespace: dict[str, Any]) -> Any:
        from .errors import PnexError

        try:
            # Example arguments and the reference are the user's expressions, evaluated
            # like any cell's code in (a copy of) the notebook's namespace.
            return eval(compile(text, f"<{flag}>", "eval", dont_inherit=True), namespace)  # noqa: S307
        except Exception as exc:
            raise _CellFailure(PnexError(
                f"{flag} {text}: evaluating it raised {type(exc).__name__}: {exc}. It is evaluated in the "
                f"notebook's namespace (plus the names this cell defines); quote it if it has spaces"
            ), 1) from None

    def _run_eager(self, eager, args):
        from . import timing
        from .errors import PnexError

        copies = timing.clone_args(args)
        try:
            with _no_grad():
                result = eager(*copies)
        except Exception as exc:
            raise _CellFailure(PnexError(
                f"--eager {self.opts.eager}: calling it on the --args raised {type(exc).__name__}: {exc}"
            ), 1) from None
        return result, copies

    def _check_spec(self, fn):
        """The kernel's spec (what ``define`` builds first), for checks before registering."""
        from .errors import PnexError
        from .spec import build_spec

        try:
            return build_spec(fn, n_threads=self.opts.n_threads, threads_per_block=self.opts.threads_per_block)
        except PnexError as exc:
            raise _CellFailure(exc, self._line_for(exc)) from None

    def _define(self, fn):
        from .definition import JitOptions
        from .errors import KernelDefinitionError, PnexError
        from .jit import define

        opts = self.opts
        options = JitOptions(
            to_extension=opts.to_extension,
            cache_id=opts.cache_id,
            verbose=opts.verbose,
            max_registers=opts.max_registers,
            arch=opts.arch,
            force=bool(opts.force),
        )
        try:
            with capture_output() as captured:
                op = define(fn, n_threads=opts.n_threads, threads_per_block=opts.threads_per_block, options=options)
        except PnexError as exc:
            self._add_log(captured.text)
            line = self._line_for(exc)
            raise _CellFailure(exc, line) from None
        except Exception as exc:
            self._add_log(captured.text)
            err = KernelDefinitionError(f"compiling the kernel raised {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            raise _CellFailure(err, _line_in(exc.__traceback__, self.filename) or self._def_line()) from None
        self._add_log(captured.text)
        return op

    def _def_line(self) -> int | None:
        return self.fn.__code__.co_firstlineno if self.fn is not None else None

    def _line_for(self, exc: BaseException) -> int | None:
        """The cell line an error from the core is about."""
        lineno = getattr(exc, "lineno", None)
        if isinstance(lineno, int) and lineno > 0:
            return lineno
        from .compiler import numba_error_line

        lineno = numba_error_line(exc, self.filename)
        if lineno is not None:
            return lineno
        text = str(exc)
        if re.search(r"n_threads|threads_per_block", text) and "parameter '" not in text:
            return 1
        m = re.search(r"parameter '(\w+)'", text)
        if m and self.fn is not None:
            line = self._param_line(m.group(1))
            if line:
                return line
        return self._def_line()

    def _param_line(self, param: str) -> int | None:
        try:
            tree = ast.parse(self.source)
        except SyntaxError:
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == self.fn.__name__:
                for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                    if arg.arg == param:
                        return arg.lineno
        return None

    def _warn_if_slow(self, args, grid, block) -> None:
        if grid is None or _on_cuda(args):
            return
        threads = grid[0] * grid[1] * grid[2] * block[0] * block[1] * block[2]
        if threads > 16384:
            print(
                f"pnex: note: this launch runs {threads:,} threads in the CUDA simulator (CPU tensors), at "
                f"roughly 2,000 threads per second; use smaller --args on CPU",
                file=sys.stderr,
            )


_MISSING = object()


def _exec_cell(code: types.CodeType, namespace: dict[str, Any]) -> None:
    # The one place that runs a %%pnex cell's code.  `namespace` is a copy of the
    # notebook's namespace with the pnex annotation names and numba's `cuda` put in:
    # the cell reads the user's constants and helpers, and the kernel's __globals__
    # (what Numba and the cache key read) is this dict, not the notebook's.
    exec(code, namespace)  # noqa: S102


def _prune_globals(ns: dict[str, Any], code_names: set[str], defined: dict[str, Any]) -> None:
    """Drop from the cell's namespace (the kernel's ``__globals__``) every notebook
    name the cell's code never mentions, so the op does not keep the notebook's
    other objects (large tensors) alive."""
    injected = set(_injected_names())
    for key in list(ns):
        if key in code_names or key in defined or key in injected or (key.startswith("__") and key.endswith("__")):
            continue
        del ns[key]


def _line_in(tb, filename: str) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _prefixed(exc: BaseException, prefix: str) -> BaseException:
    exc.args = (prefix + str(exc),) + tuple(exc.args[1:])
    return exc


def _on_cuda(args) -> bool:
    import torch

    return any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args or ())


def _device_arch(args) -> str:
    import torch

    device = next(a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda")
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


@contextlib.contextmanager
def _no_grad():
    import torch

    with torch.no_grad():
        yield


def _launch_for(spec, args) -> tuple[tuple[int, ...], tuple[int, int, int], tuple[int, int, int]]:
    """``n_threads`` values, grid and block for example arguments (checked first)."""
    import torch

    from .errors import ArgumentTypeError
    from .op import check_arguments, launch_grid, output_shapes

    if len(args) != len(spec.arguments):
        names = ", ".join(p.name for p in spec.arguments)
        raise ArgumentTypeError(
            f"{spec.name}() takes {len(spec.arguments)} argument(s) ({names}) but --args gives {len(args)}"
        )
    env = {p.name: v for p, v in zip(spec.arguments, args, strict=True)}
    for p in spec.arguments:
        if getattr(p, "role", "") in ("in", "inmut") and not isinstance(env[p.name], torch.Tensor):
            got = type(env[p.name]).__name__
            raise ArgumentTypeError(f"{spec.name}(): argument {p.name!r} must be a torch.Tensor, got {got}")
    check_arguments(spec, env)
    for p, shape in zip(spec.outputs, output_shapes(spec, env), strict=True):
        env[p.name] = torch.empty(shape, device="meta")
    values = tuple(int(e.evaluate(env)) for e in spec.n_threads)
    grid, block = launch_grid(spec, env)
    return values, grid, block


def _kernel_report(op, arch: str | None, grid, block):
    """``pnex.inspect(op)`` with the grid for the example arguments, and a note when
    there is no CUDA compiler (the report then covers the interface alone)."""
    from .report import inspect

    report = dataclasses.replace(inspect(op, arch=arch), grid=grid, block=block)
    error = op._pnex.toolchain_error
    if error is None:
        return report, ""
    return report, f"no CUDA compiler ({error}); the op runs on CPU tensors through the simulator"


# --------------------------------------------------------------------------- %pnex_cache


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


@dataclasses.dataclass(frozen=True)
class CacheRow:
    kernel: str
    arch: str
    size_bytes: int
    age_seconds: float
    registers: int | None
    slot: str


@dataclasses.dataclass(frozen=True)
class CacheListing:
    """The build cache's entries (``%pnex_cache``), or how many were removed."""

    directory: str
    rows: tuple[CacheRow, ...]
    removed: int | None = None

    @classmethod
    def collect(cls, entries=None, removed: int | None = None) -> CacheListing:
        from . import cache

        rows = []
        now = time.time()
        for entry in entries or ():
            size = sum(p.stat().st_size for p in entry.path.iterdir() if p.is_file())
            res = entry.meta.get("resources") or {}
            rows.append(CacheRow(
                kernel=str(entry.meta.get("kernel", "?")).removeprefix("__main__."),
                arch=str(entry.meta.get("arch", "?")),
                size_bytes=size,
                age_seconds=max(0.0, now - float(entry.meta.get("created", now))),
                registers=res.get("registers"),
                slot=entry.path.name,
            ))
        return cls(str(cache.cache_dir()), tuple(rows), removed)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __str__(self) -> str:
        if self.removed is not None:
            entries = "entry" if self.removed == 1 else "entries"
            return f"pnex build cache {self.directory}: removed {self.removed} {entries}"
        total = sum(r.size_bytes for r in self.rows)
        from .timing import format_bytes

        out = [f"pnex build cache {self.directory}: {len(self.rows)} entr{'y' if len(self.rows) == 1 else 'ies'}, "
               f"{format_bytes(total)}"]
        if self.rows:
            out.append(f"  {'kernel':<28} {'arch':<7} {'regs':>4} {'size':>9} {'age':>7}  slot")
            for r in self.rows:
                out.append(f"  {r.kernel[:28]:<28} {r.arch:<7} {'' if r.registers is None else r.registers:>4} "
                           f"{format_bytes(r.size_bytes):>9} {_age(r.age_seconds):>7}  {r.slot[:16]}")
        return "\n".join(out)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("CacheListing(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        from .timing import format_bytes

        e = html.escape
        if self.removed is not None:
            return f"<div>pnex build cache <code>{e(self.directory)}</code>: removed {self.removed} entries</div>"
        head = (f"<div>pnex build cache <code>{e(self.directory)}</code>: {len(self.rows)} entries, "
                f"{format_bytes(sum(r.size_bytes for r in self.rows))}</div>")
        if not self.rows:
            return head
        cell = "padding:1px 10px 1px 0;text-align:left"
        rows = "".join(
            f'<tr><td style="{cell}"><code>{e(r.kernel)}</code></td><td style="{cell}">{e(r.arch)}</td>'
            f'<td style="{cell}">{"" if r.registers is None else r.registers}</td>'
            f'<td style="{cell}">{format_bytes(r.size_bytes)}</td><td style="{cell}">{_age(r.age_seconds)}</td>'
            f'<td style="{cell}"><code>{e(r.slot[:16])}</code></td></tr>'
            for r in self.rows
        )
        header = "".join(f'<th style="{cell}">{h}</th>' for h in ("kernel", "arch", "registers", "size", "age", "slot"))
        return f'{head}<table style="border-collapse:collapse;color:inherit"><tr>{header}</tr>{rows}</table>'


# --------------------------------------------------------------------------- %pnex_doctor


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of :class:`DoctorReport`: ``status`` is "ok", "warn" or "missing"."""

    name: str
    status: str
    detail: str
    advice: str = ""


@dataclasses.dataclass(frozen=True)
class DoctorReport:
    """What this environment can do for pnex (``%pnex_doctor``)."""

    checks: tuple[Check, ...]
    advice: tuple[str, ...]

    def __getitem__(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self) -> str:
        mark = {"ok": "ok  ", "warn": "WARN", "missing": "MISS"}
        out = ["pnex doctor"]
        for c in self.checks:
            out.append(f"  [{mark.get(c.status, c.status)}] {c.name:<22} {c.detail}")
        if self.advice:
            out.append("what to do:")
            out += [f"  - {a}" for a in self.advice]
        else:
            out.append("everything pnex uses is in place")
        return "\n".join(out)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text("DoctorReport(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        e = html.escape
        colour = {"ok": "var(--jp-success-color1, #2e9d4f)", "warn": "var(--jp-warn-color1, #d98c00)",
                  "missing": "var(--jp-error-color1, #d9473f)"}
        cell = "padding:1px 10px 1px 0;text-align:left;vertical-align:top"
        rows = "".join(
            f'<tr><td style="{cell};color:{colour.get(c.status, "inherit")};font-weight:600">{e(c.status)}</td>'
            f'<td style="{cell}">{e(c.name)}</td><td style="{cell}">{e(c.detail)}</td></tr>'
            for c in self.checks
        )
        advice = ("<div><b>What to do</b><ul>" + "".join(f"<li><code>{e(a)}</code></li>" if a.startswith("pip ")
                                                         else f"<li>{e(a)}</li>" for a in self.advice) + "</ul></div>"
                  if self.advice else "<div>Everything pnex uses is in place.</div>")
        return (f'<div style="color:inherit"><b>pnex doctor</b><table style="border-collapse:collapse;color:inherit">'
                f"{rows}</table>{advice}</div>")


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


_PROBE_PTX = """.version 7.0
.target sm_75
.address_size 64
.visible .entry pnex_doctor_probe()
{
\tret;
}
"""


def doctor() -> DoctorReport:
    """Probe the GPU, driver, PyTorch build and CUDA compiler wheels (no compile of
    user code); see :class:`DoctorReport`."""
    from . import __version__, cache

    checks: list[Check] = []
    advice: list[str] = []
    in_colab = "google.colab" in sys.modules
    checks.append(Check("pnex_magic", "ok", f"{__version__} on Python {sys.version.split()[0]}"
                        + (" (Google Colab)" if in_colab else "")))

    # PyTorch and the GPU.
    import torch

    torch_cuda = torch.version.cuda
    build = f"built for CUDA {torch_cuda}" if torch_cuda else "CPU-only build"
    checks.append(Check("torch", "ok" if torch_cuda else "warn", f"{torch.__version__}, {build}"))
    gpu = False
    try:
        gpu = torch.cuda.is_available()
    except Exception:
        gpu = False
    driver_cuda: tuple[int, int] | None = None
    driver_text = "no NVIDIA driver found"
    try:
        from cuda.bindings import driver as cu_driver

        err, version = cu_driver.cuDriverGetVersion()
        if int(err) == 0 and version:
            driver_cuda = (version // 1000, (version % 1000) // 10)
            driver_text = f"supports CUDA {driver_cuda[0]}.{driver_cuda[1]}"
    except Exception as exc:  # no libcuda.so: no driver
        driver_text = f"no NVIDIA driver found ({type(exc).__name__})"
    if gpu:
        names = []
        for i in range(torch.cuda.device_count()):
            cc = torch.cuda.get_device_capability(i)
            names.append(f"{torch.cuda.get_device_name(i)} (sm_{cc[0]}{cc[1]})")
        checks.append(Check("GPU", "ok", "; ".join(names)))
    else:
        checks.append(Check("GPU", "warn", "none visible to PyTorch: ops run on CPU tensors through the CUDA "
                            "simulator (slow; for small tests), and nothing is timed"))
        if in_colab:
            advice.append("On Colab choose Runtime > Change runtime type > T4 GPU, then reconnect")
        elif driver_cuda and not torch_cuda:
            advice.append("A driver is installed but PyTorch is a CPU-only build: install a CUDA build of PyTorch "
                          "(https://pytorch.org/get-started/locally/)")
    checks.append(Check("NVIDIA driver", "ok" if driver_cuda else ("missing" if gpu else "warn"), driver_text))

    # The CUDA compiler wheels.
    flavour = None
    if any(_dist_version(d) for d in ("nvidia-nvjitlink-cu12", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvcc-cu12")):
        flavour = 12
    if _dist_version("nvidia-nvvm") or _dist_version("nvidia-nvjitlink"):
        flavour = 13 if flavour is None else flavour
    wanted = 12 if (driver_cuda and driver_cuda[0] == 12) or (torch_cuda or "").startswith("12") else 13
    install = f'pip install "pnex_magic[cu{wanted}]"'
    ncv = _dist_version("numba-cuda")
    checks.append(Check("numba-cuda", "ok" if ncv else "missing", ncv or "not installed"))
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        checks.append(Check("NUMBA_ENABLE_CUDASIM", "warn",
                            "set: numba runs everything in the simulator; unset it to compile"))

    def libpath(name: str) -> str:
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            return load_nvidia_dynamic_lib(name).abs_path or ""
        except Exception:
            return ""

    try:
        from numba.cuda.cudadrv import nvvm

        ir = nvvm.NVVM().get_version()
        checks.append(Check("NVVM", "ok", f"NVVM IR {ir[0]}.{ir[1]} {libpath('nvvm')}".strip()))
        nvvm_ok = True
    except Exception as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        checks.append(Check("NVVM", "missing", f"not found ({why}): no PTX, kernels run only in the simulator"))
        nvvm_ok = False
    try:
        from cuda.bindings import nvjitlink

        from .compiler import link_cubin

        major, minor = nvjitlink.version()
        link_cubin(_PROBE_PTX, "sm_75", None, "pnex_doctor_probe")
        checks.append(Check("nvJitLink", "ok", f"CUDA {major}.{minor} {libpath('nvJitLink')}".strip()))
        link_ok = True
    except Exception as exc:
        checks.append(Check("nvJitLink", "missing", f"not usable ({type(exc).__name__}): no cubin, registers or SASS"))
        link_ok = False
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        checks.append(Check("NVRTC", "ok", f"CUDA {major}.{minor} {libpath('nvrtc')}".strip()))
    except Exception as exc:
        checks.append(Check("NVRTC", "warn", f"not found ({type(exc).__name__})"))
    if not (nvvm_ok and link_ok):
        advice.append(install + "   # the CUDA compiler wheels (NVVM, nvJitLink) matching your driver")
    wheels = f"CUDA {flavour} (numba-cuda[cu{flavour}])" if flavour else "no nvidia-* compiler wheels found"
    checks.append(Check("compiler wheels", "ok" if flavour else "warn", wheels))
    if driver_cuda and flavour and flavour > driver_cuda[0]:
        checks.append(Check("driver vs wheels", "warn",
                            f"the compiler wheels are CUDA {flavour} but the driver supports CUDA "
                            f"{driver_cuda[0]}.{driver_cuda[1]}: GPU launches may fail to load the kernels"))
        advice.append(f'pip install "pnex_magic[cu{driver_cuda[0]}]"   # compiler wheels the driver can run')

    # SASS.
    from .widget import find_disassembler

    found = find_disassembler()
    if found:
        checks.append(Check("SASS", "ok", f"{found[0]} at {found[1]}"))
    else:
        checks.append(Check("SASS", "warn", "no cuobjdump or nvdisasm: the report shows PTX but no SASS"))
        advice.append('pip install "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*"   # to see SASS '
                      '(these CUDA 13 tools also read CUDA 12 builds)')

    # The build cache.
    entries = cache.entries()
    size = sum(p.stat().st_size for e in entries for p in e.path.iterdir() if p.is_file())
    from .timing import format_bytes

    checks.append(Check("build cache", "ok", f"{cache.cache_dir()}: {len(entries)} entries, {format_bytes(size)}"))
    return DoctorReport(tuple(checks), tuple(advice))
