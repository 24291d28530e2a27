"""The %%pnex magic's errors: one error at the cell's line, the binding kept, option errors as
UsageError, earlier op objects after a re-run, --backward-of.

Every test drives a real IPython shell (``run_line_magic`` / ``run_cell_magic``
/ ``run_cell``) and asserts on ``user_ns``, on the report and its renderings, and
on the errors (tests/test_browser.py looks at the report in a browser).  Kernels run on CPU tensors
through numba-cuda's CUDA simulator, so sizes stay tiny (one 32-thread block).
"""

from __future__ import annotations

import pytest
import torch

from pnex_magic.errors import (
    ArgumentTypeError,
    KernelDefinitionError,
    KernelLaunchError,
    KernelTypingError,
    PnexError,
    ShapeExpressionError,
)

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402

from magic_helpers import COPY, TYPING_ERROR, ip, magic_cache, run  # noqa: F401 (fixtures: ip, magic_cache)


# --------------------------------------------------------------------------- errors

SCALED = '''
def scaled(a: In("f32", (None,)), result: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        result[i] = a[i] * FACTOR
'''


@pytest.fixture
def bound_copy(ip):
    ip.run_cell("x8 = torch.arange(8, dtype=torch.float32)")
    run(ip, "--n-threads a.numel() --threads-per-block 32", COPY)
    return ip.user_ns["copy_k"]


@pytest.mark.parametrize(
    ("cell", "error", "line", "words"),
    [
        ("\ndef copy_k(a: In('f32', (None,)), result: Out('f32', 'a'):\n    pass\n",
         KernelDefinitionError, 3, "invalid Python"),
        ("\ndef copy_k(a: In('f33', (None,)),\n           result: Out('f32', 'a')):\n    pass\n",
         KernelDefinitionError, 3, "unknown dtype 'f33'"),
        ("\ndef copy_k(a: In('f32', (None,)),\n           result: Out('f32', 'b')):\n    pass\n",
         ShapeExpressionError, 4, "'b' is not a tensor parameter"),
        ("\ndef copy_k(a: In('f32'),\n           result: Out('f32', 'a')):\n    pass\n",
         KernelDefinitionError, 3, "In(dtype, shape)"),
        (TYPING_ERROR, KernelTypingError, 6, "Numba could not compile"),
        ("\ndef copy_k(a: In('f32', (None,)), result: Out('f32', 'a')):\n    i = cuda.grid(1)\n"
         "    result[i] = a[i] * NOT_DEFINED\n", KernelTypingError, 5, "NOT_DEFINED"),
        ("\nimport not_a_module_pnex\n", KernelDefinitionError, 3, "ModuleNotFoundError"),
        ("\nx = 1\n", KernelDefinitionError, 2, "defines no kernel"),
        ("\n@cuda.jit\ndef copy_k(a: In('f32', (None,)), result: Out('f32', 'a')):\n    pass\n",
         KernelDefinitionError, 2, "remove the decorator"),
    ],
    ids=["syntax", "dtype", "shape", "missing-shape", "typing", "undefined-global", "import", "no-kernel",
         "decorated"],
)
def test_failing_cell_raises_one_error_at_its_line_and_keeps_the_binding(
    ip, bound_copy, magic_cache, cell, error, line, words
):
    def entries() -> list[str]:  # (the simulator's records of typed kernels are no builds)
        return sorted(p.name for p in magic_cache.iterdir() if p.name != "simulated")

    entries_before = entries()
    with pytest.raises(error) as info:
        run(ip, "--n-threads a.numel() --threads-per-block 32", cell)
    assert str(info.value).startswith(f"cell line {line}:"), str(info.value)
    assert words in str(info.value)
    assert info.value.cell_line == line
    assert ip.user_ns["copy_k"] is bound_copy
    torch.testing.assert_close(bound_copy(ip.user_ns["x8"]), ip.user_ns["x8"])
    assert entries() == entries_before  # failed builds are not cached
    rendered = "\n".join(info.value._render_traceback_())
    assert f"-->{line:>4} |" in rendered


def test_typing_error_carries_the_full_compiler_log(ip, bound_copy):
    with pytest.raises(KernelTypingError) as info:
        run(ip, "--n-threads a.numel()", TYPING_ERROR)
    assert "candidate implementations" in info.value.compiler_log  # the full log, folded away
    assert "candidate implementations" not in str(info.value)  # the message stays short
    assert info.value.lineno is None or info.value.lineno == 6
    # The cell line once (not "cell line 6: kernel 'copy_k' (line 6)"), and the log pointed at once:
    # below the message outside a notebook (in a notebook it is folded above the error instead).
    assert str(info.value).startswith("cell line 6: kernel 'copy_k': Numba could not compile"), str(info.value)
    assert "(line 6)" not in str(info.value) and "compiler_log" not in str(info.value)
    rendered = "\n".join(info.value._render_traceback_())
    assert rendered.count("compiler_log") == 1 and "sys.last_value.compiler_log" in rendered


def test_error_shows_concisely_through_ipython(ip, bound_copy, capsys):
    result = ip.run_cell("%%pnex --n-threads a.numel()\n" + TYPING_ERROR.lstrip("\n"))
    assert isinstance(result.error_in_exec, KernelTypingError)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "KernelTypingError" in text and 'result[i] = a[i] + "text"' in text
    assert "site-packages" not in text and "magic.py" not in text  # no traceback through pnex
    assert ip.user_ns["copy_k"] is bound_copy


@pytest.mark.parametrize(
    ("line", "error", "words"),
    [
        ("--args (no_such_name,)", PnexError, "NameError"),
        ("--args (x8, x8)", ArgumentTypeError, "takes 1 argument"),
        ("--args (x8.double(),)", ArgumentTypeError, "must be a float32 tensor"),
        ("--args (x8,) --eager torch.no_such_function", PnexError, "--eager"),
        ("--args (x8,) --eager 3", PnexError, "not a callable"),
        ("--args (x8,) --eager lambda a: a.reshape(3, 5)", PnexError, "calling it on --args \\(x8,\\) raised"),
    ],
)
def test_bad_args_or_eager_raise_and_keep_the_binding(ip, bound_copy, line, error, words):
    with pytest.raises(error, match=words) as info:
        run(ip, "--n-threads a.numel() --threads-per-block 32 " + line, COPY)
    assert str(info.value).startswith("cell line 1 (the %%pnex line):")
    assert ip.user_ns["copy_k"] is bound_copy


def test_bad_args_are_caught_before_the_op_is_registered(ip):
    ip.run_cell("x4 = torch.arange(4, dtype=torch.float32); FACTOR = 2.0")
    run(ip, "--n-threads a.numel() --threads-per-block 32", SCALED)
    before = ip.user_ns["scaled"]
    ip.run_cell("FACTOR = 3.0")
    with pytest.raises(ArgumentTypeError):
        run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x4.long(),)", SCALED)
    assert ip.user_ns["scaled"] is before
    x4 = ip.user_ns["x4"]
    torch.testing.assert_close(before(x4), 2 * x4)  # the old kernel is still registered


def test_kernel_fault_on_args_restores_the_previous_op(ip):
    ip.run_cell("x4 = torch.arange(4, dtype=torch.float32); FACTOR = 2.0")
    run(ip, "--n-threads a.numel() --threads-per-block 32", SCALED)
    before = ip.user_ns["scaled"]
    # Compiles and registers fine, then faults on the example arguments: no bounds check.
    with pytest.raises(KernelLaunchError, match="cell line 1"):
        run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x4,)", SCALED.replace(
            "    if i < a.shape[0]:\n        result[i]", "    if True:\n        result[i]"))
    restored = ip.user_ns["scaled"]
    assert restored.definition is before.definition  # the previous kernel, registered again
    x4 = ip.user_ns["x4"]
    torch.testing.assert_close(restored(x4), 2 * x4)
    torch.testing.assert_close(getattr(torch.ops.pnex, before._name)(x4), 2 * x4)


RESCALED = SCALED.replace("def scaled(", "def rescaled(")
RESCALED_WITH_OFFSET = RESCALED.replace('Out("f32", "a"))', 'Out("f32", "a"), offset: float = 1.5)').replace(
    "* FACTOR", "* FACTOR + offset"
)
assert RESCALED_WITH_OFFSET.count("offset") == 2


def test_rerun_keeps_earlier_objects_live_or_makes_them_fail_clearly(ip):
    """Re-running a cell: earlier op objects (a model built before) call the new kernel
    while the signature stays, and raise, naming the redefinition, once it changes."""
    ip.run_cell("x4 = torch.randn(4); FACTOR = 2.0")
    x4 = ip.user_ns["x4"]
    run(ip, "--n-threads a.numel() --threads-per-block 32", RESCALED)
    first = ip.user_ns["rescaled"]
    torch.testing.assert_close(first(x4), 2 * x4)
    ip.run_cell("FACTOR = 5.0")
    run(ip, "--n-threads a.numel() --threads-per-block 32", RESCALED)  # same signature, new body
    second = ip.user_ns["rescaled"]
    assert second is not first
    torch.testing.assert_close(first(x4), 5 * x4)
    torch.testing.assert_close(second(x4), 5 * x4)
    # Another signature (a scalar with a default), checked on --args that leave it out.
    run(ip, "--n-threads a.numel() --threads-per-block 32 --args (x4,) --eager lambda a: a * 5 + 1.5 -o rep",
        RESCALED_WITH_OFFSET)
    assert ip.user_ns["rep"].timing.correctness.ok
    third = ip.user_ns["rescaled"]
    torch.testing.assert_close(third(x4), 5 * x4 + 1.5)
    torch.testing.assert_close(third(x4, -1.0), 5 * x4 - 1.0)
    for old in (first, second):
        with pytest.raises(KernelDefinitionError, match=r"(?s)rescaled\(\): this op object is from an earlier "
                           r"definition, rescaled\(a: Tensor\[float32, \(None,\)\]\) -> .*; the op was redefined "
                           r"at .+ as rescaled\(a: Tensor\[float32, \(None,\)\], offset: float = 1.5\).*Use the object"):
            old(x4)
    torch.testing.assert_close(getattr(torch.ops.pnex, third._name)(x4), 5 * x4 + 1.5)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("", "needs --n-threads"),
        ("--args (x8,)", "needs --n-threads"),
        ("--n-threads a.numel() --threads-per-block 0", "positive"),
        ("--n-threads a.numel() --threads-per-block 8,x", "N\\[,N\\[,N\\]\\]"),
        ("--n-threads a.numel() --max-registers -2", "positive"),
        ("--n-threads a.numel() --max-registers lots", "invalid int"),
        ("--n-threads a.numel() --arch xyz", "unknown GPU architecture"),
        ("--n-threads a.numel() --no-such-option", "unrecognized arguments"),
        ("--n-threads a.numel() --name nope", "no function of that name"),
        ("--n-threads a.numel() --eager torch.clone", "--eager needs --args"),
        ("--n-threads a.numel() -o 1x", "Python name"),
        ("--n-threads a.numel() -o Out", "history"),
        ("--n-threads a, b, c, d", "at most 3"),
        ("--n-threads a.numel() --backward-of x8", "not a pnex op"),
        ("--n-threads a.numel() --args 'unbalanced", "cannot split"),
    ],
)
def test_option_errors_are_usage_errors(ip, bound_copy, line, words):
    with pytest.raises(UsageError, match=words):
        run(ip, line, COPY)
    assert ip.user_ns["copy_k"] is bound_copy


def test_backward_of_attaches_through_autograd(ip):
    autograd = pytest.importorskip("pnex_magic.autograd")
    assert hasattr(autograd, "attach_backward")
    ip.run_cell("xg = torch.arange(4, dtype=torch.float32)")
    run(ip, "--n-threads x.numel() --threads-per-block 32", '''
def double_fw(x: In("f32", (None,)), y: Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = 2.0 * x[i]
''')
    run(ip, "--n-threads grad_y.numel() --threads-per-block 32 --backward-of double_fw -o rep", '''
def double_bw(grad_y: In("f32", (None,)), grad_x: Out("f32", "grad_y")):
    i = cuda.grid(1)
    if i < grad_y.shape[0]:
        grad_x[i] = 2.0 * grad_y[i]
''')
    assert ip.user_ns["rep"].backward_of == "double_fw"
    x = ip.user_ns["xg"].clone().requires_grad_()
    ip.user_ns["double_fw"](x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
