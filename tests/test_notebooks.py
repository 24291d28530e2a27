"""The workload notebooks (notebooks/02-06): they execute headless, top to bottom.

Without a GPU each notebook sizes itself down (``FULL = torch.cuda.is_available()``)
and its kernels run in numba-cuda's CUDA simulator.  The notebooks are executed in
memory, with the kernel's working directory in ``notebooks/`` (they import
``benchmarks/workloads.py`` from the repository); nothing is written back, so the
saved outputs stay those of the GPU run.  The kernel is this interpreter
(``benchmarks/run_notebooks.py``'s private kernel spec).
"""

import ast
import re
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import run_notebooks  # noqa: E402

NOTEBOOKS = {p.name: p for p in sorted((REPO / "notebooks").glob("0[2-6]_*.ipynb"))}
EXPECTED = ["02_diffusion.ipynb", "03_lltm.ipynb", "04_kmeans.ipynb", "05_colab.ipynb", "06_jax.ipynb"]


def test_the_notebooks_are_there():
    assert sorted(NOTEBOOKS) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_structure(name):
    nb = nbformat.read(NOTEBOOKS[name], as_version=4)
    nbformat.validate(nb)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any("FULL = torch.cuda.is_available()" in c for c in code), "a parameter cell sizes the run from the device"
    assert any(c.startswith("%%pnex") for c in code), "the notebook shows the %%pnex report"
    assert any("plt." in c for c in code), "the notebook ends with a plot"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


def _pnex_kernels(nb) -> dict[str, str]:
    kernels = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.startswith("%%pnex"):
            body = cell.source.split("\n", 1)[1]
            fn = next(n for n in ast.parse(body).body if isinstance(n, ast.FunctionDef))
            fn.name = "kernel"
            kernels[re.search(r"def (\w+)\(", body).group(1)] = ast.dump(fn, annotate_fields=False)
    return kernels


@pytest.mark.parametrize(
    "name, kernels",
    [
        ("02_diffusion.ipynb", ["diffusion_step"]),
        ("03_lltm.ipynb", ["lltm_forward", "lltm_backward"]),
        ("04_kmeans.ipynb", ["kmeans_assign"]),
        ("06_jax.ipynb", ["diffusion_step"]),
    ],
)
def test_notebook_kernels_are_the_benchmarked_ones(name, kernels):
    """The kernels in the notebooks' %%pnex cells are those benchmarks/workloads.py times
    (the notebooks also check this when they run)."""
    import inspect
    import textwrap

    import workloads

    found = _pnex_kernels(nbformat.read(NOTEBOOKS[name], as_version=4))
    assert sorted(found) == sorted(kernels)
    for kernel in kernels:
        fn = ast.parse(textwrap.dedent(inspect.getsource(getattr(workloads, kernel).definition.fn))).body[0]
        fn.decorator_list = []
        fn.name = "kernel"
        assert found[kernel] == ast.dump(fn, annotate_fields=False), f"{name}: {kernel} differs from workloads.py"


def test_colab_install_cell_is_guarded():
    nb = nbformat.read(NOTEBOOKS["05_colab.ipynb"], as_version=4)
    install = next(c.source for c in nb.cells if c.cell_type == "code" and "%pip install" in c.source)
    assert 'IN_COLAB = "google.colab" in sys.modules' in install
    assert re.search(r"^if IN_COLAB:\n    %pip install", install, re.MULTILINE)
    assert "[cu12]" in install


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_executes(name):
    nb = run_notebooks.execute_notebook(NOTEBOOKS[name], timeout=600)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    text = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "stream"
    )
    assert "Running on:" in text
