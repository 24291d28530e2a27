"""%pnex_cache, %pnex_doctor, and the %%pnex options that autotune, tune and check a kernel.

Every test drives a real IPython shell (``run_line_magic`` / ``run_cell_magic``
/ ``run_cell``) and asserts on ``user_ns``, on the report and its renderings, and
on the errors (tests/test_browser.py looks at the report in a browser).  Kernels run on CPU tensors
through numba-cuda's CUDA simulator, so sizes stay tiny (one 32-thread block).
"""

from __future__ import annotations

import pytest
import torch

from pnex_magic import cache
from pnex_magic.blocks import AUTO_CANDIDATES
from pnex_magic.errors import KernelDefinitionError
from pnex_magic.launch import autotune

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from magic_helpers import COPY, ip, magic_cache, run  # noqa: F401 (fixtures: ip, magic_cache)


# --------------------------------------------------------------------------- %pnex_cache and %pnex_doctor


def test_pnex_cache_lists_and_clears(ip, magic_cache):
    empty = ip.run_line_magic("pnex_cache", "")
    assert len(empty) == 0 and str(magic_cache) in str(empty)
    run(ip, "--n-threads a.numel() --threads-per-block 32 --arch sm_75", COPY)  # (a GPU host's default is its own)
    run(ip, "--n-threads a.numel() --threads-per-block 32 --arch sm_80", COPY)
    listing = ip.run_line_magic("pnex_cache", "")
    assert len(listing) == 2
    assert {r.arch for r in listing} == {"sm_75", "sm_80"} and all(r.kernel == "copy_k" for r in listing)
    assert all(r.size_bytes > 0 and r.registers for r in listing)
    assert "copy_k" in str(listing) and "<table" in listing._repr_html_()
    assert len(ip.run_line_magic("pnex_cache", "--kernel nothing_like_it")) == 0
    cleared = ip.run_line_magic("pnex_cache", "--clear --kernel copy_k")
    assert cleared.removed == 2 and "removed 2" in str(cleared)
    assert len(ip.run_line_magic("pnex_cache", "")) == 0
    with pytest.raises(UsageError):
        ip.run_line_magic("pnex_cache", "--bogus")


def test_pnex_doctor_reports_the_environment(ip):
    report = ip.run_line_magic("pnex_doctor", "")
    names = {c.name for c in report.checks}
    assert {"torch", "GPU", "NVIDIA driver", "numba-cuda", "NVVM", "nvJitLink", "NVRTC", "SASS", "build cache"} <= names
    assert report["torch"].detail.startswith(torch.__version__)
    if not torch.cuda.is_available():
        assert report["GPU"].status == "warn" and "simulator" in report["GPU"].detail
    if report["SASS"].status != "ok":
        assert any("cuobjdump" in a and a.startswith("pip install") for a in report.advice)
    assert "pnex doctor" in str(report) and "<table" in report._repr_html_()
    with pytest.raises(UsageError):
        ip.run_line_magic("pnex_doctor", "--what")


# --------------------------------------------------------------------------- autotune options

SCALE_CELL = '''
def scale_k(a: In("f32", (None, None)), s: int, out: Out("f32", "a")):
    x, y = cuda.grid(2)
    if y < out.shape[0] and x < out.shape[1]:
        out[y, x] = a[y, x] * s
'''


@pytest.mark.parametrize(
    "option, candidates",
    [
        ("--threads-per-block auto", AUTO_CANDIDATES[2]),
        ("--threads-per-block [(4, 2), (8, 8)]", ((4, 2), (8, 8))),
        ("--threads-per-block '[(8, 4),(2,2)]' --autotune-key a.size(0),s", ((8, 4), (2, 2))),
    ],
)
def test_magic_threads_per_block_auto_and_lists(ip, option, candidates):
    ip.run_cell("grid_x = torch.randn(3, 5)")
    ip.run_cell_magic("pnex", f'--n-threads "out.size(1), out.size(0)" {option} --args (grid_x, 3) -o rep', SCALE_CELL)
    rep = ip.user_ns["rep"]
    assert rep.op.spec.candidates == candidates
    assert rep.kernel.autotune.block == candidates[0]  # the simulator runs the first candidate
    assert "autotune" in rep.launch_html() and "autotune  :" in rep.to_text()
    if "--autotune-key" in option:
        assert [str(e) for e in rep.op.spec.autotune_key] == ["a.size(0)", "s"]
        assert "a.size(0)=3, s=3" in rep.kernel.autotune.key_text
    torch.testing.assert_close(ip.user_ns["scale_k"](ip.user_ns["grid_x"], 3), ip.user_ns["grid_x"] * 3)


def test_magic_autotune_option_errors(ip):
    with pytest.raises(UsageError, match=r"--threads-per-block expects a list of candidates such as \[128, 256\]"):
        ip.run_cell_magic("pnex", '--n-threads a.numel() --threads-per-block "[1, 2"', SCALE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"cell line 1 .*threads_per_block candidate 0 \(8\) is an int"):
        ip.run_cell_magic("pnex", '--n-threads "out.size(1), out.size(0)" --threads-per-block [8,16]', SCALE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"cell line 1 .*autotune_key=\('a.size\(0\)',\) is given but"):
        ip.run_cell_magic("pnex", '--n-threads "out.size(1), out.size(0)" --autotune-key a.size(0)', SCALE_CELL)


def test_pnex_cache_lists_and_clears_autotune_choices(ip, magic_cache):
    data = {"kernel": "__main__.scale_k", "gpu": "Fake GPU", "key_text": "a.size(0)=1024, contiguous inputs",
            "candidates": [{"block": [16, 16], "seconds": 3e-6}, {"block": [4, 64], "seconds": 1e-6}],
            "choice": [4, 64]}
    cache.store_record(autotune.RECORD_KIND, "a" * 64, data)
    cache.store_record(autotune.RECORD_KIND, "b" * 64, {**data, "kernel": "__main__.other"})
    listing = ip.run_line_magic("pnex_cache", "")
    assert len(listing.choices) == 2
    row = next(c for c in listing.choices if c.kernel == "scale_k")
    assert (row.choice, row.speedup, row.gpu) == ("(4, 64)", pytest.approx(3.0), "Fake GPU")
    assert "autotune choices: 2" in str(listing) and "3.00×" in listing._repr_html_()
    cleared = ip.run_line_magic("pnex_cache", "--clear --kernel scale_k")
    assert cleared.removed == 1
    assert [c.kernel for c in ip.run_line_magic("pnex_cache", "").choices] == ["other"]
    # --clear removes every part of the folder (pnex_magic.cache.PARTS), but those --keep names.
    cache.store_record("sass", "c" * 64, {"text": "IMAD"})
    listing = ip.run_line_magic("pnex_cache", "")
    assert "also: 1 SASS listing (" in str(listing) and "also: 1 SASS listing" in listing._repr_html_()
    cleared = ip.run_line_magic("pnex_cache", "--clear --keep autotune")
    assert cleared.removed == 1 and "removed 1 SASS listing; kept autotune choices" in str(cleared)
    assert len(ip.run_line_magic("pnex_cache", "").choices) == 1
    with pytest.raises(UsageError, match=r"--keep: .*no part named 'choices'; the parts are kernels, autotune"):
        ip.run_line_magic("pnex_cache", "--clear --keep choices")
    with pytest.raises(UsageError, match="--keep goes with --clear"):
        ip.run_line_magic("pnex_cache", "--keep autotune")
    cleared = ip.run_line_magic("pnex_cache", "--clear")
    assert cleared.cleared.removed["autotune"] == 1 and cleared.removed == 1
    assert ip.run_line_magic("pnex_cache", "").choices == ()


TUNE_CELL = """
def tcopy(a: In("f32", (None,)), r: Out("f32", "a"), ITEMS: Tune(1, 2, 4)):
    base = cuda.blockIdx.x * cuda.blockDim.x * ITEMS + cuda.threadIdx.x
    for k in range(ITEMS):
        j = base + k * cuda.blockDim.x
        if j < a.shape[0]:
            r[j] = a[j]
"""


def test_magic_tune_annotation_and_overrides(ip):
    ip.run_cell("tx = torch.randn(37)")
    line = '--n-threads "(a.numel() + ITEMS - 1) // ITEMS" --threads-per-block 8 --args tx -o rep'
    ip.run_cell_magic("pnex", line, TUNE_CELL)
    rep = ip.user_ns["rep"]
    assert rep.op.spec.tune_variants == ((1,), (2,), (4,))
    assert torch.equal(ip.user_ns["tcopy"](ip.user_ns["tx"]), ip.user_ns["tx"])
    assert rep.kernel.autotune.tune == (("ITEMS", 1),)  # the simulator runs the first choice
    assert "Tune (ITEMS: 1, 2, 4)" in rep.to_text()
    ip.run_cell_magic("pnex", line + " --tune ITEMS=4,8", TUNE_CELL)
    assert ip.user_ns["rep"].op.spec.tune_variants == ((4,), (8,))
    assert ip.user_ns["rep"].n_threads_values == (10,)  # (37 + 3) // 4 for the first choice
    with pytest.raises(UsageError, match=r"--tune expects NAME=CHOICE\[,CHOICE...\]"):
        ip.run_cell_magic("pnex", line + " --tune ITEMS", TUNE_CELL)
    with pytest.raises(UsageError, match=r"--tune ITEMS: 'x' is not a number or a bool"):
        ip.run_cell_magic("pnex", line + " --tune ITEMS=1,x", TUNE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"cell line 1 .*choices are given for 'a', which is an In parameter"):
        ip.run_cell_magic("pnex", line + " --tune a=1,2", TUNE_CELL)
    with pytest.raises(KernelDefinitionError, match=r"Tune choices must be ints, floats or bools"):
        ip.run_cell_magic("pnex", line + " --tune ITEMS=1,2.5", TUNE_CELL)


OVERRUN_CELL = """
def overrun(a: In("f32", (None,)), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        r[i + 1] = a[i]
"""


def test_magic_check_names_the_access_and_keeps_the_binding(ip):
    from pnex_magic import KernelIndexError

    ip.run_cell("ox = torch.randn(20)")
    with pytest.raises(KernelIndexError, match=r"cell line 1 .*--args ox: overrun\(\): index 20 is out of bounds for "
                       r"axis 0 of parameter 'r' \(shape \(20,\)\), at line 6: `r\[i \+ 1\] = a\[i\]`"):
        ip.run_cell_magic("pnex", "--n-threads a.numel() --check --args ox", OVERRUN_CELL)
    assert "overrun" not in ip.user_ns  # nothing bound
    with pytest.raises(UsageError, match="--sanitize needs --args"):
        ip.run_cell_magic("pnex", "--n-threads a.numel() --sanitize", OVERRUN_CELL)


def test_in_a_notebook_the_report_shows_before_its_sass_listing_is_made(ip, monkeypatch):
    """In a Jupyter kernel the cell shows its report as soon as it is built, with a note
    where the SASS listing goes, then replaces it in the same output with the listing
    (the disassembler takes 0.2-0.5 s to start); the bound report ends complete."""
    from IPython.display import DisplayHandle

    from pnex_magic.frontends import cell as cell_module
    from pnex_magic.render.report import PnexReport
    from pnex_magic.sass import PendingDisassembly, find_disassembler

    if find_disassembler() is None:
        pytest.skip("no cuobjdump/nvdisasm here (pip install 'pnex_magic[sass]')")
    shown = []

    def update(self, obj, **kwargs):
        if isinstance(obj, PnexReport):
            shown.append((type(obj.sass), bool(obj.sass), obj.kernel.sass == obj.sass))

    monkeypatch.setattr(cell_module, "in_kernel", lambda shell: True)
    monkeypatch.setattr(DisplayHandle, "update", update)
    run(ip, "--n-threads 'out.size(1), out.size(0)' -o rep_later", SCALE_CELL)
    if not ip.user_ns["rep_later"].kernel.ptx:
        pytest.skip("no NVVM here: nothing to disassemble")
    assert shown[0][0] is PendingDisassembly and shown[0][1] is False  # shown with the note first
    assert shown[-1][1] is True and shown[-1][2] is True and len(shown) == 2  # then the listing
    rep = ip.user_ns["rep_later"]
    assert rep.sass and "LDG" in rep.sass.text
