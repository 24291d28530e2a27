"""Where the first kernel of a fresh script spends its time, phase by phase (issue 37).

    python benchmarks/first_use_phases.py                  # the GPU if there is one, else CPU tensors
    python benchmarks/first_use_phases.py --device cpu     # compile only (no GPU needed: NVVM and
                                                           # nvJitLink come as pip wheels)
    python benchmarks/first_use_phases.py --rounds 7 --warmup 0   # PNEX_WARMUP=0 in the children
    python benchmarks/first_use_phases.py --ablate scipy,gc,setup      # what each part of the set-up gains
    python benchmarks/first_use_phases.py --against /tmp/main-checkout  # before/after, interleaved
    python benchmarks/first_use_phases.py --device cpu --heap 200000 --gc-threshold 300  # a GPU host's heap, on CPU

Each round is a fresh Python process that does what ``benchmarks/first_use.py``'s
"new kernel" row does (``import torch``, on a GPU the CUDA context, ``import
pnex_magic``, ``from numba import cuda``, then a new kernel from the start of its
definition to its first result), then a second new kernel in the same process.  The
process wraps pnex's and Numba's stage functions (installed as their modules are
imported, so that no import moves) and charges the main thread's wall time to the
innermost stage running (exclusive time), so that a kernel's phases add up to its
total:

* ``pnex.jit`` (the definition path's imports), the spec, snapshot and fingerprint,
  the toolchain versions (package metadata, part of every cache key), the disk cache;
* Numba's typing set-up: the typing and target contexts and their registries
  (``refresh``: every typing template and lowering of numba-cuda, imported and
  installed), the first time;
* the kernel's own compile, by Numba's passes: bytecode to IR, typing, lowering to
  LLVM IR, other passes; then NVVM (LLVM IR to PTX, libdevice's load apart) and
  nvJitLink (PTX to cubin);
* the torch op's registration, and (GPU only) the first call: the launch through the
  C++ launcher, the module load.  Without a GPU the first call runs in the CUDA
  simulator, a different thing: that row is skipped, with its reason;
* waiting for pnex's background warm-up (where it runs), and what is left (``other``);
  Python's garbage collections (all phases together) are a row of their own.

``--heap N --gc-threshold 300`` imitates on CPU a GPU host's first kernel: N more
long-lived objects (torch's CUDA state) for every full collection to walk, and
collections as frequent as the GPU path's more objects make them; the rows "full
collections in: PHASE" say where the full (generation 2) collections came.

``--ablate scipy,gc,setup`` measures this checkout also with parts of
:mod:`pnex_magic.numbasetup` turned off (``setup``: Numba's own set-up, as before issue
37), ``--against DIR`` another checkout, in the same interleaved rounds: what each gain
came from, on a loaded machine.

The second kernel shows what every later kernel pays: the difference is the one-time
cost.  The background warm-up thread's own stages are listed apart (they overlap the
main thread).  Rows: the minimum and the median over rounds.  The whole script (from
``import pnex_magic`` to the first result) is a row too, so that work moved out of the
kernel's window into the imports shows.

Prints a table and writes JSON (GPU or CPU, versions, date) to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

__all__ = ["main", "run_rounds", "summarise", "HOOKS"]

# (module, attribute path, phase).  A phase of None: named by Numba's pass (see _pass_phase).
TYPING_SETUP = "Numba typing set-up (contexts, registries)"
HOOKS: tuple[tuple[str, str, str | None], ...] = (
    ("pnex_magic.define", "definition", "spec, snapshot, fingerprint"),
    ("pnex_magic.definition", "toolchain_versions", "toolchain versions (metadata)"),
    ("pnex_magic.cache", "load", "disk cache lookup"),
    ("pnex_magic.cache", "store", "disk cache store"),
    ("pnex_magic.definition", "KernelDefinition.compile_function", "kernel function for Numba"),
    ("pnex_magic.vector", "register_cuda", "pnex's Numba extensions"),
    ("pnex_magic.random", "register_cuda", "pnex's Numba extensions"),
    ("pnex_magic.tc.lowering", "register_cuda", "pnex's Numba extensions"),
    ("pnex_magic.warmup", "wait", "waiting for the background warm-up"),
    ("numba.cuda.compiler", "compile", "Numba compile, other"),
    ("pnex_magic.numbasetup", "typing_setup", TYPING_SETUP),
    ("numba.cuda.target", "CUDATypingContext.__init__", TYPING_SETUP),
    ("numba.cuda.target", "CUDATargetContext.__init__", TYPING_SETUP),
    ("numba.cuda.typing.context", "BaseContext.refresh", TYPING_SETUP),
    ("numba.cuda.core.base", "BaseContext.refresh", TYPING_SETUP),
    ("numba.cuda.core.compiler_machinery", "PassManager._runPass", None),
    ("numba.cuda.cudadrv.nvvm", "compile_ir", "NVVM: LLVM IR to PTX"),
    ("numba.cuda.cudadrv.nvvm", "LibDevice.__init__", "NVVM: libdevice load"),
    ("pnex_magic.compiler", "link_cubin", "nvJitLink: PTX to cubin"),
    ("pnex_magic.define", "make_op", "torch op registration"),
    ("pnex_magic.launch.native", "load_launcher", "C++ launcher load"),
)
KERNEL_PHASES = (
    "pnex.jit (definition path imports)", "spec, snapshot, fingerprint", "toolchain versions (metadata)",
    "disk cache lookup", "kernel function for Numba", "pnex's Numba extensions", "waiting for the background warm-up",
    TYPING_SETUP, "Numba: bytecode to IR", "Numba: typing the kernel", "Numba: lowering to LLVM IR",
    "Numba: other passes", "Numba compile, other", "NVVM: libdevice load", "NVVM: LLVM IR to PTX",
    "nvJitLink: PTX to cubin", "disk cache store", "torch op registration", "C++ launcher load", "first call",
    "other",
)


def _pass_phase(pss) -> str:
    name = pss.name() if hasattr(pss, "name") else type(pss).__name__
    if "type_inference" in name or "typeinfer" in name.lower():
        return "Numba: typing the kernel"
    if "lowering" in name:
        return "Numba: lowering to LLVM IR"
    if name in ("translate_bytecode", "fixup_args", "ir_processing", "with_lifting", "inline_closure_likes",
                "rewrite_semantic_constants", "dead_branch_prune", "generic_rewrites", "make_function_op_code_to_jit",
                "inline_inlinables", "find_literally", "literal_unroll", "reconstruct_ssa", "rewrite_dynamic_raises",
                "literal_propagation_subpipeline", "canonicalize_loop_entry", "canonicalize_loop_exit",
                "transform_literal_unroll_const_list", "ir_legalization"):
        return "Numba: bytecode to IR"
    return "Numba: other passes"


# ----------------------------------------------------------------------------- the child


class _Clock:
    """Exclusive wall time per phase and thread: the time between two events goes to the
    innermost phase open on that thread (``outside`` when none is)."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.totals: dict[str, dict[str, float]] = {}  # thread role -> phase -> seconds

    def _state(self):
        st = self.local
        if not hasattr(st, "stack"):
            role = "main" if threading.current_thread() is threading.main_thread() else "background"
            st.stack, st.last, st.role = [], time.perf_counter(), role
        return st

    def _charge(self, st, now: float) -> None:
        phase = st.stack[-1] if st.stack else "outside"
        with self.lock:
            table = self.totals.setdefault(st.role, {})
            table[phase] = table.get(phase, 0.0) + now - st.last
        st.last = now

    def enter(self, phase: str) -> None:
        st = self._state()
        self._charge(st, time.perf_counter())
        st.stack.append(phase)

    def leave(self) -> None:
        st = self._state()
        self._charge(st, time.perf_counter())
        st.stack.pop()

    def take(self) -> dict[str, dict[str, float]]:
        """The totals so far (then zero), the open phases charged up to now."""
        st = self._state()
        self._charge(st, time.perf_counter())
        with self.lock:
            found, self.totals = self.totals, {}
        return found


def _wrap(clock: _Clock, fn, phase: str | None):
    import functools

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        clock.enter(phase if phase is not None else _pass_phase(args[2]))
        try:
            return fn(*args, **kwargs)
        finally:
            clock.leave()

    timed.__pnex_timed__ = True
    return timed


def _patch(clock: _Clock, module, path: str, phase: str | None) -> None:
    owner = module
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    fn = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if fn is None or getattr(fn, "__pnex_timed__", False):
        return
    setattr(owner, name, _wrap(clock, fn, phase))
    if module.__name__ == "numba.cuda.compiler" and name == "compile":
        sys.modules["numba.cuda"].compile = getattr(owner, name)  # numba.cuda.compile is this function


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches each hooked module as soon as it has been executed (no import moves)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.pending: dict[str, list[tuple[str, str | None]]] = {}
        for module, path, phase in HOOKS:
            self.pending.setdefault(module, []).append((path, phase))

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = loader.exec_module
        hooks = self.pending[name]

        def exec_module(module):
            run(module)
            for attr, phase in hooks:
                _patch(self.clock, module, attr, phase)

        loader.exec_module = exec_module
        return spec

    def install(self) -> None:
        for name, hooks in self.pending.items():
            if name in sys.modules:
                for attr, phase in hooks:
                    _patch(self.clock, sys.modules[name], attr, phase)
        sys.meta_path.insert(0, self)


_KERNEL = '''
@pnex.jit(n_threads="a.numel()")
def {name}(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] * {salt!r}
'''


class _Collections:
    """Python's garbage collections on the main thread: count and seconds per generation;
    each full (generation 2) collection also by the phase it came in (the innermost
    phase open on the main thread), with its seconds."""

    def __init__(self, clock: _Clock | None = None) -> None:
        self.started = 0.0
        self.clock = clock
        self.found: dict[int, list] = {}
        self.full: list[list] = []
        import gc

        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if phase == "start":
            self.started = time.perf_counter()
        else:
            seconds = time.perf_counter() - self.started
            entry = self.found.setdefault(info["generation"], [0, 0.0])
            entry[0] += 1
            entry[1] += seconds
            if info["generation"] == 2:
                stack = getattr(self.clock.local, "stack", None) if self.clock is not None else None
                self.full.append([stack[-1] if stack else "other", seconds])

    def take(self) -> dict[str, list]:
        found, self.found = self.found, {}
        return {str(g): v for g, v in sorted(found.items())}

    def take_full(self) -> list[list]:
        """The full collections since the last call: ``[phase, seconds]`` each."""
        found, self.full = self.full, []
        return found


def _long_lived_heap(count: int) -> list:
    """``count`` objects the collector tracks and that live as long as the process (dicts
    holding a list each, as a large library's state does): a GPU host's heap imitated
    on CPU, where torch's CUDA state makes every full collection walk more objects."""
    return [{"i": [i]} for i in range(count // 2)]


def child(device: str, salt: float, warmup_at_import: bool = False, ablate: tuple[str, ...] = (),
          prepare: bool = False, heap: int = 0, threshold0: int = 0) -> dict:
    """One fresh process's figures (run as ``python first_use_phases.py --child ...``);
    ``warmup_at_import``: pnex's background warm-up started right after ``import
    pnex_magic`` (the experiment of starting it at import); ``ablate``: parts of
    :mod:`pnex_magic.numbasetup` turned off (``scipy``: the BLAS probe finds SciPy;
    ``gc``: no freeze of older objects; ``setup``: no set-up of pnex's, Numba's own);
    ``prepare``: the untimed first child, which waits for the C++ launcher's build;
    ``heap``: that many more long-lived objects made after ``import torch``
    (:func:`_long_lived_heap`); ``threshold0``: the collector's first threshold
    (:func:`gc.set_threshold`; 0: Python's, 700), lower for more collections: the more
    objects of a GPU host's first kernel imitated."""
    begin = time.perf_counter()
    clock = _Clock()
    collections = _Collections(clock)
    _AfterImport(clock).install()
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        torch.ones(1, device="cuda")
        sync()
    kept = _long_lived_heap(heap)  # noqa: F841 - lives as long as the process
    if threshold0:
        import gc

        gc.set_threshold(threshold0, *gc.get_threshold()[1:])
    t_torch = time.perf_counter()
    import pnex_magic as pnex

    if warmup_at_import:
        from pnex_magic import warmup

        warmup.start()
    if ablate:
        import contextlib

        from pnex_magic import numbasetup

        if "scipy" in ablate:
            numbasetup._blas_probe_without_scipy = lambda: contextlib.nullcontext([])
        if "gc" in ablate:
            numbasetup._older_objects_frozen = lambda: contextlib.nullcontext(False)
        if "setup" in ablate:
            numbasetup.typing_setup = lambda: None
    t_pnex = time.perf_counter()
    from numba import cuda

    t_numba = time.perf_counter()
    n = 1024 if device == "cuda" else 64
    a = torch.randn(n, device=device)
    from pnex_magic import cache

    found: dict = {"torch_s": t_torch - begin, "import_pnex_s": t_pnex - t_torch, "import_numba_cuda_s": t_numba - t_pnex}
    clock.take()  # the imports' stages are not the kernel's
    collections.take()
    collections.take_full()
    for which, value in (("first", salt), ("second", salt + 0.5)):
        hits, misses = cache.stats.hits, cache.stats.misses
        name = f"phases_{which}"
        t0 = time.perf_counter()
        clock.enter("pnex.jit (definition path imports)")
        jit = pnex.jit  # noqa: F841 - the first access imports the definition path
        clock.leave()
        scope = {"pnex": pnex, "cuda": cuda}
        exec(compile(_KERNEL.format(name=name, salt=value), f"<{name}>", "exec"), scope)
        op = scope[name]
        if device == "cuda":
            clock.enter("first call")
            out = op(a)
            sync()
            clock.leave()
            torch.testing.assert_close(out, a.double().mul(value).float())  # the kernel computes in float64
        t1 = time.perf_counter()
        built = op._pnex.compiled_if_available()
        if built is None or not built.cubin:
            raise RuntimeError(f"the {which} kernel has no cubin")  # (without a GPU: the compile's result)
        if (cache.stats.hits - hits, cache.stats.misses - misses) != (0, 1):
            raise RuntimeError(f"the {which} kernel was not new (cache hits/misses {cache.stats.hits - hits}/"
                               f"{cache.stats.misses - misses})")
        phases = clock.take()
        main_phases = phases.get("main", {})
        main_phases["other"] = main_phases.pop("outside", 0.0)
        found[which] = {"seconds": t1 - t0, "phases": main_phases, "background": phases.get("background", {}),
                        "gc": collections.take(), "full_collections": collections.take_full()}
        if which == "first":
            found["script_s"] = t1 - t_torch
    from pnex_magic import warmup

    found["warmup"] = warmup.state()
    if prepare and device == "cuda":  # the C++ launcher is built before anything is timed (as first_use.py's)
        from pnex_magic.launch import switch

        switch.wait(900)
        found["launcher"] = switch.status()
    return found


# ----------------------------------------------------------------------------- rounds


def _run_child(device: str, salt: float, env: dict[str, str], warmup_at_import: bool = False,
               ablate: tuple[str, ...] = (), prepare: bool = False, heap: int = 0, threshold0: int = 0) -> dict:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", device, repr(salt)]
        + (["--warmup-at-import"] if warmup_at_import else []) + [f"--ablate={a}" for a in ablate]
        + (["--prepare"] if prepare else []) + ([f"--heap={heap}"] if heap else [])
        + ([f"--gc-threshold={threshold0}"] if threshold0 else []),
        capture_output=True, text=True, timeout=1200, env=env,
    )
    if done.returncode != 0 or "RESULT " not in done.stdout:
        raise RuntimeError(f"benchmark child failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])


def run_rounds(device: str, rounds: int, envs: dict[str, dict[str, str]], log=print,
               warmup_at_import: bool = False, ablations: tuple[str, ...] = (), heap: int = 0,
               threshold0: int = 0) -> dict[str, list[dict]]:
    """``rounds`` fresh processes per checkout (``envs``: a name and the environment that
    imports it) and per ablation of this checkout (``ablations``: each a
    ``+``-separated set of :func:`child`'s ``ablate``), interleaved round by round, so
    that load on a shared machine hits each; ``heap``, ``threshold0``: see :func:`child`."""
    variants = {name: (env, ()) for name, env in envs.items()}
    this = next(iter(envs.values()))
    for ablation in ablations:
        variants[f"without {ablation}"] = (this, tuple(ablation.split("+")))
    base = 1.0 + (time.time_ns() % 1_000_000) / 1e7  # new constants in every run of the script
    for k, env in enumerate(envs.values()):  # byte-compiled modules and (GPU) the C++ launcher exist before timing
        ready = _run_child(device, base - (k + 1) / 1024, env, prepare=True)
        if "launcher" in ready:
            log(f"  C++ launcher: {ready['launcher']}", flush=True)
    samples: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(rounds):
        for k, (name, (env, ablate)) in enumerate(variants.items()):
            sample = _run_child(device, base + (r + 1) / 64 + k / 4096, env, warmup_at_import, ablate, heap=heap,
                                threshold0=threshold0)
            log(f"  round {r + 1}/{rounds} {name}: new kernel {sample['first']['seconds']:.3f} s, second "
                f"{sample['second']['seconds']:.3f} s, script {sample['script_s']:.3f} s", flush=True)
            samples[name].append(sample)
    return samples


def _stats(values: list[float]) -> dict:
    return {"min_s": min(values), "median_s": statistics.median(values)}


def summarise(samples: list[dict], device: str) -> list[dict]:
    rows = [
        {"row": "import pnex_magic", "section": "imports", **_stats([s["import_pnex_s"] for s in samples])},
        {"row": "from numba import cuda (the user's)", "section": "imports",
         **_stats([s["import_numba_cuda_s"] for s in samples])},
    ]
    names = list(KERNEL_PHASES)
    for s in samples:
        for which in ("first", "second"):
            names += [p for p in s[which]["phases"] if p not in names]
    for phase in names:
        row = {"row": phase, "section": "new kernel"}
        for which in ("first", "second"):
            values = [s[which]["phases"].get(phase, 0.0) for s in samples]
            row[which] = _stats(values)
        if phase in ("first call", "C++ launcher load") and device != "cuda":
            row["skipped"] = "GPU only: without one the first call runs in the CUDA simulator"
        elif all(row[w]["median_s"] == 0.0 for w in ("first", "second")) and phase not in KERNEL_PHASES[:4]:
            continue
        rows.append(row)
    gc_row = {"row": "of which Python's garbage collection (all phases)", "section": "new kernel"}
    for which in ("first", "second"):
        gc_row[which] = _stats([sum(v[1] for v in s[which]["gc"].values()) for s in samples])
        gc_row[f"{which}_full_collections"] = [s[which]["gc"].get("2", [0])[0] for s in samples]
    rows.append(gc_row)
    full_phases: list[str] = []
    for s in samples:
        for which in ("first", "second"):
            for p, _ in s[which].get("full_collections", []):
                if p not in full_phases:
                    full_phases.append(p)
    for phase in full_phases:  # where the full collections came, and what they cost there
        row = {"row": f"  full collections in: {phase}", "section": "new kernel"}
        for which in ("first", "second"):
            row[which] = _stats([sum(sec for p, sec in s[which].get("full_collections", []) if p == phase)
                                 for s in samples])
            row[f"{which}_count"] = [sum(p == phase for p, _ in s[which].get("full_collections", []))
                                     for s in samples]
        rows.append(row)
    for which in ("first", "second"):
        rows.append({"row": f"total, {which} kernel (define to first result)", "section": "total",
                     **_stats([s[which]["seconds"] for s in samples])})
    rows.append({"row": "script: import pnex_magic to the first result", "section": "total",
                 **_stats([s["script_s"] for s in samples])})
    background: dict[str, list[float]] = {}
    for s in samples:
        for phase, sec in s["first"]["background"].items():
            background.setdefault(phase, []).append(sec)
    for phase, values in background.items():
        values += [0.0] * (len(samples) - len(values))
        rows.append({"row": f"background thread: {phase}", "section": "background", **_stats(values)})
    return rows


def print_rows(rows: list[dict], device: str, rounds: int, source: str = "") -> None:
    print(f"\nfirst use by phase{source}, fresh processes, {device}, {rounds} rounds (min / median, s; "
          f"each phase's exclusive wall time on the main thread)")
    print(f"{'phase':52s} {'1st min':>8} {'1st med':>8} {'2nd min':>8} {'2nd med':>8}")
    for r in rows:
        if "first" in r:
            if r.get("skipped"):
                print(f"{r['row']:52s} {'skipped: ' + r['skipped']}")
                continue
            f, s = r["first"], r["second"]
            print(f"{r['row']:52s} {f['min_s']:8.3f} {f['median_s']:8.3f} {s['min_s']:8.3f} {s['median_s']:8.3f}")
        else:
            print(f"{r['row']:52s} {r['min_s']:8.3f} {r['median_s']:8.3f}")


COMPARED = (TYPING_SETUP, "of which Python's garbage collection (all phases)",
            "total, first kernel (define to first result)", "script: import pnex_magic to the first result")


def print_comparison(results: dict[str, dict], device: str, rounds: int) -> None:
    """The main rows of every checkout and variant, side by side (min / median, s)."""
    print(f"\nchecked side by side ({device}, {rounds} interleaved rounds each; min / median, s)")
    print(f"{'checkout or variant':32s}" + "".join(f" {name.split(' (')[0][:26]:>27s}" for name in COMPARED))
    for name, found in results.items():
        rows = {r["row"]: r for r in found["rows"]}
        cells = []
        for row_name in COMPARED:
            row = rows.get(row_name, {})
            stats = row.get("first", row)
            cells.append(f"{stats.get('min_s', 0.0):.3f} / {stats.get('median_s', 0.0):.3f}" if stats else "-")
        print(f"{name[:32]:32s}" + "".join(f" {c:>27s}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        ablate = tuple(a.split("=", 1)[1] for a in argv if a.startswith("--ablate="))
        heap = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--heap=")), 0)
        threshold0 = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--gc-threshold=")), 0)
        print("RESULT " + json.dumps(child(argv[1], float(argv[2]), "--warmup-at-import" in argv, ablate,
                                           "--prepare" in argv, heap, threshold0)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="cuda (default where there is a GPU) or cpu (compile only; the first call is skipped)")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes (default 5)")
    parser.add_argument("--warmup", choices=["0", "1"], default=None,
                        help="PNEX_WARMUP in the children (default: as in this environment)")
    parser.add_argument("--tag", default="", help="appended to the results file's name")
    parser.add_argument("--against", default="", metavar="DIR[,DIR]",
                        help="other checkouts (folders holding pnex_magic/) measured in the same rounds, "
                             "interleaved: a before/after on a loaded machine")
    parser.add_argument("--ablate", default="", metavar="PART[,PART]",
                        help="also measure this checkout with parts of pnex_magic.numbasetup turned off, each "
                             "a variant of its own: scipy (the BLAS probe imports SciPy), gc (no freeze of "
                             "older objects), setup (Numba's own set-up); join parts with + (scipy+gc)")
    parser.add_argument("--heap", type=int, default=0, metavar="N",
                        help="each child makes N more long-lived objects after import torch: a GPU host's large "
                             "heap (torch's CUDA state) imitated on CPU, for the garbage collections' cost")
    parser.add_argument("--gc-threshold", type=int, default=0, metavar="N",
                        help="each child sets the collector's first threshold to N (Python's: 700): more "
                             "collections, as a GPU host's first kernel (more objects) triggers; with --heap")
    parser.add_argument("--warmup-at-import", action="store_true",
                        help="experiment: each child starts pnex's background warm-up right after import pnex_magic")
    opts = parser.parse_args(argv)

    import torch

    sys.path.insert(0, str(HERE))
    from bench_common import cpu_header, result_header, write_result

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    checkouts = {"this checkout": ROOT}
    for folder in filter(None, (f.strip() for f in opts.against.split(","))):
        if not (Path(folder) / "pnex_magic" / "__init__.py").is_file():
            parser.error(f"--against {folder}: no pnex_magic/ there")
        checkouts[folder] = Path(folder).resolve()
    envs = {}
    for name, folder in checkouts.items():
        env = os.environ.copy()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH", "")) if p)
        if opts.warmup is not None:
            env["PNEX_WARMUP"] = opts.warmup
        # As a user's Python does, the children keep byte-compiled modules (the first, untimed
        # child writes them): without, every process compiles pnex's sources again.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        envs[name] = env
    print(f"first use by phase: {opts.rounds} fresh processes per checkout, {device}", flush=True)
    ablations = tuple(filter(None, (a.strip() for a in opts.ablate.split(","))))
    unknown = {p for a in ablations for p in a.split("+")} - {"scipy", "gc", "setup"}
    if unknown:
        parser.error(f"--ablate: unknown {sorted(unknown)}; choose from scipy, gc, setup")
    samples = run_rounds(device, opts.rounds, envs, warmup_at_import=opts.warmup_at_import, ablations=ablations,
                         heap=opts.heap, threshold0=opts.gc_threshold)
    results = {name: {"folder": str(checkouts.get(name, ROOT)), "rows": summarise(found, device), "samples": found}
               for name, found in samples.items()}
    header = result_header("first-use-phases") if device == "cuda" else cpu_header("first-use-phases")
    stem = "first-use-phases" + ("" if device == "cuda" else "-cpu") + (f"-{opts.tag}" if opts.tag else "")
    path = write_result({**header, "device": device, "rounds": opts.rounds, "pnex_warmup": opts.warmup,
                         "warmup_at_import": opts.warmup_at_import, "heap": opts.heap, "gc_threshold": opts.gc_threshold, "rows": results["this checkout"]["rows"],
                         "checkouts": results}, stem)
    print_rows(results["this checkout"]["rows"], device, opts.rounds)
    if len(results) > 1:
        print_comparison(results, device, opts.rounds)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
