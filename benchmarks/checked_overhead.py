"""What a checked kernel (:mod:`pnex_magic.checking`) costs against the fast one, and
what line info (``-lineinfo``) costs.

    python benchmarks/checked_overhead.py                 # GPU: compile figures and device times
    python benchmarks/checked_overhead.py --compile-only  # anywhere: registers and SASS only

Three workloads, each compiled four ways for the GPU's architecture (``--arch``
without a GPU, sm_90 by default) through pnex's own path (Numba's PTX, then
nvJitLink): fast, fast with line info, checked, checked with line info.  For each:
registers and stack (ptxas, through nvJitLink), the number of SASS instructions
(``cuobjdump``/``nvdisasm``), and for the checked variant how many accesses it tests at
run time, how many the source proves in bounds (:mod:`pnex_magic.checking.index_ranges`), and
whether its SASS is the fast variant's, instruction for instruction (then so is its
device time, on any GPU of that architecture).  On a GPU each fast and checked variant also runs at
full size, device time by CUDA events around a CUDA graph of ``--loops`` launches
(so that the Python launcher's own time never starves the GPU):

* **muladd**: ``result[i] = a[i] * b[i] + c[i]``, 1 GiB per float32 array;
* **diffusion**: ``benchmarks/workloads.py``'s 2-D stencil with a shared-memory tile, 2000 x 2000, one step;
* **kmeans**: ``benchmarks/workloads.py``'s assignment kernel, 20 M 2-D points, 2 centroids.

The goal (issue 21): a checked variant within 1.5x of the fast one's device time.
Both variants write a poisoned output, and their results must agree.
The launcher is :class:`pnex_magic.launch.driver.DriverLauncher` on a stand-in
kernel whose image is the cubin built here; the checked variant gets the error record
as its trailing argument (zeroed once: the record is read, and checked to be empty,
after the timing).  The script prints a table last and writes JSON
(``benchmarks/results/checked-overhead-<date>.json``, and a copy in $OUT).
"""

# No `from __future__ import annotations`: the kernel annotations below must be evaluated where written.

import argparse
import dataclasses
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GOAL = 1.5


@dataclasses.dataclass
class Build:
    workload: str
    variant: str  # "fast" or "checked"
    lineinfo: bool
    registers: int | None
    stack_bytes: int | None
    sass_instructions: int | None
    ptx_lines: int
    checked_sites: int | None = None  # accesses tested at run time (checked variant)
    proven_sites: int | None = None  # accesses the source proves in bounds, left unchecked
    sass: tuple[str, ...] = dataclasses.field(repr=False, default=())  # the instructions, addresses dropped
    cubin: bytes = dataclasses.field(repr=False, default=b"")
    entry: str = ""
    seconds: float = 0.0


def _workloads() -> dict[str, tuple[Any, Any]]:
    """(kernel function, spec) of each workload."""
    from numba import cuda

    import pnex_magic as pnex
    import workloads as wl

    @pnex.jit(n_threads="a.numel()")
    def muladd(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
               result: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            result[i] = a[i] * b[i] + c[i]

    ops = {"muladd": muladd, "diffusion": wl.diffusion_step, "kmeans": wl.kmeans_assign}
    return {name: (op._pnex.fn, op._pnex.spec) for name, op in ops.items()}


_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+\S", re.MULTILINE)


def _instructions(text: str) -> tuple[str, ...]:
    """The SASS listing's instructions, without their addresses and encodings."""
    return tuple(re.sub(r"/\*[0-9a-f]+\*/", "", line).split(";")[0].strip()
                 for line in text.splitlines() if _SASS_INSTRUCTION.match(line))


def build(name: str, fn: Any, spec: Any, arch: str, *, checked: bool, lineinfo: bool) -> Build:
    """Compile like :func:`pnex_magic.compiler.compile_kernel` (Numba's PTX, nvJitLink),
    with ``lineinfo`` passed to both NVVM and nvJitLink."""
    from numba import cuda

    from pnex_magic import sass
    from pnex_magic.arch import parse_arch
    from pnex_magic.checking import checked_kernel, checked_spec
    from pnex_magic.compiler import _link_dependencies, _parse_resources, numba_signature
    from pnex_magic.numbadriver import target_device
    from pnex_magic.linking import linker_classes, ptx_entry

    cc = parse_arch(arch)
    sites = None
    if checked:
        sites = checked_kernel(fn, spec)  # as the op builds it: its blocks and shapes
        fn, spec = sites.function, checked_spec(spec)
    start = time.perf_counter()
    with warnings.catch_warnings(), target_device(cc):
        warnings.simplefilter("ignore")
        ptx, _ = cuda.compile(fn, numba_signature(spec), device=False, abi="numba", cc=cc, output="ptx",
                              lineinfo=lineinfo)
    Linker, LinkerOptions, ObjectCode = linker_classes()
    deps = _link_dependencies(fn, spec, cc, ptx)
    options = {"arch": arch, "verbose": True, "lineinfo": lineinfo}
    if any(getattr(d, "code_type", None) == "ltoir" for d in deps):
        options["link_time_optimization"] = True
    linker = Linker(ObjectCode.from_ptx(ptx.encode()), *deps, options=LinkerOptions(**options))
    cubin = bytes(linker.link("cubin").code)
    seconds = time.perf_counter() - start
    res = _parse_resources(linker.get_info_log())
    dis = sass.disassemble(cubin)
    instructions = _instructions(dis.text) if dis.text else ()
    count = len(instructions) if dis.text else None
    return Build(name, "checked" if checked else "fast", lineinfo, res.registers if res else None,
                 res.stack_bytes if res else None, count, len(ptx.splitlines()),
                 len(sites.sites) if sites else None, len(sites.proven) if sites else None,
                 instructions, cubin, ptx_entry(ptx) or "", seconds)


class _Image:
    """A stand-in kernel for DriverLauncher: its spec, and a fixed cubin."""

    def __init__(self, spec: Any, built: Build):
        self.spec = spec
        self.options = None
        self._image = (built.cubin, built.entry)

    @property
    def op_name(self) -> str:
        return self.spec.name

    @property
    def compiles(self) -> bool:
        return True

    def kernel_image(self, arch: str, layout: str = "C", variant: int = 0, checked: bool = False) -> tuple[bytes, str]:
        return self._image  # one build: the fast or the checked code, whichever it was made from

    def simulated_function(self, checked: bool = False, variant: int = 0) -> None:
        return None


#: Which argument each workload writes: compared between the fast and checked runs.
_OUTPUT = {"muladd": 3, "diffusion": 1, "kmeans": 2}


def _inputs(name: str, device: str) -> tuple[list[Any], int]:
    """Argument values (outputs allocated) and the loops per graph."""
    import torch

    import workloads as wl

    if name == "muladd":
        n = (1 << 30) // 4
        a, b, c = (torch.rand(n, device=device) for _ in range(3))
        return [a, b, c, torch.empty_like(a)], 5
    if name == "diffusion":
        u = wl.initial_field(2000).to(device)
        return [u, torch.empty_like(u), 0.25], 200
    X, means = wl.kmeans_data(20_000_000, device)
    return [X, means, torch.empty(X.shape[0], dtype=torch.int64, device=device)], 20


def time_variant(spec: Any, built: Build, values: list[Any], loops: int, repeat: int) -> tuple[float, list[int] | None]:
    """Median device seconds of one launch, and the error record after (checked only)."""
    import torch

    from pnex_magic.calls import launch_grid
    from pnex_magic.checking import checked_spec, error_buffer
    from pnex_magic.launch.driver import DriverLauncher

    device = torch.device("cuda")
    record = None
    if built.variant == "checked":
        record = error_buffer(device)
        values = [*values, record]
        spec = checked_spec(spec)
    env = {p.name: v for p, v in zip(spec.params, values)}
    grid, block = launch_grid(spec, env, spec.threads_per_block)
    kernel = _Image(spec, built)
    launcher = DriverLauncher()
    launcher.launch(kernel, values, grid, block, device)  # loads the module, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(loops):
            launcher.launch(kernel, values, grid, block, device)
    graph.replay()
    torch.cuda.synchronize()
    from bench_common import graph_seconds

    return graph_seconds(graph, loops, repeat), (record.tolist() if record is not None else None)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--arch", default=None, help="target architecture without a GPU (default: the GPU's, else sm_90)")
    parser.add_argument("--compile-only", action="store_true", help="registers and SASS only; no GPU needed")
    parser.add_argument("--workloads", default="muladd,diffusion,kmeans", help="comma-separated subset")
    parser.add_argument("--repeat", type=int, default=15, help="timed graph replays per variant (median)")
    args = parser.parse_args(argv)

    import torch

    from bench_common import result_header, write_result

    on_gpu = torch.cuda.is_available() and not args.compile_only
    arch = args.arch or ("sm_%d%d" % torch.cuda.get_device_capability() if torch.cuda.is_available() else "sm_90")
    kernels = _workloads()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    builds: dict[tuple[str, str, bool], Build] = {}
    for name in names:
        fn, spec = kernels[name]
        for checked in (False, True):
            for lineinfo in (False, True):
                b = build(name, fn, spec, arch, checked=checked, lineinfo=lineinfo)
                builds[(name, b.variant, lineinfo)] = b

    timings: dict[tuple[str, str], float] = {}
    records: dict[str, list[int] | None] = {}
    mismatches: dict[str, str] = {}
    if on_gpu:
        for name in names:
            values, loops = _inputs(name, "cuda")
            out = _OUTPUT[name]
            results = {}
            for variant in ("fast", "checked"):
                values[out].fill_(-1)  # poisoned: each variant must write every element
                seconds, record = time_variant(kernels[name][1], builds[(name, variant, False)], values, loops, args.repeat)
                timings[(name, variant)] = seconds
                results[variant] = values[out].clone()
                if variant == "checked":
                    records[name] = record
            try:  # the same code but for the checks: the same result (one FMA's rounding allowed)
                torch.testing.assert_close(results["checked"].double(), results["fast"].double(), rtol=1e-6, atol=1e-6)
            except AssertionError as exc:
                mismatches[name] = str(exc).splitlines()[0]
            del values, results
            torch.cuda.empty_cache()

    rows, result_rows = [], []
    for (name, variant, lineinfo), b in builds.items():
        t = timings.get((name, variant)) if not lineinfo else None
        fast = timings.get((name, "fast"))
        ratio = f"{t / fast:.2f}x" if t is not None and fast and variant == "checked" else ""
        checks = f"{b.checked_sites}/{b.proven_sites}" if b.checked_sites is not None else ""
        # The checked variant's SASS against the fast one's (same line info): the same
        # instructions mean the same device time, whatever the GPU.
        same = None
        if variant == "checked" and b.sass and builds[(name, "fast", lineinfo)].sass:
            same = b.sass == builds[(name, "fast", lineinfo)].sass
        rows.append([name, variant, "yes" if lineinfo else "no", b.registers, b.stack_bytes, b.sass_instructions,
                     {None: "", True: "yes", False: "no"}[same], b.ptx_lines, checks, f"{b.seconds:.2f}",
                     f"{t * 1e6:.1f}" if t is not None else "", ratio])
        result_rows.append({
            "workload": name, "variant": variant, "lineinfo": lineinfo, "registers": b.registers,
            "stack_bytes": b.stack_bytes, "sass_instructions": b.sass_instructions, "ptx_lines": b.ptx_lines,
            "compile_seconds": b.seconds, "device_seconds": t,
            "checked_sites": b.checked_sites, "proven_sites": b.proven_sites, "same_sass_as_fast": same,
        })
    if torch.cuda.is_available():
        result = result_header("checked-overhead")
    else:  # compile figures only
        from bench_common import cpu_header

        result = cpu_header("checked-overhead")
    result.update({"arch": arch, "goal_ratio": GOAL, "rows": result_rows, "checked_records": records,
                   "output_mismatches": mismatches})
    ratios = {n: timings[(n, "checked")] / timings[(n, "fast")] for n in names if (n, "fast") in timings}
    result["ratios"] = ratios
    path = write_result(result, "checked-overhead")
    bad = {n: r for n, r in records.items() if r and r[0]}
    if bad:
        print(f"a checked run recorded a violation (a bug in the kernel or in the checks): {bad}")
    for name, message in mismatches.items():
        print(f"{name}: the checked variant's result differs from the fast one's: {message}")
    print(f"written to {path}")
    print(f"\nchecked vs fast on {arch}" + ("" if on_gpu else " (compile only: no device times)") + f"; goal <= {GOAL}x")
    print(_table(rows, ["workload", "variant", "lineinfo", "regs", "stack", "SASS", "= fast", "PTX lines", "checked/proven",
                        "compile s", "us/launch", "checked/fast"]))
    return 1 if bad or mismatches or any(r > GOAL for r in ratios.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
