"""Execute the notebooks headless, top to bottom, with this Python.

    python benchmarks/run_notebooks.py                  # on a GPU: every notebook, notebooks/0[1-7]*, outputs saved in place
    python benchmarks/run_notebooks.py notebooks/03_lltm.ipynb
    python benchmarks/run_notebooks.py --check          # anywhere: execute, save nothing (what CI does)

Each notebook sizes itself from the device (``FULL = torch.cuda.is_available()``):
full size on a GPU, tiny through numba-cuda's CUDA simulator on a CPU.  Saving
outputs is refused without a GPU, so the notebooks' saved outputs always come from
a GPU run; the run also records the device in the notebook's metadata
(``pnex_run``), next to the "Running on: ..." line each notebook prints.  Saved
outputs keep their static forms only (:func:`static_outputs`): a shipped notebook is
read where no kernel lives (GitHub, nbviewer, nbconvert, JupyterLab before a
kernel starts), and a widget view there shows "Loading widget..." or nothing.

The kernel is this interpreter (``sys.executable``) under a private kernel spec,
whatever ``python3`` kernel Jupyter would otherwise find, so the notebooks import
the same pnex_magic, torch and numba-cuda as the caller.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("0[1-7]_*.ipynb"))
KERNEL_NAME = "pnex-notebook-python"

__all__ = ["execute_notebook", "static_outputs", "this_python_kernel", "NOTEBOOKS", "main"]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def static_outputs(nb) -> int:
    """Drop widget views from ``nb``'s outputs that have another form (HTML, text) and
    the saved widget state; returns how many views were dropped."""
    dropped = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data and len(data) > 1:
                del data[WIDGET_VIEW]
                dropped += 1
    nb.metadata.pop("widgets", None)
    return dropped


@contextlib.contextmanager
def this_python_kernel() -> Iterator[str]:
    """A Jupyter kernel spec, valid inside the block, whose kernel is ``sys.executable``
    (found through ``$JUPYTER_PATH``); yields its name."""
    with tempfile.TemporaryDirectory(prefix="pnex-kernelspec-") as tmp:
        spec_dir = Path(tmp) / "kernels" / KERNEL_NAME
        spec_dir.mkdir(parents=True)
        spec = {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"Python ({sys.executable})",
            "language": "python",
        }
        (spec_dir / "kernel.json").write_text(json.dumps(spec))
        old = os.environ.get("JUPYTER_PATH")
        os.environ["JUPYTER_PATH"] = tmp + (os.pathsep + old if old else "")
        try:
            yield KERNEL_NAME
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def execute_notebook(path: Path | str, *, timeout: int = 1800, save: bool = False, failed_copy: Path | None = None):
    """Run every cell of the notebook at ``path`` in a fresh kernel (working directory:
    the notebook's folder); raises ``nbclient.exceptions.CellExecutionError`` at the
    first failing cell, after writing the partly executed notebook to ``failed_copy``
    if given.  Returns the executed notebook; with ``save``, also writes it back in
    place with the device recorded in its metadata."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    with this_python_kernel() as kernel_name:
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            resources={"metadata": {"path": str(path.parent)}},
        )
        try:
            client.execute()
        except Exception:
            if failed_copy is not None:
                nbformat.write(nb, failed_copy)
            raise
    if save:
        static_outputs(nb)
        nb.metadata["pnex_run"] = {
            "device": _device(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "sources": code_digest(nb),  # the code these outputs came from (tests/test_notebooks.py)
        }
        nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
        nbformat.write(nb, path)
    return nb


def code_digest(nb) -> str:
    """SHA-256 of the notebook's code cells' sources: what its saved outputs came from."""
    import hashlib

    h = hashlib.sha256()
    for cell in nb.cells:
        if cell.cell_type == "code":
            h.update(cell.source.encode() + b"\0")
    return h.hexdigest()


def _device() -> str:
    import torch

    if not torch.cuda.is_available():
        return "CPU (CUDA simulator)"
    return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"


def _xla_handler() -> str:
    """Build pnex's XLA FFI handler where JAX is installed (06_jax also loads it before its
    first trace: a function traced before the handler is ready launches through a Python
    callback for as long as JAX keeps the trace)."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return "no JAX here (06_jax needs it)"
    from pnex_magic.launch import xla

    try:
        return f"built, {xla.build_library()}"
    except Exception as exc:  # noqa: BLE001 -- say why, and let 06_jax report it too
        return f"not built: {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/0[1-7]_*.ipynb")
    parser.add_argument("--check", action="store_true", help="execute only; save nothing")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    parser.add_argument("--fresh", action="store_true",
                        help="do not build pnex's C++ launcher first: in a fresh cache the notebooks then run "
                             "while it builds (the Python launcher, 80-110 us a call on an H200, and a "
                             "background compiler beside every host-bound timing)")
    opts = parser.parse_args(argv)
    import torch

    if not opts.check and not torch.cuda.is_available():
        print("No GPU: the notebooks' saved outputs must come from a GPU run. Use --check to execute without saving.")
        return 1
    paths = opts.notebooks or NOTEBOOKS
    print(f"device: {_device()}")
    if torch.cuda.is_available() and not opts.fresh:  # the saved timings are those of a set-up machine
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_common import launcher_ready

        print(f"C++ launcher: {launcher_ready()}", flush=True)
        print(f"XLA FFI handler: {_xla_handler()}", flush=True)
    failed = 0
    for path in paths:
        start = time.perf_counter()
        print(f"{path} ...", flush=True)
        failed_copy = Path(tempfile.gettempdir()) / f"{path.stem}.failed.ipynb"
        try:
            execute_notebook(path, timeout=opts.timeout, save=not opts.check, failed_copy=failed_copy)
        except Exception as exc:  # report and go on with the other notebooks
            failed += 1
            print(f"  FAILED after {time.perf_counter() - start:.0f} s (partial run: {failed_copy}):\n{exc}", flush=True)
            continue
        print(f"  ok in {time.perf_counter() - start:.0f} s" + ("" if opts.check else ", outputs saved"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
