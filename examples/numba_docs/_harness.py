"""How ``tests/test_numba_doc_examples.py`` and ``benchmarks/doc_examples.py`` run a port:
find and load it, run it with poisoned outputs, compare its results with its references."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

FOLDER = Path(__file__).resolve().parent


def ports() -> list[str]:
    """Every port's name (its file's, without ``.py``; ``_`` files are helpers)."""
    return sorted(p.stem for p in FOLDER.glob("*.py") if not p.name.startswith("_"))


def load(name: str) -> ModuleType:
    """The port ``name`` as a module (this folder on ``sys.path``, for the ports' helpers)."""
    if str(FOLDER) not in sys.path:
        sys.path.insert(0, str(FOLDER))
    module_name = f"pnex_numba_docs_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, FOLDER / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def missing_requirements(module: ModuleType) -> list[str]:
    """The modules of the port's ``REQUIRES`` that cannot be imported here."""
    return [r for r in getattr(module, "REQUIRES", ()) if importlib.util.find_spec(r) is None]


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """Every tensor PyTorch allocates uninitialised (the ops' outputs) is filled with NaN
    (integers: their largest value) first, so an output a kernel does not write shows."""
    import torch.utils.deterministic as deterministic

    mode, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        deterministic.fill_uninitialized_memory = fill
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)


def compare(module: ModuleType, results: dict, references: dict) -> tuple[float, list[str]]:
    """The largest absolute difference between results and references (in float64; NaN
    counts as infinite) and what is wrong (empty: every result within the port's
    ``TOLERANCE``)."""
    worst, problems = 0.0, []
    if results.keys() != references.keys() or not references:
        problems.append(f"results {sorted(results)} for references {sorted(references)}")
    for key, reference in references.items():
        got = results.get(key)
        if not isinstance(got, torch.Tensor) or got.shape != reference.shape:
            problems.append(f"{key!r}: {None if got is None else tuple(getattr(got, 'shape', ()))} for "
                            f"{tuple(reference.shape)}")
            continue
        got, want = got.detach().cpu().double(), reference.detach().cpu().double()
        error = (got - want).abs().nan_to_num(nan=float("inf"))
        worst = max(worst, float(error.max()) if error.numel() else 0.0)
        close = torch.isclose(got, want, **module.TOLERANCE)
        if not bool(close.all()):
            bad = int((~close).sum())
            problems.append(f"{key!r}: {bad} of {got.numel()} elements beyond {module.TOLERANCE} (largest difference "
                            f"{float(error.max()):.3g})")
    return worst, problems
