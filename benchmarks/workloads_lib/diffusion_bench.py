"""The diffusion workload's benchmark: the Numba documentation's own kernel in a raw
numba-cuda launch loop (the baseline), CUDA-graph loops, :func:`bench_diffusion` (every
variant against eager PyTorch, ``torch.compile`` and the memory floor, each field checked
against float64) and :func:`judge_diffusion` (the goal).  The kernels are in
:mod:`workloads_lib.diffusion_kernels`."""

import math
from collections.abc import Callable
from typing import Any

import torch
from numba import cuda, float32

from pnex_magic.timing import cuda_event_timer, measure
from workloads_lib.diffusion_kernels import (
    diffusion_blocked,
    diffusion_step,
    initial_field,
    laplacian_weight,
    reference_diffusion,
    torch_diffusion_step,
)
from workloads_lib.results import COMPILED, EAGER, FLOOR, Row, Workload, _check_close, _fmt_us
from workloads_lib.rounds import _run_rounds
from workloads_lib.timing import _timer_for, copy_time

__all__ = [
    "DOCS_TPB", "docs_diffusion_kernel", "raw_numba_diffusion", "blocked_tile", "RAW", "BLOCKED_PER_LAUNCH",
    "blocked_variant", "bench_diffusion", "judge_diffusion", "DIFFUSION_FLOOR_GOAL",
]


# The documentation's kernel, as written there (8 x 8 blocks, x along the first axis,
# updating the field in place and writing the Laplacian).  Compiled on first use.
DOCS_TPB = 8
_DOCS_SHASIZE = DOCS_TPB + 2
_DOCS_COEFF = 0.25
_docs_kernel_cache: list = []


def docs_diffusion_kernel():
    if not _docs_kernel_cache:

        @cuda.jit
        def diffusion(field, lapl):
            x, y = cuda.grid(2)
            # Shared array has two extra rows and columns to store edge values
            sharedarray = cuda.shared.array(shape=(_DOCS_SHASIZE, _DOCS_SHASIZE), dtype=float32)
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            # Don't try to load edge values from outside the array
            if tx == 0 and x > 0:
                sharedarray[0, ty + 1] = field[x - 1, y]
            if ty == 0 and y > 0:
                sharedarray[tx + 1, 0] = field[x, y - 1]
            if tx == DOCS_TPB - 1 and x < field.shape[0] - 1:
                sharedarray[-1, ty + 1] = field[x + 1, y]
            if ty == DOCS_TPB - 1 and y < field.shape[1] - 1:
                sharedarray[tx + 1, -1] = field[x, y + 1]
            # Load all inner values into tx + 1, ty + 1.
            sharedarray[tx + 1, ty + 1] = field[x, y]
            val = 4 * sharedarray[tx + 1, ty + 1]
            # Synchronize after loading
            cuda.syncthreads()
            # Check that we are not at the very edges of the array.
            if x > 0:
                val -= sharedarray[tx, ty + 1]
            if y > 0:
                val -= sharedarray[tx + 1, ty]
            if x < field.shape[0] - 1:
                val -= sharedarray[tx + 2, ty + 1]
            if y < field.shape[1] - 1:
                val -= sharedarray[tx + 1, ty + 2]
            # Check that we are within boundaries when saving.
            if x < field.shape[0] and y < field.shape[1]:
                lapl[x, y] = val
                field[x, y] -= val * _DOCS_COEFF

        _docs_kernel_cache.append(diffusion)
    return _docs_kernel_cache[0]


def _numba_event_timer(fn: Callable[[], Any], loops: int) -> float:
    start = cuda.event()  # timing=True is the default (and the simulator takes no argument)
    end = cuda.event()
    start.record()
    for _ in range(loops):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # milliseconds


def raw_numba_diffusion(u0: torch.Tensor, chunk: int, repeat: int) -> tuple[float, torch.Tensor]:
    """The documentation's launch loop: ``diffusion[blockspergrid, threadsperblock](field_gpu,
    lapl_gpu)`` on numba device arrays.  Returns (seconds per step, final field) after
    ``(repeat + 1) * chunk`` steps (one chunk of warm-up)."""
    kernel = docs_diffusion_kernel()
    field = u0.cpu().numpy().copy()
    n0, n1 = field.shape
    if n0 % DOCS_TPB or n1 % DOCS_TPB:
        raise ValueError(f"the documentation's kernel needs sizes that are multiples of {DOCS_TPB}, got {field.shape}")
    threadsperblock = (DOCS_TPB, DOCS_TPB)
    blockspergrid = (math.ceil(n0 / DOCS_TPB), math.ceil(n1 / DOCS_TPB))
    field_gpu = cuda.to_device(field)
    lapl_gpu = cuda.device_array_like(field)

    def run_chunk():
        for _ in range(chunk):
            kernel[blockspergrid, threadsperblock](field_gpu, lapl_gpu)

    m = measure(run_chunk, _numba_event_timer, repeat=repeat, loops=1, warmup=1)
    return m.median / chunk, torch.from_numpy(field_gpu.copy_to_host())


def _graph_loop(advance: Callable[[torch.Tensor, torch.Tensor, int], None], u0: torch.Tensor, chunk: int,
                repeat: int, graph_steps: int):
    """``advance(a, b, graph_steps)`` (steps from ``a``, the result back in ``a``, ``b`` a
    scratch buffer) captured in a CUDA graph, replayed ``chunk // graph_steps`` times per
    timed run.  Returns (seconds per step, final field)."""
    a = u0.clone()
    b = torch.empty_like(a)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (load the module, autotune) outside the capture
        advance(a, b, graph_steps)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        advance(a, b, graph_steps)
    a.copy_(u0)
    replays = chunk // graph_steps

    def run_chunk():
        for _ in range(replays):
            graph.replay()

    m = measure(run_chunk, cuda_event_timer(u0.device), repeat=repeat, loops=1, warmup=1)
    return m.median / chunk, a


def _blocked_graph_steps(chunk: int, per_launch: int, most: int = 100) -> int:
    """Steps per CUDA graph for the blocked kernel: an even number of launches (the result
    back in the first buffer), dividing ``chunk``, at most ``most``; 0 where none does."""
    unit = 2 * per_launch
    return max((n for n in range(unit, most + 1, unit) if chunk % n == 0), default=0)


def blocked_tile(op: Any, u: torch.Tensor, steps: int, coeff: float = 0.25) -> str:
    """The tile the autotuner chose for ``op`` (:func:`diffusion_blocked`) on ``u`` at
    ``steps`` steps a launch, in words (after a call with that key)."""
    from pnex_magic.launch import autotune

    result = autotune.result_for(op.definition, (u, u, coeff, steps))
    if result is None:
        return "tile not chosen yet"
    tune = dict(result.tune)
    shape = f"{8 * tune['ROWS']} x {32 * tune['COLS']}"
    how = "autotuned" if result.source.startswith(("benchmarked", "disk cache")) else result.source.split(":")[0]
    return f"tile {shape} ({how})"


RAW = "raw numba-cuda launch loop (documentation's kernel)"
BLOCKED_PER_LAUNCH = (1, 4, 8)  #: steps per launch of the blocked kernel's rows in bench_diffusion


def blocked_variant(per_launch: int, graph_steps: int = 0) -> str:
    """The name of the blocked kernel's row for ``per_launch`` steps a launch (a CUDA graph
    of ``graph_steps`` steps, if given)."""
    name = f"pnex blocked kernel, {per_launch} step{'s' if per_launch > 1 else ''} per launch"
    return name + (f", CUDA graph of {graph_steps} steps" if graph_steps else "")


def bench_diffusion(
    n: int = 2000,
    steps: int = 10_000,
    *,
    device: torch.device | str | None = None,
    step_op: Any = None,
    coeff: float = 0.25,
    repeat: int = 5,
    compile_variants: bool = True,
    rounds: int | None = None,
    blocked_op: Any = None,
    per_launch: tuple[int, ...] = BLOCKED_PER_LAUNCH,
) -> Workload:
    """Time ``steps`` diffusion steps of every variant on an ``n`` x ``n`` grid (as
    ``repeat`` timed runs of ``steps // repeat`` steps after one such run of warm-up,
    in each of ``rounds`` interleaved rounds) and check each final field against float64.
    ``step_op`` is the one-step op (:func:`diffusion_step`), ``blocked_op`` the
    temporal-blocking one (:func:`diffusion_blocked`), run at each of ``per_launch``
    steps per launch."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    step_op = step_op or diffusion_step
    blocked_op = blocked_op or diffusion_blocked
    on_gpu = device.type == "cuda"
    chunk = max(2, steps // repeat // 2 * 2)  # even: the pnex loops ping-pong
    total = (repeat + 1) * chunk
    u0 = initial_field(n).to(device)
    timer = _timer_for(device)
    rows: list[Row] = []
    results: dict[str, torch.Tensor] = {}

    def torch_loop(step, variant):
        weight = laplacian_weight(device)
        state = [u0[None, None].clone()]

        def run_chunk():
            u = state[0]
            for _ in range(chunk):
                u = step(u, weight, coeff)
            state[0] = u

        m = measure(run_chunk, timer, repeat=repeat, loops=1, warmup=1)
        results[variant] = state[0][0, 0]
        return m.median / chunk

    variants: list[tuple[str, Callable[[], Row | float]]] = []
    variants.append((EAGER, lambda: torch_loop(torch_diffusion_step, EAGER)))
    if compile_variants:
        compiled = torch.compile(torch_diffusion_step, fullgraph=True)
        variants.append((COMPILED, lambda: torch_loop(compiled, COMPILED)))
    if on_gpu:

        def raw():
            seconds, field = raw_numba_diffusion(u0, chunk, repeat)
            results["raw"] = field
            return Row(RAW, seconds)

        variants.append((RAW, raw))

    def pnex_loop():
        a = u0.clone()
        b = torch.empty_like(a)

        def run_chunk():
            for _ in range(chunk // 2):
                step_op(a, b, coeff)
                step_op(b, a, coeff)

        m = measure(run_chunk, timer, repeat=repeat, loops=1, warmup=1)
        results["pnex"] = a
        return Row("pnex op, Python loop", m.median / chunk)

    variants.append(("pnex op, Python loop", pnex_loop))
    graph_variant = ""
    if on_gpu:
        graph_steps = 100 if chunk % 100 == 0 else chunk

        def pairs(a, b, count):
            for _ in range(count // 2):
                step_op(a, b, coeff)
                step_op(b, a, coeff)

        def graph():
            seconds, field = _graph_loop(pairs, u0, chunk, repeat, graph_steps)
            results["graph"] = field
            return Row(f"pnex op, CUDA graph of {graph_steps} steps", seconds)

        graph_variant = f"pnex op, CUDA graph of {graph_steps} steps"
        variants.append((graph_variant, graph))

    def advance_blocked(t):
        """``count`` steps from ``a`` into ``a`` (``count`` a multiple of 2 t), t a launch."""
        def advance(a, b, count):
            for _ in range(count // (2 * t)):
                blocked_op(a, b, coeff, t)
                blocked_op(b, a, coeff, t)
        return advance

    def blocked_loop(t):
        name = blocked_variant(t)

        def run():
            state = [u0.clone(), torch.empty_like(u0)]

            def run_chunk():
                a, b = state
                done = 0
                while done < chunk:
                    k = min(t, chunk - done)
                    blocked_op(a, b, coeff, k)
                    a, b = b, a
                    done += k
                state[:] = [a, b]

            m = measure(run_chunk, timer, repeat=repeat, loops=1, warmup=1)
            results[name] = state[0]
            tile = blocked_tile(blocked_op, u0, t, coeff)
            return Row(name, m.median / chunk, note=f"{tile}; field read + written once per launch")

        return name, run

    def blocked_graph(t, g):
        name = blocked_variant(t, g)

        def run():
            seconds, field = _graph_loop(advance_blocked(t), u0, chunk, repeat, g)
            results[name] = field
            return Row(name, seconds, note=blocked_tile(blocked_op, u0, t, coeff))

        return name, run

    for t in per_launch:
        variants.append(blocked_loop(t))
        g = _blocked_graph_steps(chunk, t)
        if on_gpu and t > 1 and g:
            variants.append(blocked_graph(t, g))
    if on_gpu:
        one_step = "one step: read u, write u_new"
        variants.append((FLOOR, lambda: Row(FLOOR, copy_time(2 * 4 * n * n, device), note=one_step)))
    _run_rounds(rows, variants, rounds)

    # Correctness: every variant ran `total` steps from u0; compare with float64.
    reference = reference_diffusion(u0, total, coeff)
    keys = {EAGER: EAGER, COMPILED: COMPILED, RAW: "raw",
            "pnex op, Python loop": "pnex", graph_variant: "graph"}
    for row in rows:
        field = results.get(keys.get(row.variant, row.variant))
        if field is not None and row.seconds is not None:
            ok, text = _check_close(field, reference, 1e-3)
            row.check = (f"{'matches' if ok else 'DIFFERS from'} float64 after {total:,} steps: ") + text
            if row.variant.startswith("raw") and not ok:
                row.check += " (the documentation's kernel updates the field in place: blocks race on halos)"

    w = Workload("diffusion", f"{n}x{n}, {repeat * chunk:,} steps timed", "per step", rows, device=str(device))
    if on_gpu:
        judge_diffusion(w)
    else:
        w.headline = w.best("pnex")[0]
    return w


def judge_diffusion(w: Workload) -> None:
    """Set ``w``'s headline (its fastest pnex variant) and judge the diffusion goal on it:
    per step no slower than the raw numba-cuda loop, at least 7x eager's speed, and within
    :data:`DIFFUSION_FLOOR_GOAL` of the memory floor (one step's read and write of the
    field); where missed, say by how much."""
    w.headline, mine = w.best("pnex")
    raw_s, eager, floor = w.seconds(RAW), w.seconds(EAGER), w.seconds(FLOOR)
    w.goal = (f"fastest pnex variant <= raw numba-cuda loop, >= 7x faster than eager and <= {DIFFUSION_FLOOR_GOAL}x "
              f"the memory floor's time (one step's read + write of the field)")
    if None in (mine, raw_s, eager, floor):
        return
    w.goal_met = mine <= raw_s and eager / mine >= 7 and mine <= DIFFUSION_FLOOR_GOAL * floor
    missed = []
    if mine > raw_s:
        missed.append(f"{w.headline} takes {_fmt_us(mine)}, the raw loop {_fmt_us(raw_s)}")
    if eager / mine < 7:
        missed.append(f"{w.headline} is {eager / mine:.2f}x eager's speed")
    if mine > DIFFUSION_FLOOR_GOAL * floor:
        missed.append(f"{w.headline} takes {mine / floor:.2f}x the memory floor's time "
                      f"({_fmt_us(mine)} against {_fmt_us(floor)})")
    w.goal_why = "; ".join(missed)


#: The diffusion goal's bound on the fastest pnex variant's time per step, in memory floors.
DIFFUSION_FLOOR_GOAL = 1.3
