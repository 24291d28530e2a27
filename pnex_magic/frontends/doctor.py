"""``%pnex_doctor``: what this environment can do for pnex, and what to install.

It probes the GPU, the driver, PyTorch's CUDA build and the CUDA compiler wheels
numba-cuda finds, without compiling user code, and says which extra fits the
driver (:data:`EXTRAS`): ``pnex_magic[cu13]`` needs a CUDA 13 driver (580 or
newer); CUDA 12 drivers, Colab's among them, need ``pnex_magic[cu12]``.
Compiler wheels newer than the driver are flagged (:func:`driver_vs_wheels`).
"""

from __future__ import annotations

import dataclasses
import html
import os
import sys

from .. import cache, warmup
from .._version import __version__
from ..codeversion import code_version
from ..compiler import probe_linker
from ..launch import switch
from ..render.html import ERR, OK, WARN
from ..sass import find_disassembler
from ..timing import format_bytes

__all__ = ["Check", "DoctorReport", "doctor", "driver_vs_wheels", "extra_for", "EXTRAS"]


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
        colour = {"ok": OK, "warn": WARN, "missing": ERR}
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


# Which compiler wheels fit which driver.  pnex loads cubins only (pnex_magic/cubin.py):
# a cubin from CUDA X.Y loads on any driver of CUDA X.Z (Z >= 0, minor-version
# compatibility) or newer, never on an older major version.
EXTRAS = {
    12: "cu12: CUDA 12 drivers (525 or newer; Colab's)",
    13: "cu13: CUDA 13 drivers (580 or newer)",
}


def extra_for(driver_cuda: tuple[int, int] | None, torch_cuda: str | None = None) -> str:
    """The extra whose compiler wheels this driver runs: ``cu12`` for a CUDA 12 driver,
    ``cu13`` for CUDA 13 or newer; without a driver, the one PyTorch was built for."""
    if driver_cuda is not None:
        return "cu12" if driver_cuda[0] <= 12 else "cu13"
    return "cu12" if (torch_cuda or "").startswith("12") else "cu13"


def driver_vs_wheels(
    driver_cuda: tuple[int, int] | None, linker_cuda: tuple[int, int] | None
) -> tuple[Check, str] | None:
    """The doctor's line on whether the driver can load what the installed nvJitLink
    links (and what to install if not); ``None`` without a driver or a linker."""
    if driver_cuda is None or linker_cuda is None:
        return None
    driver, linker = f"CUDA {driver_cuda[0]}.{driver_cuda[1]}", f"CUDA {linker_cuda[0]}.{linker_cuda[1]}"
    wanted = extra_for(driver_cuda)
    if linker_cuda[0] > driver_cuda[0]:
        return (
            Check("driver vs wheels", "missing",
                  f"the compiler wheels are {linker} but the driver supports {driver}: it cannot load their cubins "
                  f"({EXTRAS[linker_cuda[0]]})"),
            f'pip install "pnex_magic[{wanted}]"   # compiler wheels this driver can run ({EXTRAS[int(wanted[2:])]}); '
            f"or update the NVIDIA driver",
        )
    return Check("driver vs wheels", "ok", f"{linker} cubins load on this {driver} driver (extra [{wanted}])"), ""


def doctor() -> DoctorReport:
    """Probe the GPU, driver, PyTorch build and CUDA compiler wheels (no compile of
    user code); see :class:`DoctorReport`.

    It takes over from ``%load_ext``'s warm-up first (:func:`pnex_magic.warmup.wait`), as
    every pnex call that imports Numba does: its probes import ``numba.cuda`` (NVVM) and
    CUDA Python, and run in the cell that ``%load_ext`` ends, at once.  Beside the
    warm-up's import of ``numba.cuda`` they deadlocked on the package's module locks
    (numba.cuda and numba.cuda.cudadrv import each other); Python broke the deadlock by
    failing the warm-up's import, which left a ``numba.cuda`` without its submodules'
    attributes, so every kernel of the process failed to compile (notebook 05 on CPU:
    "module 'numba.cuda' has no attribute 'datamodel'")."""
    warmup.wait()
    checks: list[Check] = []
    advice: list[str] = []
    in_colab = "google.colab" in sys.modules
    checks.append(Check("pnex_magic", "ok", f"{__version__} ({code_version()}) on Python {sys.version.split()[0]}"
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
    if gpu:  # GPU calls at a few microseconds; the Python launcher (tens) until it serves
        state = switch.status()
        usable = state.split(";")[0] in ("loaded", "built, not loaded yet", "building in the background", "not built yet")
        checks.append(Check("C++ launcher", "ok" if usable else "warn", state))

    # The CUDA compiler wheels.
    flavour = None
    if any(_dist_version(d) for d in ("nvidia-nvjitlink-cu12", "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvcc-cu12")):
        flavour = 12
    if _dist_version("nvidia-nvvm") or _dist_version("nvidia-nvjitlink"):
        flavour = 13 if flavour is None else flavour
    install = f'pip install "pnex_magic[{extra_for(driver_cuda, torch_cuda)}]"'
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
    linker_cuda: tuple[int, int] | None = None
    try:
        from cuda.bindings import nvjitlink

        linker_cuda = tuple(nvjitlink.version())[:2]
        probe_linker()
        checks.append(Check("nvJitLink", "ok", f"CUDA {linker_cuda[0]}.{linker_cuda[1]} {libpath('nvJitLink')}".strip()))
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
    fits = "; ".join(EXTRAS.values())
    here = f"this driver: [{extra_for(driver_cuda)}]" if driver_cuda else "no driver here"
    checks.append(Check("extras", "ok", f"{fits}; {here}"))
    match = driver_vs_wheels(driver_cuda, linker_cuda if link_ok else None)
    if match is not None:
        check, fix = match
        checks.append(check)
        if fix:
            advice.append(fix)

    # SASS.
    found = find_disassembler()
    if found:
        checks.append(Check("SASS", "ok", f"{found[0]} at {found[1]}"))
    else:
        checks.append(Check("SASS", "warn", "no cuobjdump or nvdisasm: the report shows PTX but no SASS"))
        advice.append('pip install "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*"   # to see SASS '
                      '(these CUDA 13 tools also read CUDA 12 builds)')

    # The build cache: every part of its folder (pnex_magic.cache.PARTS).
    use = cache.usage()
    kept = [f"{cache.describe(part, u.items)} ({format_bytes(u.bytes)})" for part, u in use.items() if u.items]
    total = format_bytes(sum(u.bytes for u in use.values()))
    checks.append(Check("build cache", "ok", f"{cache.cache_dir()}: {', '.join(kept) or 'empty'}; {total} in all"))
    return DoctorReport(tuple(checks), tuple(advice))
