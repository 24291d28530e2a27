"""The bandwidth probes of ``benchmarks/probes.py``: ``copy`` (copy kernels with several elements
per thread against ``torch.clone``, issue 19) and ``inflight`` (a loads-first copy's bandwidth
against the bytes each SM keeps in flight, issue 30)."""

from __future__ import annotations

import time

from probes_lib.common import OUT, _events


COPY_KERNELS = '''
import pnex_magic as pnex
from numba import cuda, float32

ITEMS = {items}

@pnex.jit(n_threads="a.numel()", threads_per_block={tpb})
def naive(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i] = a[i]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def strided(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = a[j]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def loads_first(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array(ITEMS, float32)
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < n:
            v[k] = a[j]
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < n:
            r[j] = v[k]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def full_block(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array(ITEMS, float32)
    if cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.blockDim.x * ITEMS <= n:
        for k in range(ITEMS):
            v[k] = a[base + k * cuda.blockDim.x]
        for k in range(ITEMS):
            r[base + k * cuda.blockDim.x] = v[k]
    else:
        for k in range(ITEMS):
            j = base + k * cuda.blockDim.x
            if j < n:
                v[k] = a[j]
        for k in range(ITEMS):
            j = base + k * cuda.blockDim.x
            if j < n:
                r[j] = v[k]

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def consecutive(a: pnex.In("f32", (None,)), r: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    for k in range(ITEMS):
        j = i * ITEMS + k
        if j < a.shape[0]:
            r[j] = a[j]
'''


def probe_copy() -> list[str]:
    import torch

    rows = []
    sizes = (16 << 20, 256 << 20)
    data = {n: torch.randn(n, device="cuda") for n in sizes}
    clone = {n: _events(lambda n=n: data[n].clone()) for n in sizes}
    rows.append("torch.clone: " + ", ".join(f"{n >> 20}M {clone[n] * 1e6:.1f} us ({8 * n / clone[n] / 1e12:.2f} TB/s)"
                                         for n in sizes))
    for tpb in (256, 512, 1024):
        for items in (1, 2, 4, 8, 16):
            ns: dict = {"__name__": f"copy_{items}_{tpb}"}
            code = COPY_KERNELS.format(items=items, tpb=tpb)
            path = OUT / f"copy_{items}_{tpb}.py"
            path.write_text(code)
            exec(compile(code, str(path), "exec"), ns)
            for name in ("naive", "strided", "loads_first", "full_block", "consecutive"):
                if name == "naive" and items != 1:
                    continue
                if name != "naive" and items == 1:
                    continue
                op = ns[name]
                fr = []
                for n in sizes:
                    out = op(data[n])
                    ok = torch.equal(out, data[n])
                    t = _events(lambda op=op, n=n: op(data[n]))
                    fr.append(f"{clone[n] / t:.2f}{'' if ok else ' WRONG'}")
                res = op.definition.compiled("sm_90").resources
                rows.append(f"{name:<12} items={items:<2} tpb={tpb:<5} regs={res.registers:<3} of clone 16M/256M: "
                            + " / ".join(fr))
    return rows


INFLIGHT_KERNEL = '''
import pnex_magic as pnex
from numba import cuda
from numba.cuda.types import float16, float32, float64, uint8

@pnex.jit(n_threads="(a.numel() + {items} - 1) // {items}", threads_per_block={tpb})
def copy(a: pnex.In("{dtype}", (None,)), r: pnex.Out("{dtype}", "a")):
    base = cuda.blockIdx.x * cuda.blockDim.x * {items} + cuda.threadIdx.x
    n = a.shape[0]
    v = cuda.local.array({items}, {nbtype})
    for k in range({items}):
        j = base + k * cuda.blockDim.x
        if j < n:
            v[k] = a[j]
    for k in range({items}):
        j = base + k * cuda.blockDim.x
        if j < n:
            r[j] = v[k]
'''


def probe_inflight() -> list[str]:
    """Bandwidth of a loads-first copy against the bytes each SM keeps in flight (issue 30):
    element size x elements per thread x resident threads per SM, 1 GiB read per call
    (far past L2), as a share of torch.clone's.  Where the share saturates tells the
    report's Little's-law model how many bytes in flight the GPU needs under load."""
    import json

    import torch

    from pnex_magic.hardware import device_info, resident_blocks

    info = device_info(torch.device("cuda"))
    nbytes = 1 << 30
    rows, records = [], []
    clone_t = {}
    configs = [(dt, items, 256) for dt in ("f16", "f32", "f64") for items in (1, 2, 4, 8)]
    configs += [("f32", 1, tpb) for tpb in (64, 128, 512, 1024)] + [("f32", 16, 256), ("u8", 1, 256), ("u8", 4, 256)]
    torch_dtype = {"f16": torch.float16, "f32": torch.float32, "f64": torch.float64, "u8": torch.uint8}
    data = {}
    for dt, items, tpb in configs:
        if dt not in data:
            size = torch.tensor([], dtype=torch_dtype[dt]).element_size()
            data[dt] = torch.randint(0, 100, (nbytes // size,), device="cuda").to(torch_dtype[dt])
            clone_t[dt] = _events(lambda dt=dt: data[dt].clone())
        ns: dict = {"__name__": f"inflight_{dt}_{items}_{tpb}"}
        nbtype = dict(f16="float16", f32="float32", f64="float64", u8="uint8")[dt]
        code = INFLIGHT_KERNEL.format(items=items, tpb=tpb, dtype=dt, nbtype=nbtype)
        path = OUT / f"inflight_{dt}_{items}_{tpb}.py"
        path.write_text(code)
        exec(compile(code, str(path), "exec"), ns)
        op = ns["copy"]
        x = data[dt]
        ok = torch.equal(op(x), x)
        t = _events(lambda: op(x))
        res = op.definition.compiled(info.arch).resources
        blocks = resident_blocks(info.arch, res.registers, res.shared_bytes, tpb) or 0
        size = x.element_size()
        per_sm = blocks * tpb * items * size
        rec = dict(dtype=dt, items=items, tpb=tpb, registers=res.registers, resident_blocks=blocks,
                   bytes_in_flight_per_sm=per_sm, seconds=t, clone_seconds=clone_t[dt],
                   share_of_clone=clone_t[dt] / t, bandwidth=2 * nbytes / t, correct=ok)
        records.append(rec)
        rows.append(f"{dt:<4} items={items:<2} tpb={tpb:<5} regs={res.registers:<3} blocks/SM={blocks:<3} "
                    f"in flight/SM={per_sm / 1024:7.1f} KiB  {2 * nbytes / t / 1e12:5.2f} TB/s  "
                    f"{clone_t[dt] / t:5.2f} of clone{'' if ok else '  WRONG'}")
    (OUT / "inflight.json").write_text(json.dumps(dict(
        gpu=info.name, arch=info.arch, sm_count=info.sm_count, l2_bytes=info.l2_bytes,
        peak_bandwidth=info.peak_bandwidth, torch=torch.__version__,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), records=records), indent=1))
    return [f"{info.name} ({info.arch}, {info.sm_count} SMs), clone of 1 GiB: "
            + ", ".join(f"{k} {2 * nbytes / v / 1e12:.2f} TB/s" for k, v in clone_t.items())] + rows
