"""What was run and where: :func:`environment` (GPU, driver, versions, date: the header of
every result), :func:`same_kernel` (a notebook's ``%%pnex`` kernel is the one benchmarked,
compared by source) and :func:`named_in_workloads` (the module name the kernels' ops are
named after)."""

import datetime as _dt
import platform
import subprocess
from typing import Any

import torch

__all__ = ["WORKLOADS_MODULE", "named_in_workloads", "environment", "same_kernel"]

#: The module the kernels were written in before the split into ``workloads_lib``, and the
#: facade that still exports them.
WORKLOADS_MODULE = "workloads"


def named_in_workloads(fn: Any) -> Any:
    """``fn``, its ``__module__`` set to :data:`WORKLOADS_MODULE` (as numpy's ``set_module``
    does for its public functions).  A pnex op's name is its kernel's name and a hash of
    ``module.qualname`` (:attr:`pnex_magic.definition.KernelDefinition.op_name`), and so is part
    of its compile-cache key: the kernels of ``workloads_lib`` keep the names and keys they had
    in ``workloads.py``.  Applied under ``@pnex.jit`` (or before it, in the kernel factories)."""
    fn.__module__ = WORKLOADS_MODULE
    return fn


def _versions() -> dict:
    from importlib import metadata

    v = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    for dist in ("numba-cuda", "numba", "pnex_magic", "numpy", "triton"):
        try:
            v[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            v[dist] = None
    return v


def environment() -> dict:
    """Where this runs: GPU name, capability and driver (if any), and versions."""
    info: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if torch.cuda.is_available():
        gpu = {"name": torch.cuda.get_device_name(), "capability": "%d.%d" % torch.cuda.get_device_capability()}
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30,
            )
            gpu["driver"] = out.stdout.strip().splitlines()[0]
        except Exception:
            gpu["driver"] = None
        info["gpu"] = gpu
        info["device"] = f"{gpu['name']} (driver {gpu['driver']}, CUDA {torch.version.cuda})"
    else:
        info["gpu"] = None
        info["device"] = "CPU only: pnex ops run in numba-cuda's CUDA simulator (no GPU timings)"
    info["versions"] = _versions()
    return info


def same_kernel(op: Any, reference: Any) -> bool:
    """True when two pnex ops were made from the same kernel source (the function
    definition without its decorators, compared as a syntax tree, so formatting and
    comments do not matter).  Notebooks use it to show that their ``%%pnex`` cell is
    the kernel this module benchmarks."""
    import ast
    import inspect
    import textwrap

    def tree(fn_or_op: Any) -> str:
        definition = getattr(fn_or_op, "definition", None)
        fn = definition.fn if definition is not None else fn_or_op
        source = textwrap.dedent(inspect.getsource(fn))
        node = ast.parse(source).body[0]
        node.decorator_list = []
        node.name = "kernel"
        return ast.dump(node, annotate_fields=False)

    return tree(op) == tree(reference)
