"""Saved artifacts on a GPU machine: save time, load time, per-call cost and device time.

    python benchmarks/export_check.py            # on a machine with an NVIDIA GPU

Measures, in one run:
  * save: ``pnex.save`` of a new kernel (salted, so the compile cache misses) for the
    six default architectures, in a fresh process pinned to 2 CPU cores; next to it,
    what compiling every architecture through Numba/NVVM would cost instead (the
    alternative pnex does not use) and the same save again (PTX from the cache);
  * load: in fresh processes that cannot import Numba, NVVM or nvJitLink, the time
    from after ``import torch`` (and CUDA's context, which any process pays) through
    ``import pnex_magic`` and ``pnex.load`` until the op is usable, the launcher's
    share of it, and the first call; also the first call of an artifact without a
    cubin for this GPU (the PTX path);
  * per call: a 1024-element copy called in a host loop, the op as defined against
    the same op loaded from its artifact, alternated in this process, and the loaded
    op in a fresh process without Numba, each next to ``torch.clone``;
  * device time (CUDA events) of a 1 GiB ``a*b+c``: defined against loaded (the loaded
    cubin is linked from the sm_75 PTX, the defined one from NVVM's PTX for this GPU).

Prints a table last and writes JSON (GPU, driver, versions, date) to
``benchmarks/results/export-<date>.json``; details go to ``$OUT/export_check.log`` when
``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    build_parser().parse_args()  # prints the help and exits, before the imports below (no torch needed)

import torch  # noqa: E402

from bench_common import device_seconds, result_header, write_result  # noqa: E402
from overhead import per_call_us  # noqa: E402

LOG = Path(os.environ["OUT"]) / "export_check.log" if os.environ.get("OUT") else None

DEFS = textwrap.dedent(
    """
    import pnex_magic as pnex
    from numba import cuda

    @pnex.jit(n_threads="a.numel()")
    def copy(a: pnex.In("f32", (None,)), result: pnex.Out("f32", "a")):
        "salt SALT (a constant of the code: another salt makes another kernel for the cache)"
        x = cuda.grid(1)
        if x < a.shape[0]:
            result[x] = a[x]

    @pnex.jit(n_threads="a.numel()")
    def muladd(a: pnex.In("f32", (None,)), b: pnex.In("f32", "a"), c: pnex.In("f32", "a"),
               result: pnex.Out("f32", "a")):
        "salt SALT"
        x = cuda.grid(1)
        if x < a.shape[0]:
            result[x] = a[x] * b[x] + c[x]
    """
)

BLOCKER = textwrap.dedent(
    """
    import sys
    class _Blocker:
        names = ("numba", "numba_cuda", "llvmlite", "nvvm", "cuda.bindings.nvvm", "cuda.bindings.nvjitlink")[:NAMES]
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in self.names):
                raise ImportError(name + " is blocked")
    sys.meta_path.insert(0, _Blocker())
    """
)


def log(text: str) -> None:
    print(text, flush=True)
    if LOG is not None:
        with LOG.open("a") as f:
            f.write(text + "\n")


def python(code: str, *, cpus: int | None = None) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line starting RESULT."""
    if cpus is not None:
        code = f"import os\nos.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:{cpus}])\n" + code
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if LOG is not None:
        log(f"--- subprocess (rc {out.returncode})\n{out.stdout}\n{out.stderr}")
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip()[-1500:])
    return json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])


def save_times(folder: Path) -> dict:
    """A new kernel defined and saved for six architectures on 2 CPU cores."""
    code = textwrap.dedent(
        f"""
        import json, time
        t0 = time.perf_counter()
        import torch
        import pnex_magic as pnex
        from pnex_magic.multiarch import DEFAULT_ARCHS, LAYOUTS
        ns = {{"__name__": "export_check_save"}}
        t1 = time.perf_counter()
        exec({DEFS.replace("SALT", str(time.time_ns()))!r}, ns)
        t2 = time.perf_counter()
        pnex.save(ns["muladd"], {str(folder / "save.pnex")!r})
        t3 = time.perf_counter()
        pnex.save(ns["muladd"], {str(folder / "save.pnex")!r})
        t4 = time.perf_counter()
        d = ns["copy"].definition  # the alternative: Numba/NVVM once per architecture and layout
        t5 = time.perf_counter()  # (jit compiled one of the twelve already)
        for layout in LAYOUTS:
            for arch in DEFAULT_ARCHS:
                d.compiled(arch, layout=layout)
        t6 = time.perf_counter()
        print("RESULT " + json.dumps({{"imports_s": t1 - t0, "define_s": t2 - t1, "save_six_archs_s": t3 - t2,
                                     "save_again_s": t4 - t3, "nvvm_per_arch_s": t6 - t5}}))
        """
    )
    return python(code, cpus=2)


def blocker(nvjitlink: bool = True) -> str:
    """The import blocker (Numba, NVVM and, unless ``nvjitlink`` is False, nvJitLink)."""
    return BLOCKER.replace("NAMES", "6" if nvjitlink else "5")


def load_times(path: Path, *, with_launcher_split: bool = False, block_nvjitlink: bool = True) -> dict:
    split = "from pnex_magic.launch import native; native.load_launcher()" if with_launcher_split else ""
    code = blocker(block_nvjitlink) + textwrap.dedent(
        f"""
        import json, time
        import torch
        torch.ones(1, device="cuda"); torch.cuda.synchronize()  # CUDA's context: every process pays it
        t0 = time.perf_counter()
        import pnex_magic as pnex
        t1 = time.perf_counter()
        {split}
        t2 = time.perf_counter()
        op = pnex.load({str(path)!r})
        t3 = time.perf_counter()
        x = torch.randn(1024, device="cuda")
        y = op(x); torch.cuda.synchronize()
        t4 = time.perf_counter()
        assert torch.equal(y, x)
        blocked = sorted(m for m in sys.modules if m.startswith(("numba", "llvmlite", "cuda.bindings.nvjitlink")))
        print("RESULT " + json.dumps({{"import_s": t1 - t0, "launcher_s": t2 - t1, "load_s": t3 - t2,
                                     "usable_s": t3 - t0, "first_call_s": t4 - t3, "native": op._native,
                                     "blocked_imported": blocked}}))
        """
    )
    return python(code)


def fresh_per_call(path: Path) -> dict:
    code = blocker() + textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
        import torch
        import pnex_magic as pnex
        from overhead import per_call_us
        op = pnex.load({str(path)!r})
        x = torch.randn(1024, device="cuda")
        print("RESULT " + json.dumps({{"loaded_us": per_call_us(op, x), "clone_us": per_call_us(torch.clone, x)}}))
        """
    )
    return python(code)


def main() -> int:
    build_parser().parse_args()
    if not torch.cuda.is_available():
        print("export_check.py needs an NVIDIA GPU; nothing measured.")
        return 1
    import pnex_magic as pnex

    folder = Path(tempfile.mkdtemp(prefix="pnex-export-"))
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    result: dict = {**result_header("export_check"), "errors": {}}
    rows: list[tuple[str, str]] = []

    def section(name, fn):
        try:
            return fn()
        except Exception as exc:
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
            log(f"{name} failed:\n{traceback.format_exc()}")
            rows.append((name, f"FAILED: {type(exc).__name__}: {str(exc)[:100]}"))
            return None

    ns: dict = {"__name__": "export_check"}
    exec(DEFS.replace("SALT", "bench"), ns)
    copy, muladd = ns["copy"], ns["muladd"]
    x = torch.randn(1024, device="cuda")
    torch.testing.assert_close(copy(x), x)
    copy_path = pnex.save(copy, folder / "copy.pnex")
    muladd_path = pnex.save(muladd, folder / "muladd.pnex")
    others = tuple(a for a in pnex.artifact.DEFAULT_ARCHS if a != arch)
    ptx_path = pnex.save(copy, folder / "copy_ptx.pnex", archs=others)

    saved = section("save", lambda: save_times(folder))
    if saved:
        result["save"] = saved
        rows += [
            ("save, 6 archs x 2 layouts, new kernel, 2 cores", f"{saved['save_six_archs_s']:.2f} s (goal <= 3 s)"),
            ("  same save again (PTX from the cache)", f"{saved['save_again_s']:.2f} s"),
            ("  alternative: Numba/NVVM per arch and layout (11 compiles)", f"{saved['nvvm_per_arch_s']:.2f} s"),
            ("  defining the kernel first (jit, this GPU)", f"{saved['define_s']:.2f} s"),
        ]

    def loads():
        plain = [load_times(copy_path) for _ in range(5)]
        split = [load_times(copy_path, with_launcher_split=True) for _ in range(3)]
        med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
        out = {
            "runs": plain, "split_runs": split,
            "usable_s": med(plain, "usable_s"), "import_s": med(plain, "import_s"), "load_s": med(plain, "load_s"),
            "launcher_s": med(split, "launcher_s"), "first_call_s": med(plain, "first_call_s"),
            "native": all(r["native"] for r in plain),
            "blocked_imported": sorted({m for r in plain for m in r["blocked_imported"]}),
        }
        # No cubin for this GPU: the PTX, linked by nvJitLink, else compiled by the driver
        # (which refuses PTX from a newer CUDA than its own: recorded, not fatal).
        for how, block in (("nvjitlink", False), ("driver", True)):
            try:
                runs = [load_times(ptx_path, block_nvjitlink=block) for _ in range(3)]
                out[f"ptx_{how}_first_call_s"] = med(runs, "first_call_s")
            except Exception as exc:
                out[f"ptx_{how}_error"] = str(exc)[-300:]
        return out

    loaded = section("load", loads)
    if loaded:
        result["load"] = loaded
        ms = {k: f"{v * 1e3:.1f} ms" for k, v in loaded.items() if k.endswith("_s")}
        rows += [
            ("load: import pnex_magic + pnex.load, fresh process", f"{ms['usable_s']} (goal <= 200 ms)"),
            ("  import pnex_magic / pnex.load", f"{ms['import_s']} / {ms['load_s']}"),
            ("  of which the C++ launcher (imported, not built)", ms["launcher_s"]),
            ("  first call (cubin for this GPU)", ms["first_call_s"]),
            *(
                (f"  first call without a {arch} cubin, PTX by {how}",
                 ms.get(f"ptx_{how}_first_call_s") or f"failed: {loaded.get(f'ptx_{how}_error', '?')[-80:]}")
                for how in ("nvjitlink", "driver")
            ),
            ("  C++ launcher / Numba, NVVM, nvJitLink imported", f"{loaded['native']} / {loaded['blocked_imported'] or 'none'}"),
        ]

    def per_call():
        samples: dict[str, list[float]] = {"defined": [], "loaded": [], "clone": []}
        for _ in range(3):  # alternate: the same op name, defined then loaded
            exec(DEFS.replace("SALT", "bench"), ns)
            samples["defined"].append(per_call_us(ns["copy"], x))
            samples["clone"].append(per_call_us(torch.clone, x))
            op = pnex.load(copy_path)
            torch.testing.assert_close(op(x), x)
            samples["loaded"].append(per_call_us(op, x))
        fresh = fresh_per_call(copy_path)
        return {"samples": samples, "fresh_process": fresh,
                **{f"{k}_us": statistics.median(v) for k, v in samples.items()}}

    calls = section("per_call", per_call)
    if calls:
        result["per_call"] = calls
        fresh = calls["fresh_process"]
        rows += [
            ("per call, 1024 floats: defined op", f"{calls['defined_us']:.2f} µs"),
            ("  same op loaded from its artifact",
             f"{calls['loaded_us']:.2f} µs ({calls['loaded_us'] / calls['defined_us']:.3f}x defined)"),
            ("  torch.clone, same run", f"{calls['clone_us']:.2f} µs"),
            ("  loaded, fresh process without Numba (clone there)", f"{fresh['loaded_us']:.2f} µs ({fresh['clone_us']:.2f} µs)"),
        ]

    def device():
        n = (1 << 30) // 4
        a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
        times: dict[str, list[float]] = {"defined": [], "loaded": []}
        for _ in range(3):
            exec(DEFS.replace("SALT", "bench"), ns)
            times["defined"].append(device_seconds(ns["muladd"], (a, b, c)))
            op = pnex.load(muladd_path)
            torch.testing.assert_close(op(a, b, c), a * b + c)
            times["loaded"].append(device_seconds(op, (a, b, c)))
        return {"samples_s": times, **{f"{k}_s": statistics.median(v) for k, v in times.items()}}

    dev = section("device_time", device)
    if dev:
        result["device_time"] = dev
        rows.append(("device time, 1 GiB a*b+c: defined / loaded",
                     f"{dev['defined_s'] * 1e3:.3f} / {dev['loaded_s'] * 1e3:.3f} ms "
                     f"({dev['defined_s'] / dev['loaded_s']:.3f}x)"))

    path = write_result(result, "export")
    log(f"\n{result['gpu']['name']}, driver {result['gpu']['driver']}, torch {torch.__version__}")
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        log(f"{label:{width}s}  {value}")
    log(f"wrote {path}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
