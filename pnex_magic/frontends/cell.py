"""One run of a ``%%pnex`` cell: execute it, pick the kernel, hand it to the core,
bind the names.

How a cell runs
---------------
The cell executes in a *copy* of the notebook's namespace in which ``In``,
``InMut``, ``Out``, ``Scalar``, ``Unused``, ``Tune`` and ``cuda`` are the pnex
annotations and ``numba.cuda``; the notebook's ``In``/``Out`` history is never touched.  The
kernel's ``__globals__`` is that copy, so Numba and the cache key see the values
of the constants and device functions the kernel reads as they were when the
cell ran.  Its code is compiled under a pseudo-file registered with
``linecache`` whose line numbers are the cell's own (line 1 is the ``%%pnex``
line), so tracebacks, Numba's messages and ``inspect.getsource`` point into the
cell.

Then the core does the rest: :func:`pnex_magic.define.definition` checks the
interface, :func:`pnex_magic.calls.launch_info` checks the example arguments
against it (before anything is registered), :func:`pnex_magic.define.registered`
compiles and registers the op transactionally, and inside that block
:func:`pnex_magic.report.build_report` runs the op on the example arguments,
checks it against the eager reference and times both; a backward is attached
there too.  A failure anywhere in the block registers the previous op of the
name again (the core's transaction), and nothing is bound.

What is bound
-------------
Only after everything succeeded: the kernel's name is bound to the op (with
``--jax``, to its JAX function, :func:`pnex_magic.jax_op`, whose ``.op`` is the op),
and every
other name the cell (re)defined is bound too (constants, device functions,
imports), so later cells can use them.  The pnex names injected into the cell are
not bound, nor are other annotated kernels the cell holds (pick one with
``--name``).

Errors
------
A failing cell raises one exception from :mod:`pnex_magic.errors` whose message
starts with ``cell line N:``; in IPython it prints as that message and the
offending line, without a traceback through pnex (``_render_traceback_``).
Whatever the compilers printed is captured at the file-descriptor level and
shown folded, never in the server's terminal; it is also in the exception's
``compiler_log``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import linecache
import re
import sys
import types
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from .. import autograd, sass
from ..calls import launch_info
from ..define import definition as make_definition
from ..define import registered
from ..errors import COMPILER_LOG_NOTE, KernelDefinitionError, PnexError
from ..lazycuda import cuda  # numba.cuda, imported on first use: a cache hit needs no Numba
from ..op import PnexOp
from ..profiling import profiled
from ..render.progress import LogDisplay, Progress
from ..render.report import REDEFINED, SAME_OP, PnexReport
from ..report import build_report
from ..snapshot import code_names
from ..spec import In, InMut, Out, Scalar, Seed, Tune, Unused
from .capture import capture_output
from .jit import attach_derived_backward

__all__ = ["CellRun", "HISTORY_NAMES", "injected_names"]

# Names the notebook's history owns: never written by %%pnex.
HISTORY_NAMES = frozenset({"In", "Out", "_ih", "_oh", "_dh", "_", "__", "___", "_i", "_ii", "_iii"})
_HISTORY_RE = re.compile(r"_(?:i+|i?\d+)")


def injected_names() -> dict[str, Any]:
    """The names every %%pnex cell sees without importing them."""
    return {"In": In, "InMut": InMut, "Out": Out, "Scalar": Scalar, "Unused": Unused, "Tune": Tune, "Seed": Seed,
            "cuda": cuda}


def in_kernel(shell) -> bool:
    return getattr(shell, "kernel", None) is not None


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"


def _source_key(value: Any) -> str | None:
    """The kernel source's fingerprint of the op a name holds (None for anything else)."""
    return getattr(getattr(_as_op(value), "_pnex", None), "source_key", None)


def _describe_previous(value: Any, new: Any, previous_key: str | None) -> str:
    """What a name held before a cell bound ``new`` (an op, or its JAX function) to it;
    ``previous_key``: the :func:`_source_key` it had then (redefining an op updates it)."""
    if isinstance(value, PnexOp):
        name = getattr(value, "_qualname", "?")
        if name == getattr(_as_op(new), "_qualname", None):  # an op's name comes from the kernel's name and module
            return SAME_OP if previous_key is not None and previous_key == _source_key(new) else REDEFINED
        return f"the earlier pnex op {name}"
    return _a(type(value).__name__)


def _as_op(value: Any) -> Any:
    """The pnex op a notebook name holds: the op, or the op of a JAX function (--jax)."""
    inner = getattr(value, "op", None)
    return inner if not isinstance(value, PnexOp) and isinstance(inner, PnexOp) else value


def _has_pnex_annotation(fn: types.FunctionType) -> bool:
    kinds = (In, InMut, Out, Scalar, Tune)
    for name, ann in getattr(fn, "__annotations__", {}).items():
        if name == "return":
            continue
        if isinstance(ann, kinds) or ann is Unused or isinstance(ann, Unused):
            return True
        if isinstance(ann, str) and re.search(r"\b(In|InMut|Out|Scalar|Unused|Tune)\b", ann):
            return True
    return False


def _all_params_annotated(fn: types.FunctionType) -> bool:
    code = fn.__code__
    names = code.co_varnames[: code.co_argcount]
    ann = getattr(fn, "__annotations__", {})
    return bool(names) and all(n in ann for n in names)


class CellFailure(Exception):
    """Internal: carries the exception to raise and the cell line it points at."""

    def __init__(self, error: BaseException, line: int | None):
        super().__init__(str(error))
        self.error = error
        self.line = line


def _render_traceback(exc: BaseException, source_lines: list[str], line: int | None,
                      shown_above: bool = False) -> list[str]:
    red, bold, dim, reset = "\x1b[31m", "\x1b[1m", "\x1b[2m", "\x1b[0m"
    out = [f"{red}{bold}{type(exc).__name__}{reset}: {exc}"]
    if line is not None and 1 <= line <= len(source_lines):
        for n in range(max(1, line - 1), min(len(source_lines), line + 1) + 1):
            marker = "--> " if n == line else "    "
            text = source_lines[n - 1].rstrip("\n")
            style = bold if n == line else dim
            out.append(f"{style}{marker}{n:>3} | {text}{reset}")
    log = getattr(exc, "compiler_log", "") or ""
    if log.strip() and not shown_above:
        out.append(f"{dim}(the full compiler log, {log.count(chr(10)) + 1} lines: sys.last_value.compiler_log){reset}")
    return out


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
    injected = set(injected_names())
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


class CellRun:
    """One execution of a %%pnex cell (``opts`` are the parsed options)."""

    def __init__(self, shell, opts: Any, cell: str):
        self.shell = shell
        self.opts = opts
        # A blank first line stands for the %%pnex line, so that line numbers in
        # tracebacks, Numba's messages and reports are the cell's own.
        self.source = "\n" + cell
        self.source_lines = self.source.splitlines(keepends=True)
        self.filename = ""
        self.fn: types.FunctionType | None = None
        self.compile_log = ""
        self.code_names: set[str] = set()
        self.sanitizer = None  # the --sanitize report

    # ------------------------------------------------------------------ driver

    def run(self) -> None:
        opts = self.opts
        steps = 3 + bool(opts.args) + bool(opts.eager) + 1
        progress = Progress(steps, enabled=in_kernel(self.shell))
        try:
            report = self._build(progress.step)
        except UsageError:
            progress.finish()
            raise
        except CellFailure as failure:
            error = self._finalise_error(failure)
            log = getattr(error, "compiler_log", "") or ""
            if log.strip() and in_kernel(self.shell):
                if not progress.finish(LogDisplay("compiler log", log)):
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
        shown = progress.finish(report)
        if not shown:
            self._fill_sass(report)
            from IPython.display import display

            display(report)
        elif self._fill_sass(report):
            # The report showed with its SASS still being made (the disassembler takes
            # 0.2-0.5 s to start); the listing replaces the note in the same output.
            progress.handle.update(report)
        if self.sanitizer is not None:
            from IPython.display import display

            report.sanitizer = self.sanitizer
            display(self.sanitizer)
        return None

    @staticmethod
    def _fill_sass(report: PnexReport) -> bool:
        """Put the finished SASS listing in a report shown before it was made; whether
        there was one to wait for."""
        pending = report.sass
        if not isinstance(pending, sass.PendingDisassembly):
            return False
        found = pending.result()
        report.sass = found
        report.kernel = dataclasses.replace(report.kernel, sass=found)
        return True

    def _finalise_error(self, failure: CellFailure) -> BaseException:
        error = failure.error
        line = failure.line
        message = str(error)
        if line is not None and not message.startswith("cell line"):
            prefix = "cell line 1 (the %%pnex line)" if line == 1 else f"cell line {line}"
            # The cell line is the kernel's line: "kernel 'k' (line 5)" says it once more. The
            # compiler log is pointed at once, by the cell (folded above it in a notebook).
            message = message.replace(f" (line {line}):", ":", 1).replace(f"\n{COMPILER_LOG_NOTE}", "")
            error.args = (f"{prefix}: {message}",) + tuple(error.args[1:])
        if self.compile_log.strip():
            previous = (getattr(error, "compiler_log", "") or "").rstrip()
            with contextlib.suppress(Exception):
                error.compiler_log = f"{previous}\n\n{self.compile_log}".strip() if previous else self.compile_log
        error.cell_line = line
        lines = self.source_lines
        shown_above = in_kernel(self.shell)  # run() shows the compiler log folded above the error
        error._render_traceback_ = lambda: _render_traceback(error, lines, line, shown_above)
        return error

    # ------------------------------------------------------------------ steps

    def _build(self, step: Callable[[str], None]) -> PnexReport:
        opts = self.opts
        user_ns = self.shell.user_ns

        step("running the cell")
        ns, defined = self._execute()
        kernel_name, fn, skipped = self._select_kernel(defined)
        self.fn = fn
        if kernel_name in HISTORY_NAMES:
            raise UsageError(f"the kernel may not be called {kernel_name!r}: that name is IPython's history")
        forward = None
        if opts.backward_of:
            forward = _as_op(user_ns.get(opts.backward_of))
            if not isinstance(forward, PnexOp):
                what = "not defined" if opts.backward_of not in user_ns else _a(type(forward).__name__)
                raise UsageError(
                    f"--backward-of {opts.backward_of}: that name is {what}, not a pnex op; "
                    f"define the forward kernel first (with %%pnex or pnex.jit)"
                )
        visible = dict(user_ns)
        visible.update({k: v for k, v in defined.items() if k != kernel_name})
        args = eager = None
        if opts.args:
            args = self._evaluate("--args", opts.args, visible)
            args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        if opts.eager:
            eager = self._evaluate("--eager", opts.eager, visible)
            if not callable(eager):
                raise CellFailure(PnexError(
                    f"--eager {opts.eager}: that is {_a(type(eager).__name__)}, not a callable; give a PyTorch "
                    f"function taking the op's arguments, e.g. --eager torch.clone or --eager \"lambda a, b: a + b\""
                ), 1)

        step(f"compiling {kernel_name}")
        # The interface, and the example arguments against it, are checked before the
        # op is registered: registering replaces any op of the same name.
        definition = self._definition(fn)
        self._prefetch_sass(definition)
        if args is not None:
            try:
                launch = launch_info(definition.spec, args)
            except PnexError as exc:
                raise CellFailure(_prefixed(exc, f"--args {opts.args}: "), 1) from None
            self._warn_if_slow(args, launch.threads)
        previous_value = user_ns.get(kernel_name, _MISSING)
        previous_key = _source_key(previous_value)
        with self._failures_located(), registered(definition) as op:
            with capture_output() as captured:
                try:
                    kernel_report = build_report(
                        op, arch=opts.arch, args=args, eager=eager, progress=step,
                        args_name=f"--args {opts.args}", eager_name=f"--eager {opts.eager}" if opts.eager else None,
                        check_first=True, sass="later" if in_kernel(self.shell) else True,
                    )
                    if opts.sanitize:
                        # lazy: compute-sanitizer's runner (and the definition it builds on) only for --sanitize
                        from ..sanitize import run_sanitizer

                        step("running --args under compute-sanitizer in a child process")
                        self.sanitizer = run_sanitizer(op, args)
                    if opts.profile:
                        step("running --args once under Nsight Compute in a child process")
                        kernel_report = profiled(kernel_report, op, args)
                finally:
                    self._add_log(captured.text)
            if opts.backward == "auto":
                with capture_output() as captured:
                    try:
                        attach_derived_backward(op)
                    except PnexError as exc:
                        raise CellFailure(_prefixed(exc, "--backward auto: "), self._line_for(exc)) from None
                    finally:
                        self._add_log(captured.text)
            if forward is not None:
                try:
                    autograd.attach_backward(forward, op)
                except Exception as exc:
                    if not isinstance(exc, PnexError):
                        exc = PnexError(f"{type(exc).__name__}: {exc}")
                    raise CellFailure(_prefixed(exc, f"--backward-of {opts.backward_of}: "), 1) from None
            bound = op
            if opts.jax:
                from .jax_op import jax_op  # imports JAX (an optional dependency); without it, nothing is bound

                bound = jax_op(op)

        # Everything succeeded: bind.
        previous = "" if previous_value is _MISSING else _describe_previous(previous_value, bound, previous_key)
        also = tuple(sorted(k for k in defined if k != kernel_name and k not in skipped))
        user_ns[kernel_name] = bound
        for name in also:
            user_ns[name] = defined[name]
        _prune_globals(ns, self.code_names, defined)
        report = PnexReport.from_kernel(
            kernel_report, op, kernel_name,
            previous=previous,
            also_bound=also,
            compile_log=self.compile_log,
            skipped=tuple(skipped),
            backward_of=opts.backward_of,
            eager_text=opts.eager,
            args_text=opts.args,
            jax=bound is not op,
        )
        if opts.output:
            user_ns[opts.output] = report
        return report

    @contextlib.contextmanager
    def _failures_located(self):
        """Errors raised after the op was defined are about the example arguments,
        the reference or the backward: they point at the %%pnex line."""
        try:
            yield
        except PnexError as exc:
            raise CellFailure(exc, 1) from None

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
            detail = f"invalid Python: {exc.msg}"
            if exc.text:
                detail += f"\n    {exc.text.rstrip()}"
                if exc.offset:
                    detail += "\n    " + " " * (exc.offset - 1) + "^"
            err = KernelDefinitionError(detail)
            err.__cause__ = exc
            raise CellFailure(err, exc.lineno) from None
        self.code_names = code_names(code)
        ns = dict(self.shell.user_ns)
        injected = injected_names()
        ns.update(injected)
        before = dict(ns)
        try:
            _exec_cell(code, ns)
        except Exception as exc:
            line = _line_in(exc.__traceback__, self.filename)
            hint = ""
            if isinstance(exc, TypeError) and re.search(r"__init__\(\) missing", str(exc)):
                hint = "; tensor annotations take a dtype and a shape: In(dtype, shape), Out(dtype, shape[, init])"
            elif isinstance(exc, NameError):
                hint = "; define or import it in this cell or an earlier one"
            err = KernelDefinitionError(f"running the cell raised {type(exc).__name__}: {exc}{hint}")
            err.__cause__ = exc
            raise CellFailure(err, line) from None
        defined = {}
        for key, value in ns.items():
            if key.startswith("__") and key.endswith("__"):
                continue
            if key in HISTORY_NAMES or _HISTORY_RE.fullmatch(key):
                continue
            if key in before and before[key] is value:
                continue
            if key in injected and value is injected[key]:
                continue
            defined[key] = value
        return ns, defined

    def _select_kernel(self, defined: dict[str, Any]) -> tuple[str, types.FunctionType, list[str]]:
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
                raise CellFailure(err, 2)
            chosen = candidates[0]
        skipped = [k for k in annotated if k != chosen]
        return chosen, functions[chosen], skipped

    def _evaluate(self, flag: str, text: str, namespace: dict[str, Any]) -> Any:
        try:
            # Example arguments and the reference are the user's expressions, evaluated
            # like any cell's code in (a copy of) the notebook's namespace.
            return eval(compile(text, f"<{flag}>", "eval", dont_inherit=True), namespace)  # noqa: S307
        except Exception as exc:
            raise CellFailure(PnexError(
                f"{flag} {text}: evaluating it raised {type(exc).__name__}: {exc}. It is evaluated in the "
                f"notebook's namespace (plus the names this cell defines); quote it if it has spaces"
            ), 1) from None

    def _definition(self, fn):
        """The core's definition of the kernel: its spec is checked here, and it is
        compiled (with the compilers' output captured) before it is registered."""
        opts = self.opts
        options = opts.options
        with capture_output() as captured:
            try:
                definition = make_definition(
                    fn, n_threads=opts.n_threads, threads_per_block=opts.threads_per_block,
                    autotune_key=opts.autotune_key, options=options, tune=opts.tune or None,
                    flops=opts.flops,
                    shared_bytes=opts.shared_bytes, cluster_dims=opts.cluster_dims, requires=list(opts.requires) or None,
                    tune_requires=list(opts.tune_requires) or None,
                )
                definition.check_compiles()
            except PnexError as exc:
                self._add_log(captured.text)
                raise CellFailure(exc, self._line_for(exc)) from None
            except Exception as exc:
                self._add_log(captured.text)
                err = KernelDefinitionError(f"compiling the kernel raised {type(exc).__name__}: {exc}")
                err.__cause__ = exc
                raise CellFailure(err, _line_in(exc.__traceback__, self.filename) or self._def_line()) from None
        self._add_log(captured.text)
        return definition

    def _prefetch_sass(self, definition) -> None:
        """Start the report's SASS listing of the code it will show (the first variant
        for the report's architecture, as compiled just now) while the op is registered
        and run: the disassembler takes 0.2-0.5 s to start."""
        if not definition.compiles:
            return
        with contextlib.suppress(Exception):
            sass.prefetch(definition.compiled(self.opts.arch).cubin, use_cache=definition.options.use_cache)

    def _def_line(self) -> int | None:
        return self.fn.__code__.co_firstlineno if self.fn is not None else None

    def _line_for(self, exc: BaseException) -> int | None:
        """The cell line an error from the core is about."""
        lineno = getattr(exc, "lineno", None)
        if isinstance(lineno, int) and lineno > 0:
            return lineno
        text = str(exc)
        if re.search(r"n_threads|threads_per_block|autotune_key|shared_bytes|choices are given|, flops:", text) and \
                "parameter '" not in text:
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

    def _warn_if_slow(self, args, threads: int) -> None:
        on_gpu = any(getattr(a, "is_cuda", False) for a in args)
        if not on_gpu and threads > 16384:
            print(
                f"pnex: note: this launch runs {threads:,} threads in the CUDA simulator (CPU tensors), at "
                f"roughly 2,000 threads per second; use smaller --args on CPU",
                file=sys.stderr,
            )


_MISSING = object()
