"""IPython front end: the ``%%pnex`` cell magic, ``%pnex_save``, ``%pnex_cache`` and ``%pnex_doctor``.

``%load_ext pnex_magic`` registers them.  This module only parses: the options
are declared once with ``IPython.core.magic_arguments`` (which also writes
``%%pnex?``) and turned into :class:`~pnex_magic.definition.JitOptions`, the
same the ``jit()`` decorator builds; a cell is then run by
:class:`~pnex_magic.frontends.cell.CellRun` over the core, so the cache and the
operator registration are shared with ``jit()``.  Option errors are
``UsageError`` (shown without a traceback).
"""

from __future__ import annotations

import ast
import dataclasses
import keyword
import re
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from .. import cache, warmup
from ..artifact import save
from ..definition import JitOptions
from ..errors import KernelDefinitionError
from ..launch import fault_hint, is_fault
from ..launch.autotune import RECORD_KIND
from ..multiarch import DEFAULT_ARCHS
from ..op import PnexOp
from .cache_listing import CacheListing
from .cell import HISTORY_NAMES, CellRun
from .doctor import doctor
from .warm_tasks import TASKS as WARM_TASKS

__all__ = ["PnexMagics", "load_ipython_extension", "unload_ipython_extension", "show_fault"]


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



def _cluster_dims(text: str) -> tuple[int, ...]:
    """``--cluster-dims``: ``X[,Y[,Z]]`` (the core checks the values)."""
    try:
        return tuple(int(p) for p in text.strip().strip("()").split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--cluster-dims expects X[,Y[,Z]] (positive ints), got {text!r}") from None


def _threads_per_block(text: str) -> int | tuple[int, ...] | str | list | None:
    """``--threads-per-block``: ``N[,N[,N]]`` (one block shape), ``auto``, or a list of
    candidates written as in Python, ``[128, 256]`` or ``[(32, 8), (16, 16)]``."""
    text = text.strip()
    if text.lower() == "auto":
        return "auto"
    if text.startswith("["):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, list):
            raise UsageError(f"--threads-per-block expects a list of candidates such as [128, 256] or "
                             f"[(32, 8), (16, 16)], got {text!r}")
        return value  # the core checks every candidate
    text = text.strip("()")
    try:
        sizes = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(
            f"--threads-per-block expects N[,N[,N]] (positive ints), auto, or a list such as [128, 256]; got {text!r}"
        ) from None
    if not sizes or any(s <= 0 for s in sizes) or len(sizes) > 3:
        raise UsageError(f"--threads-per-block expects 1 to 3 positive ints, got {text!r}")
    return sizes[0] if len(sizes) == 1 else sizes


def _tune(groups: list[list[str]] | None) -> dict[str, tuple]:
    """``--tune NAME=1,2,4`` (repeatable): new choices for ``Tune`` parameters."""
    found: dict[str, tuple] = {}
    for group in groups or ():
        text = _join(group) or ""
        name, sep, values = text.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise UsageError(f"--tune expects NAME=CHOICE[,CHOICE...] such as ITEMS=1,2,4; got {text!r}")
        choices = []
        for token in values.split(","):
            try:
                choices.append(ast.literal_eval(token.strip()))
            except (ValueError, SyntaxError):
                raise UsageError(f"--tune {name}: {token.strip()!r} is not a number or a bool (in {text!r})") from None
        if name in found:
            raise UsageError(f"--tune {name} is given twice")
        found[name] = tuple(choices)
    return found


def _expressions(flag: str, groups: list[list[str]] | None) -> tuple[str, ...]:
    """A repeatable option of expressions, each one or comma-separated."""
    exprs: list[str] = []
    for group in groups or ():
        exprs += _split_expressions(_join(group) or "")
    if any(not e for e in exprs):
        raise UsageError(f"{flag}: empty expression in {exprs!r}")
    return tuple(exprs)


@dataclasses.dataclass
class _Options:
    n_threads: str | tuple[str, ...]
    threads_per_block: int | tuple[int, ...] | str | list | None
    autotune_key: tuple[str, ...] | None
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
    options: JitOptions  # the options of jit() among the above, checked
    jax: bool = False  # bind the JAX function (jax_op) instead of the op
    backward: str | None = None  # "auto": derive the op's backward from the kernel's source
    sanitize: bool = False  # run --args under compute-sanitizer in a child process
    profile: bool = False  # run --args once under Nsight Compute in a child process (the Profile tab)
    flops: str | None = None  # the FLOP count of a call, an expression over the parameters
    tune: dict[str, tuple] = dataclasses.field(default_factory=dict)  # --tune NAME=choices
    shared_bytes: str | int = 0  # --shared-bytes EXPR: dynamic shared memory per block
    cluster_dims: tuple[int, ...] | None = None  # --cluster-dims X[,Y[,Z]]: thread-block clusters (sm_90)
    requires: tuple[str, ...] = ()  # --requires COND (repeatable): rules on the call's arguments
    tune_requires: tuple[str, ...] = ()  # --tune-requires COND (repeatable): Tune combinations kept (or per call)


@magics_class
class PnexMagics(Magics):
    """``%%pnex``, ``%pnex_save``, ``%pnex_cache`` and ``%pnex_doctor``."""

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--n-threads", dest="n_threads", action="append", nargs="+", metavar="EXPR",
        help="Total threads per launch axis, as an expression over the kernel's parameters "
             "(e.g. a.numel()). Repeat it, or give comma-separated expressions, for 2-D/3-D "
             "launches in X, Y, Z order. Required.",
    )
    @magic_arguments.argument(
        "--threads-per-block", dest="threads_per_block", nargs="+", metavar="N[,N[,N]]|auto|[...]",
        help="Block shape, one size per launch axis (default 256, 16,16 or 8,8,4); or 'auto', or a list "
             "of candidates such as [128, 256] or [(32, 8), (16, 16)]: the op then times the candidates on "
             "the first GPU call of each key and keeps the fastest (the first is the default). Kernels that "
             "assume a block shape must pin it.",
    )
    @magic_arguments.argument(
        "--autotune-key", dest="autotune_key", action="append", nargs="+", metavar="EXPR",
        help="With autotuning: expressions over the op's arguments (e.g. a.size(0)) whose values pick the "
             "tuned block (default: every input size, rounded up to a power of two). Repeatable or "
             "comma-separated.",
    )
    @magic_arguments.argument(
        "--check", action="store_true",
        help="Checked launches: every array access is tested against its array's shape on the GPU; an access "
             "out of bounds is not made and the call raises an IndexError naming the array, index, shape, "
             "thread, block and line (the CUDA context survives). Slower; not in CUDA graphs. Without it, the "
             "first run on --args on a GPU is checked anyway.",
    )
    @magic_arguments.argument(
        "--sanitize", action="store_true",
        help="Also run the --args example under compute-sanitizer (memcheck, initcheck; racecheck and "
             "synccheck for kernels with shared memory) in a child process, and show its findings at the "
             "kernel's lines. Needs --args and a CUDA toolkit's or NVIDIA's pip compute-sanitizer.",
    )
    @magic_arguments.argument(
        "--profile", action="store_true",
        help="Also run the --args example once under Nsight Compute (ncu) in a child process and add a Profile tab: "
             "speed-of-light memory and compute, achieved occupancy, the top warp-stall reasons and the kernel's lines "
             "with the most stalls; the report's 'why' then uses them. Needs --args on a GPU and ncu (CUDA toolkit).",
    )
    @magic_arguments.argument(
        "--flops", dest="flops", nargs="+", metavar="EXPR",
        help="The floating-point operations of one call, an expression over the kernel's parameters as --n-threads "
             "takes (e.g. \"2*M*N*K\" or \"2 * a.size(0) * b.size(1) * a.size(1)\"): the Timing tab then gives "
             "TFLOP/s and the share of the GPU's compute peak. Without it, it is inferred for kernels without loops.",
    )
    @magic_arguments.argument(
        "--tune", dest="tune", action="append", nargs="+", metavar="NAME=C1,C2",
        help="New choices for a Tune parameter of the kernel (repeatable), e.g. --tune ITEMS=1,2,4: the "
             "autotuner tries them (the first is the default); one choice makes it a plain constant.",
    )
    @magic_arguments.argument(
        "--cluster-dims", dest="cluster_dims", metavar="X[,Y[,Z]]",
        help="Thread-block clusters (sm_90: H100, H200), CUDA's __cluster_dims__: blocks per cluster along x, y, z "
             "(8 at most in all), run at once and reaching each other's shared memory through the pnex.tc cluster "
             "primitives; a call whose grid is not whole clusters is refused.",
    )
    @magic_arguments.argument(
        "--requires", dest="requires", action="append", nargs="+", metavar="COND",
        help="A rule the call's arguments must keep, for a kernel that is right only for some values (repeatable), "
             "e.g. --requires \"0 <= steps <= 15\": a condition over the op's arguments in the language of "
             "--n-threads, with < <= > >= == != and / or / not. A call that breaks it is refused with an "
             "ArgumentValueError naming the rule and the values, on every launcher (as jit(requires=...)).",
    )
    @magic_arguments.argument(
        "--tune-requires", dest="tune_requires", action="append", nargs="+", metavar="COND",
        help="A rule over the Tune parameters (repeatable), e.g. --tune-requires \"BM * BN <= 16384\": only "
             "the combinations of their choices that keep every rule are compiled and timed; a rule that also "
             "names the call's arguments (\"x.size(0) %% BN == 0\") chooses among them per call (as "
             "jit(tune_requires=...)).",
    )
    @magic_arguments.argument(
        "--shared-bytes", dest="shared_bytes", nargs="+", metavar="EXPR",
        help="Bytes of dynamic shared memory per block, for a kernel that declares it with "
             "cuda.shared.array(0, dtype) (static shared memory stops at 48 KiB): an int, or an expression "
             "over Tune parameters such as STAGES*64*1024, evaluated per Tune variant. Default 0.",
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
        "--no-cache", dest="no_cache", action="store_true",
        help="Read and write nothing of this kernel in pnex's cache folder (as jit(cache=False)).",
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
        help="Recompile even if the build cache holds this kernel, and time autotune candidates again "
             "instead of reusing stored choices.",
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
    @magic_arguments.argument(
        "--backward", choices=["auto"],
        help="auto: derive this op's backward kernel from the kernel's source and attach it "
             "(pnex_magic.derive_backward); the report's Signature tab shows its source.",
    )
    @magic_arguments.argument(
        "--jax", action="store_true",
        help="Bind the kernel's name to its JAX function (pnex_magic.jax_op) instead of the PyTorch op, "
             "which stays reachable as NAME.op. The report (and --args/--eager) still use the PyTorch op.",
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
        return CellRun(self.shell, opts, cell).run()

    def _parse(self, line: str) -> _Options:
        try:
            ns = magic_arguments.parse_argstring(self.pnex, line)
        except ValueError as exc:  # unbalanced quotes
            raise UsageError(f"%%pnex: cannot split the options: {exc}") from None
        if not ns.n_threads:
            raise UsageError("%%pnex needs --n-threads EXPR (e.g. --n-threads a.numel()); see %%pnex?")
        exprs = _expressions("--n-threads", ns.n_threads)
        if len(exprs) > 3:
            raise UsageError(f"--n-threads: at most 3 launch axes (X, Y, Z), got {len(exprs)}: {', '.join(exprs)}")
        tpb = _threads_per_block(_join(ns.threads_per_block)) if ns.threads_per_block else None
        tune_key = _expressions("--autotune-key", ns.autotune_key) if ns.autotune_key else None
        if ns.max_registers is not None and ns.max_registers <= 0:
            raise UsageError(f"--max-registers must be a positive int, got {ns.max_registers}")
        arch = None if ns.arch is None else _unquote(ns.arch)
        for key in ("output", "name", "backward_of", "cache_id"):
            if getattr(ns, key) is not None:
                setattr(ns, key, _unquote(getattr(ns, key)))
        for flag, value in (("--output", ns.output), ("--name", ns.name), ("--backward-of", ns.backward_of)):
            if value is not None and (not value.isidentifier() or keyword.iskeyword(value)):
                raise UsageError(f"{flag} expects a Python name, got {value!r}")
        if ns.output in HISTORY_NAMES:
            raise UsageError(f"--output {ns.output}: that name is IPython's history; pick another")
        eager = _join(ns.eager)
        args = _join(ns.args)
        if eager and not args:
            raise UsageError("--eager needs --args: the reference is called on the example arguments")
        if ns.sanitize and not args:
            raise UsageError("--sanitize needs --args: compute-sanitizer runs the op on the example arguments")
        if ns.profile and not args:
            raise UsageError("--profile needs --args: Nsight Compute profiles one launch on the example arguments")
        try:
            options = JitOptions.checked(
                to_extension=ns.to_extension, cache_id=ns.cache_id, verbose=ns.verbose,
                max_registers=ns.max_registers, arch=arch, force=ns.force, check=True if ns.check else None,
                use_cache=not ns.no_cache,
            )
        except KernelDefinitionError as exc:
            flag = "--arch" if "architecture" in str(exc) else "%%pnex"
            raise UsageError(f"{flag}: {exc}") from None
        return _Options(
            options=options,
            n_threads=exprs[0] if len(exprs) == 1 else tuple(exprs),
            threads_per_block=tpb,
            autotune_key=tune_key,
            to_extension=ns.to_extension,
            max_registers=ns.max_registers,
            cache_id=ns.cache_id,
            verbose=ns.verbose,
            arch=options.arch,
            args=args,
            eager=eager,
            name=ns.name,
            force=ns.force,
            output=ns.output,
            backward_of=ns.backward_of,
            backward=ns.backward,
            jax=ns.jax,
            tune=_tune(ns.tune),
            sanitize=ns.sanitize,
            profile=ns.profile,
            flops=_join(ns.flops) or None,
            shared_bytes=_join(ns.shared_bytes) if ns.shared_bytes else 0,
            cluster_dims=_cluster_dims(ns.cluster_dims) if ns.cluster_dims else None,
            requires=tuple(_join(group) for group in ns.requires or ()),
            tune_requires=tuple(_join(group) for group in ns.tune_requires or ()),
        )

    @magic_arguments.magic_arguments()
    @magic_arguments.argument(
        "--clear", action="store_true",
        help="Remove what pnex keeps in its cache folder: compiled kernels, autotune choices, the simulator's "
             "typed kernels, SASS listings, code digests, launcher builds, tool copies and profile reports "
             "(with --kernel: that kernel's compiled builds, autotune choices and simulated forms).",
    )
    @magic_arguments.argument(
        "--keep", metavar="PART[,PART]",
        help=f"With --clear: parts to keep, of {', '.join(cache.PARTS)} (e.g. --keep autotune).",
    )
    @magic_arguments.argument("--kernel", metavar="NAME", help="Only entries whose kernel name contains NAME.")
    @line_magic
    def pnex_cache(self, line: str):
        """List (or clear) pnex's on-disk cache: the compiled kernels and autotune choices,
        and what else the folder holds.

        The folder is $PNEX_CACHE_DIR (else $XDG_CACHE_HOME/pnex_magic, else
        ~/.cache/pnex_magic). Builds are keyed by the kernel's source, the values it
        reads, its options, the target architecture and the toolchain versions; only
        successful builds are stored. Autotune choices are stored per GPU model, kernel
        build and key. %%pnex --force recompiles and re-times without reading the cache.
        --clear removes it all (a launcher build in progress is left); everything is
        made again when next needed.
        """
        ns = magic_arguments.parse_argstring(self.pnex_cache, line)
        kernel = _unquote(ns.kernel) if ns.kernel else None
        if ns.clear:
            keep = [k.strip() for k in _unquote(ns.keep).split(",") if k.strip()] if ns.keep else []
            try:
                cleared = cache.clear(keep=keep, kernel=kernel)
            except ValueError as exc:
                raise UsageError(f"%pnex_cache --keep: {exc}") from None
            return CacheListing.collect(cleared=cleared)
        if ns.keep:
            raise UsageError("%pnex_cache: --keep goes with --clear (the parts that --clear leaves)")
        wanted = (lambda name: kernel in str(name)) if kernel else (lambda name: True)
        entries = [e for e in cache.entries() if wanted(e.meta.get("kernel", ""))]
        choices = [r for r in cache.records(RECORD_KIND) if wanted(r.data.get("kernel", ""))]
        return CacheListing.collect(entries=entries, choices=choices, others=kernel is None)

    @magic_arguments.magic_arguments()
    @magic_arguments.argument("name", help="The pnex op to save: its name in the notebook.")
    @magic_arguments.argument("path", help="The file to write (.pnex by convention).")
    @magic_arguments.argument(
        "--archs", metavar="sm_XY,...",
        help=f"GPU architectures to ship cubins for (default {','.join(DEFAULT_ARCHS)}).",
    )
    @line_magic
    def pnex_save(self, line: str):
        """Save a pnex op, with the backward op attached to it, as one artifact file:
        pnex_magic.load(PATH) registers it again in a process that has torch alone
        (no Numba, no CUDA compiler). Same as pnex_magic.save(NAME, PATH)."""
        ns = magic_arguments.parse_argstring(self.pnex_save, line)
        name, path = _unquote(ns.name), _unquote(ns.path)
        op = self.shell.user_ns.get(name)
        if not isinstance(op, PnexOp):
            found = "not defined" if op is None else f"of type {type(op).__name__}"
            raise UsageError(f"%pnex_save: {name!r} is {found}; give the name of a pnex op (from %%pnex or pnex.jit)")
        archs = DEFAULT_ARCHS if ns.archs is None else tuple(a for a in _unquote(ns.archs).split(",") if a.strip())
        try:
            written = save(op, path, archs=archs)
        except KernelDefinitionError as exc:
            raise UsageError(f"%pnex_save --archs: {exc}") from None
        print(f"pnex: saved {name} (pnex::{op.definition.op_name}) to {written}, {written.stat().st_size} bytes")

    @line_magic
    def pnex_doctor(self, line: str = ""):
        """Check what this environment can do: GPU and driver, PyTorch's CUDA build,
        the CUDA compiler wheels numba-cuda found (NVVM, nvJitLink, NVRTC), whether
        SASS can be shown, the build cache; and what to install when something is
        missing."""
        if line.strip():
            raise UsageError("%pnex_doctor takes no options")
        return doctor()


def show_fault(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for ``torch.AcceleratorError``: PyTorch's traceback and, when
    it reports a faulting kernel, which pnex kernels ran last and how to have the one
    that faulted named (CUDA reports a fault at a later call, often outside pnex:
    ``out.cpu()``, ``print(out)``)."""
    stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    hint = fault_hint() if is_fault(value) else ""
    if hint:
        stb = [*stb, "", f"pnex: {hint}"]
    shell._showtraceback(etype, value, stb)


def _accelerator_error():
    import torch

    return getattr(torch, "AcceleratorError", None)  # torch >= 2.8


def load_ipython_extension(ip) -> None:
    """``%load_ext pnex_magic``: register ``%%pnex``, ``%pnex_save``, ``%pnex_cache`` and ``%pnex_doctor``,
    and :func:`show_fault` for ``torch.AcceleratorError`` (unless another handler of
    custom exceptions is set: IPython keeps one); start Numba's one-time set-up in the
    background (:mod:`pnex_magic.warmup`)."""
    ip.register_magics(PnexMagics)
    error = _accelerator_error()
    if error is not None and not ip.custom_exceptions:
        ip.set_custom_exc((error,), show_fault)
    # Numba's one-time set-up and the magic's own, in the background while the first cell is typed
    if warmup.start(*WARM_TASKS) is not None:
        if _numba_cell_waits not in ip.events.callbacks["pre_run_cell"]:
            ip.events.register("pre_run_cell", _numba_cell_waits)


# Numba, or an import of what the warm-up imports with it (CUDA Python, llvmlite).
_NUMBA_WORD = re.compile(r"\bnumba\b|\b(?:import|from)\s+(?:cuda|llvmlite)\b")


def _numba_cell_waits(info: Any) -> None:
    """Before a cell that names Numba runs (``from numba import cuda``, ``import numba``),
    or imports CUDA Python or llvmlite (``from cuda.core import Linker``): take over from
    the warm-up (it finishes its step under way), as pnex does before its own calls, so
    that the cell's imports never run beside the background thread's (two threads
    importing one package's modules can deadlock on the module locks or see a
    half-initialised module).  A cell that does neither runs at once."""
    if _NUMBA_WORD.search(getattr(info, "raw_cell", "") or ""):
        warmup.wait()


def unload_ipython_extension(ip) -> None:
    if _numba_cell_waits in ip.events.callbacks["pre_run_cell"]:
        ip.events.unregister("pre_run_cell", _numba_cell_waits)
    magics = ip.magics_manager.magics
    for kind, name in (("cell", "pnex"), ("line", "pnex_save"), ("line", "pnex_cache"), ("line", "pnex_doctor")):
        magics[kind].pop(name, None)
    ip.magics_manager.registry.pop("PnexMagics", None)
    error = _accelerator_error()
    if error is not None and ip.custom_exceptions == (error,):
        ip.set_custom_exc((), None)
