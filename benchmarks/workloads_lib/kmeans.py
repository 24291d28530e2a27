"""The k-means workload: the assignment step of the ``torch.compile`` NumPy tutorial (the index
of each 2-D point's nearest centroid) as a pnex kernel (:func:`kmeans_ops`, int64 or int32
labels) and as a ``pnex.Tune`` kernel (:func:`kmeans_tuned_ops`), the tutorial's data and
reference, and :func:`bench_kmeans` (against eager, ``torch.compile`` and the memory floor)."""

# No `from __future__ import annotations`: kernel annotations such as pnex.Out(LABELS, ...)
# must be evaluated where they are written (LABELS is a local of kmeans_ops).
import math
from typing import Any

import torch
from numba import cuda, float32, int32, int64

import pnex_magic as pnex
from workloads_lib.provenance import named_in_workloads
from workloads_lib.results import COMPILED, EAGER, FLOOR, Row, Workload, _fmt_us
from workloads_lib.rounds import _run_rounds
from workloads_lib.timing import copy_time, time_per_call

__all__ = [
    "POINTS_PER_THREAD", "kmeans_ops", "kmeans_tuned_ops", "kmeans_assign", "kmeans_reference", "kmeans_data",
    "check_labels", "TUNED_KMEANS", "bench_kmeans", "AT_FLOOR",
]


POINTS_PER_THREAD = 4  # also in n_threads below: (points.size(0) + 3) // 4 threads
_kmeans_cache: dict = {}


def kmeans_ops(labels_dtype: torch.dtype = torch.int64) -> Any:
    """The assignment kernel, writing ``labels_dtype`` labels: int64 as ``argmin`` does, or
    int32, 4 bytes less per point to write.  Made once per dtype."""
    if labels_dtype in _kmeans_cache:
        return _kmeans_cache[labels_dtype]
    LABELS = labels_dtype

    def kmeans_assign(
        points: pnex.In("f32", (None, 2)),
        centroids: pnex.In("f32", (None, 2)),
        labels: pnex.Out(LABELS, ("points.size(0)",)),
    ):
        # Each thread assigns POINTS_PER_THREAD points, one block width apart (so that a
        # warp's loads and stores are contiguous): it loads them all, compares them with
        # every centroid, then stores their labels.  Several loads in flight per thread
        # are what it takes to keep the GPU's memory busy.
        n = points.shape[0]
        first = cuda.blockIdx.x * cuda.blockDim.x * POINTS_PER_THREAD + cuda.threadIdx.x
        x = cuda.local.array(POINTS_PER_THREAD, float32)
        y = cuda.local.array(POINTS_PER_THREAD, float32)
        best_d = cuda.local.array(POINTS_PER_THREAD, float32)
        best = cuda.local.array(POINTS_PER_THREAD, int64)
        for j in range(POINTS_PER_THREAD):
            i = first + j * cuda.blockDim.x
            x[j] = points[i, 0] if i < n else float32(0.0)
            y[j] = points[i, 1] if i < n else float32(0.0)
            best_d[j] = float32(math.inf)
            best[j] = -1
        for k in range(centroids.shape[0]):  # on a tie the first centroid wins, as in argmin
            cx = centroids[k, 0]
            cy = centroids[k, 1]
            for j in range(POINTS_PER_THREAD):
                dx = x[j] - cx
                dy = y[j] - cy
                d = dx * dx + dy * dy
                if d < best_d[j]:
                    best_d[j] = d
                    best[j] = k
        for j in range(POINTS_PER_THREAD):
            i = first + j * cuda.blockDim.x
            if i < n:
                labels[i] = best[j]

    if labels_dtype != torch.int64:
        kmeans_assign.__name__ += "_" + str(labels_dtype).removeprefix("torch.")  # one op per dtype
        kmeans_assign.__qualname__ = kmeans_assign.__name__
    named_in_workloads(kmeans_assign)
    op = pnex.jit(n_threads="(points.size(0) + 3) // 4", threads_per_block=256)(kmeans_assign)
    _kmeans_cache[labels_dtype] = op
    return op


def kmeans_tuned_ops(labels_dtype: torch.dtype = torch.int64) -> Any:
    """The assignment kernel of :func:`kmeans_ops` as pnex makes it easy to tune: how many
    points each thread assigns (``POINTS``) and the block size are the autotuner's choice
    (the fastest on this GPU and these shapes, timed at the first call and kept on disk),
    and the tensors are read through ``.flat``.  Made once per dtype."""
    if ("tuned", labels_dtype) in _kmeans_cache:
        return _kmeans_cache[("tuned", labels_dtype)]
    LABELS = labels_dtype

    def kmeans_tuned(
        points: pnex.In("f32", (None, 2)),
        centroids: pnex.In("f32", (None, 2)),
        labels: pnex.Out(LABELS, ("points.size(0)",)),
        POINTS: pnex.Tune(1, 2, 4, 8, 16),
    ):
        # Each thread assigns POINTS points, one block width apart (a warp's loads and
        # stores cover consecutive memory): it loads them all (many loads in flight keep
        # the memory busy), compares them with every centroid, then stores their labels.
        # The tensors are read through .flat, in memory order (point i's x at xy[2 * i],
        # its y next to it): points[i, 0] would also wrap a negative i and multiply by the
        # row length read at run time, 64-bit integer work for every point.
        n = points.shape[0]
        xy = points.flat
        cxy = centroids.flat
        out = labels.flat
        first = cuda.blockIdx.x * cuda.blockDim.x * POINTS + cuda.threadIdx.x
        x = cuda.local.array(POINTS, float32)
        y = cuda.local.array(POINTS, float32)
        best_d = cuda.local.array(POINTS, float32)
        best = cuda.local.array(POINTS, int32)
        for j in range(POINTS):
            i = first + j * cuda.blockDim.x
            x[j] = float32(0.0)
            y[j] = float32(0.0)
            if i < n:
                x[j] = xy[2 * i]
                y[j] = xy[2 * i + 1]
            best_d[j] = float32(math.inf)
            best[j] = -1
        for k in range(centroids.shape[0]):  # on a tie the first centroid wins, as in argmin
            cx = cxy[2 * k]
            cy = cxy[2 * k + 1]
            for j in range(POINTS):
                dx = x[j] - cx
                dy = y[j] - cy
                d = dx * dx + dy * dy
                if d < best_d[j]:
                    best_d[j] = d
                    best[j] = k
        for j in range(POINTS):
            i = first + j * cuda.blockDim.x
            if i < n:
                out[i] = best[j]

    kmeans_tuned.__name__ += "_" + str(labels_dtype).removeprefix("torch.")  # one op per dtype
    kmeans_tuned.__qualname__ = kmeans_tuned.__name__
    named_in_workloads(kmeans_tuned)
    op = pnex.jit(n_threads="(points.size(0) + POINTS - 1) // POINTS", threads_per_block="auto")(kmeans_tuned)
    _kmeans_cache[("tuned", labels_dtype)] = op
    return op


kmeans_assign = kmeans_ops(torch.int64)


def kmeans_reference(X: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """The tutorial's NumPy step, ``np.argmin(np.linalg.norm(X - means[:, None], axis=2),
    axis=0)``, in PyTorch."""
    return torch.argmin(torch.linalg.norm(X - means[:, None], dim=2), dim=0)


def kmeans_data(n_points: int, device: torch.device | str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's data in float32: two Gaussian blobs around (5, 5) and (10, 10),
    ``n_points // 2`` points each, and those two centres as the means."""
    g = torch.Generator().manual_seed(seed)
    half = n_points // 2
    centres = torch.tensor([[5.0, 5.0], [10.0, 10.0]])
    X = centres.repeat_interleave(torch.tensor([half, n_points - half]), dim=0)
    X = X + torch.randn(X.shape, generator=g)
    return X.to(device), centres.to(device)


def check_labels(labels: torch.Tensor, expected: torch.Tensor, X: torch.Tensor, means: torch.Tensor) -> tuple[bool, str]:
    """Labels agree with the reference's, or differ only where two centroids are equally
    near (to float32 rounding)."""
    differ = labels != expected
    n = int(differ.sum())
    if n == 0:
        return True, "identical labels"
    pts = X[differ].double()
    m = means.double()
    d_got = ((pts - m[labels[differ]]) ** 2).sum(1).sqrt()
    d_ref = ((pts - m[expected[differ]]) ** 2).sum(1).sqrt()
    gap = float((d_got - d_ref).abs().max())
    ok = gap <= 1e-5 * float(d_ref.abs().max() + 1)
    return ok, f"{n} of {labels.numel()} labels differ, all at ties (distance gap {gap:.1e})" if ok else (
        f"{n} of {labels.numel()} labels differ (distance gap up to {gap:.1e})"
    )


#: The row of :func:`kmeans_tuned_ops`, timed beside the kernel of notebook 04 (``tuned=True``).
TUNED_KMEANS = "pnex kernel, Tune(POINTS) and block autotuned"


def bench_kmeans(
    n_points: int = 20_000_000,
    *,
    labels_dtype: torch.dtype = torch.int64,
    device: torch.device | str | None = None,
    op: Any = None,
    repeat: int = 10,
    loops: int = 20,
    compile_variants: bool = True,
    rounds: int | None = None,
    tuned: bool = True,
) -> Workload:
    """The assignment step writing ``labels_dtype`` labels: the pnex kernel against the
    tutorial's function (its int64 result cast to ``labels_dtype``, if need be), eager and
    compiled, and the memory floor for the bytes the step must move; every variant in
    each of ``rounds`` interleaved rounds."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    op = op or kmeans_ops(labels_dtype)
    X, means = kmeans_data(n_points, device)
    if labels_dtype == torch.int64:
        reference = kmeans_reference
    else:

        def reference(X, means):
            return kmeans_reference(X, means).to(labels_dtype)

    expected = reference(X, means)
    rows: list[Row] = []

    def variant(name, fn, check=True):
        def run():
            text = ""
            if check:
                got = fn(X, means)
                ok, text = check_labels(got, expected, X, means)
                if got.dtype != labels_dtype:
                    ok, text = False, f"labels are {got.dtype}, not {labels_dtype}"
                text = ("matches eager: " if ok else "DIFFERS from eager: ") + text
            m = time_per_call(lambda: fn(X, means), device, repeat=repeat, loops=loops)
            return Row(name, m.median, check=text)

        return run

    variants = [(EAGER, variant(EAGER, reference, check=False))]
    if compile_variants:
        variants.append((COMPILED, variant(COMPILED, torch.compile(reference, fullgraph=True))))
    variants.append(("pnex kernel", variant("pnex kernel", op)))
    if tuned:
        variants.append((TUNED_KMEANS, variant(TUNED_KMEANS, kmeans_tuned_ops(labels_dtype))))
    itemsize = torch.empty(0, dtype=labels_dtype).element_size()
    if device.type == "cuda":
        moved = X.numel() * X.element_size() + n_points * itemsize  # read the points, write the labels
        variants.append((FLOOR, lambda: copy_time(moved, device, repeat=repeat, loops=loops)))
    _run_rounds(rows, variants, rounds)
    labels_name = str(labels_dtype).removeprefix("torch.")
    w = Workload(f"k-means ({labels_name} labels)", f"{n_points:,} points, {means.shape[0]} centroids", "per call",
                 rows, device=str(device))
    w.headline, mine = w.best("pnex")
    if device.type == "cuda":
        floor, compiled = w.seconds(FLOOR), w.seconds(COMPILED)
        w.goal = "within 1.3x of the memory floor's time and faster than torch.compile"
        if None not in (mine, floor, compiled):
            w.goal_met = mine <= 1.3 * floor and mine < compiled
            w.goal_why = _kmeans_why(mine, floor, compiled) if not w.goal_met else ""
    return w


#: A time within this factor of the memory floor's is at the floor: no kernel moving the same
#: bytes can be measurably faster.
AT_FLOOR = 1.05


def _kmeans_why(mine: float, floor: float, compiled: float) -> str:
    """Why the k-means goal was missed, from the times: too far from the floor, or not
    faster than torch.compile, and whether torch.compile was at the floor already."""
    why = []
    if mine > 1.3 * floor:
        why.append(f"the pnex kernel takes {mine / floor:.2f}x the floor's time")
    if mine >= compiled:
        if mine <= AT_FLOOR * floor and compiled <= AT_FLOOR * floor:
            why.append(f"a tie with torch.compile ({_fmt_us(mine)} against {_fmt_us(compiled)}): both run at the "
                       f"memory floor's speed ({floor / mine:.2f}x and {floor / compiled:.2f}x): a kernel moving these "
                       f"bytes cannot get much faster than a copy of them")
        else:
            why.append(f"torch.compile is faster: {_fmt_us(compiled)} against {_fmt_us(mine)} "
                       f"({floor / compiled:.2f}x the floor's speed against the pnex kernel's {floor / mine:.2f}x)")
    return "; ".join(why)
