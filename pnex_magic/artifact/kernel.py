"""A kernel loaded from a saved artifact: the :class:`~pnex_magic.launch.kernel.Kernel`
interface that launchers see, served from data.

``kernel_image(arch, layout, variant)`` hands out the saved cubin for the GPU's
architecture (of a ``Tune`` variant: each saved variant has its own code).  For an architecture the artifact has no cubin for, it falls back to
the saved PTX, once per architecture and layout, and says so once: linked into a
cubin by nvJitLink where that is installed (it also reads PTX from a newer CUDA
than the driver's), else handed to the CUDA driver, which compiles PTX itself.
It has no Python source, so it cannot run on CPU tensors (``simulated_function()``
is ``None``; the simulator then raises a clear error).
"""

from __future__ import annotations

import logging
import threading

from ..arch import parse_arch
from ..definition import JitOptions
from ..errors import KernelLaunchError
from ..linking import link_ptx_direct, uses_grid_sync
from ..spec import KernelSpec
from .manifest import OpEntry

__all__ = ["SavedKernel"]

log = logging.getLogger(__name__)


class SavedKernel:
    """One op's kernel from an artifact (``origin`` is the artifact's path)."""

    def __init__(self, entry: OpEntry, origin: str):
        self.spec: KernelSpec = entry.spec
        self.options = JitOptions(max_registers=entry.max_registers)
        self.origin = origin
        self._op_name = entry.op_name
        self._images = entry.images
        #: It synchronises its grid: GPU launchers launch it cooperatively.
        self.cooperative = entry.cooperative
        self._linked: dict[tuple[str, str, int], bytes] = {}
        self._said: set[str] = set()
        self._lock = threading.Lock()

    @property
    def op_name(self) -> str:
        return self._op_name

    @property
    def compiles(self) -> bool:
        return True

    @property
    def archs(self) -> tuple[str, ...]:
        """The architectures the artifact has cubins for."""
        return tuple(sorted(self._images[0]["C"].cubins, key=parse_arch))

    def kernel_image(self, arch: str, layout: str = "C", variant: int = 0, checked: bool = False) -> tuple[bytes, str]:
        """The saved cubin for ``arch``, else its PTX (see the module docstring).  An
        artifact holds the fast code only: ``checked=True`` raises a clear error."""
        if checked:
            raise KernelLaunchError(
                f"kernel {self.spec.name!r} was loaded from {self.origin}, which holds its fast code only, not the "
                f"checked variant (that is built from the kernel's Python source): check it where it is defined, "
                f"with jit(check=True), %%pnex --check or PNEX_CHECK=1"
            )
        images = self._images[variant][layout]
        cubin = images.cubins.get(arch)
        if cubin is not None:
            return cubin, images.entry
        with self._lock:
            image = self._linked.get((arch, layout, variant))
            if image is None:
                image = self._linked[(arch, layout, variant)] = self._from_ptx(arch, layout, variant)
        return image, images.entry

    def _from_ptx(self, arch: str, layout: str, variant: int = 0) -> bytes:
        images = self._images[variant][layout]
        name = self.spec.name
        if parse_arch(arch) < parse_arch(images.ptx_arch):
            raise KernelLaunchError(
                f"kernel {name!r} (loaded from {self.origin}) has code for {', '.join(self.archs)} and PTX for "
                f"{images.ptx_arch} and newer, but this GPU is {arch}: save it again with {arch} in archs"
            )
        try:
            image = link_ptx_direct(images.ptx, arch, self.options.max_registers, name)
            how = "linked into a cubin by nvJitLink"
        except (ImportError, OSError, RuntimeError) as exc:  # KernelCompileError is a RuntimeError
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if uses_grid_sync(images.ptx):
                raise KernelLaunchError(
                    f"kernel {name!r} (loaded from {self.origin}) has no cubin for this GPU's architecture, {arch}, "
                    f"and its PTX synchronises its grid (cuda.cg.this_grid()), which only nvJitLink can link (with "
                    f"CUDA's device runtime library); nvJitLink is not usable here ({reason}). Save it with {arch} "
                    f"in archs, or install nvJitLink and the CUDA runtime wheel (pnex_magic[cu13] or [cu12])"
                ) from None
            image = images.ptx.encode() + b"\0"
            how = f"compiled by the CUDA driver (nvJitLink is not usable here: {reason})"
        if arch not in self._said:
            self._said.add(arch)
            log.warning(
                "pnex: kernel %r (loaded from %s) has no cubin for this GPU's architecture, %s (it has %s); "
                "running its PTX for %s, %s. Save it with %s in archs to skip this step.",
                name, self.origin, arch, ", ".join(self.archs), images.ptx_arch, how, arch,
            )
        return image

    def simulated_function(self, checked: bool = False, variant: int = 0) -> None:
        """``None``: an artifact holds no Python source for the CUDA simulator."""
        return None

    def __repr__(self) -> str:
        return f"<SavedKernel {self._op_name} from {self.origin} ({', '.join(self.archs)})>"
