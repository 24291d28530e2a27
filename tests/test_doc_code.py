"""Every code block of the documentation runs: the ``python`` and ``ipython`` blocks of each
page of ``docs/`` and of ``README.md``, in page order, in one IPython shell per page (a page's
blocks build on each other; ``%%pnex`` cells and ``%pnex_doctor`` run as in a notebook).

On CPU the kernels run in numba-cuda's CUDA simulator.  A block whose first line is ``# gpu``
(or, for a ``%%pnex`` cell, where nothing may come before the magic, a ``{code-block} ipython``
directive with ``:class: gpu``) needs a GPU: the CPU test of its page leaves it out, and the page's GPU test (marked ``gpu``,
skipped with a reason where there is no GPU, run by the GPU test round) runs the whole page,
every block in order.  Blocks of other languages (``bash``, ``text``) are not run.
"""

from __future__ import annotations

import pytest

from docs_support import REPO, Block, code_blocks, pages

pytest.importorskip("IPython")
from IPython.testing import globalipapp  # noqa: E402

PAGES = {str(p.relative_to(REPO)): p for p in pages() if any(b.runs for b in code_blocks(p))}
GPU_PAGES = [name for name, p in PAGES.items() if any(b.runs and b.gpu for b in code_blocks(p))]


@pytest.fixture(scope="module")
def ip():
    yield globalipapp.get_ipython()
    # torch.compile in a page's cells puts names of its own in user_ns (__builtins_dict___0), which
    # dynamo deletes when its compiled code dies; at exit IPython clears user_ns first, and dynamo's
    # hook then printed a KeyError traceback after the test summary. Its code dies here instead.
    import sys

    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()


def run_page(ip, blocks: list[Block]) -> None:
    """Run the blocks in order in the shell; a page's names are removed afterwards."""
    before = set(ip.user_ns)
    try:
        for block in blocks:
            result = ip.run_cell(block.code, store_history=False)
            error = result.error_before_exec or result.error_in_exec
            if error is not None:
                raise AssertionError(f"{block} failed: {type(error).__name__}: {error}\n{block.code}") from error
    finally:
        for name in set(ip.user_ns) - before:
            if not name.startswith("__"):  # torch.compile keeps entries of its own there (__builtins_dict___0)
                ip.user_ns.pop(name, None)


def test_the_pages_have_code():
    assert {"README.md", "docs/getting-started.md", "docs/kernels.md", "docs/magic.md"} <= set(PAGES)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_code_runs(page, ip):
    blocks = [b for b in code_blocks(PAGES[page]) if b.runs and not b.gpu]
    if not blocks:
        pytest.skip(f"{page}: every block needs a GPU (its GPU test runs them)")
    run_page(ip, blocks)


@pytest.mark.gpu
@pytest.mark.parametrize("page", GPU_PAGES)
def test_page_code_runs_on_a_gpu(page, ip):
    run_page(ip, [b for b in code_blocks(PAGES[page]) if b.runs])


def test_gpu_marker_is_read_from_the_first_line():
    gpu = Block("x.md", 1, "python", "# gpu\nimport torch\n")
    also = Block("x.md", 1, "ipython", "# gpu: needs compute-sanitizer\n%load_ext pnex_magic\n")
    cpu = Block("x.md", 1, "python", "import torch  # gpu later\n")
    assert gpu.gpu and also.gpu and not cpu.gpu
    assert not Block("x.md", 1, "bash", "pip install x\n").runs
    assert Block("x.md", 1, "ipython", "%%pnex --args (x,)\n", ("gpu",)).gpu


def test_code_block_directives_are_read(tmp_path):
    from docs_support import code_blocks

    page = tmp_path / "page.md"
    page.write_text("text\n\n```{code-block} ipython\n:class: gpu\n%%pnex --n-threads 1\ndef k(): pass\n```\n\n"
                    "```python\nx = 1\n```\n\n```{pnex-results} f.json\n:table: t\n```\n")
    magic, plain, results = code_blocks(page)
    assert (magic.language, magic.code, magic.gpu, magic.runs) == ("ipython", "%%pnex --n-threads 1\ndef k(): pass\n", True, True)
    assert (plain.language, plain.gpu, plain.runs, plain.line) == ("python", False, True, 9)
    assert not results.runs
