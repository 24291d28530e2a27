"""Saved artifacts on a GPU: a loaded op runs, in a fresh process that cannot import
Numba, NVVM or nvJitLink, with the C++ and the Python driver launchers, on
contiguous and strided inputs, in CUDA graphs, under torch.compile and autograd;
a torch.export + AOTInductor package runs after pnex.load in such a process; an
artifact without a cubin for this GPU runs through its PTX (nvJitLink, else the
driver).  Results are checked against torch on the same inputs.

Skipped with a reason where no NVIDIA GPU is present (marker ``gpu``).
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

import pnex_magic as pnex
from pnex_magic.launch import native
from pnex_magic.multiarch import DEFAULT_ARCHS

from artifact_kernels import make_copy, make_rich, make_scale_pair
from blocked_imports import run_blocked

pytestmark = pytest.mark.gpu

CHECK_RICH = """
def check_rich(op, strided):
    torch.manual_seed(7)
    a = torch.randn(53, 37, device="cuda").t() if strided else torch.randn(37, 53, device="cuda")
    acc = torch.randn(37, dtype=torch.float64, device="cuda")
    acc0 = acc.clone()
    out, counts, rowmax = op(a, acc, 0.75, 3, False)
    torch.cuda.synchronize()
    v = a * 0.75
    torch.testing.assert_close(out, -v, rtol=0, atol=0)
    torch.testing.assert_close(acc, acc0 + v.double().sum(1))
    expected_counts = torch.zeros(37 * 3 + 1, dtype=torch.int32, device="cuda")
    expected_counts[0:37 * 3:3] = a.shape[1]
    assert torch.equal(counts, expected_counts)
    torch.testing.assert_close(rowmax, torch.clamp(v.amax(1), min=-1.5), rtol=0, atol=0)
"""


def device_arch() -> str:
    return "sm_%d%d" % torch.cuda.get_device_capability()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("artifacts")
    rich, copy = make_rich(), make_copy()
    scale, _ = make_scale_pair()
    paths = {
        "rich": pnex.save(rich, folder / "rich.pnex"),
        "copy": pnex.save(copy, folder / "copy.pnex"),
        "scale": pnex.save(scale, folder / "scale.pnex"),
    }
    # The same kernels without a cubin for this GPU: they must take the PTX path.
    others = tuple(a for a in DEFAULT_ARCHS if a != device_arch())
    paths["rich_ptx"] = pnex.save(rich, folder / "rich_ptx.pnex", archs=others)
    return paths


@pytest.mark.parametrize("launcher", ["native", "driver"])
def test_loaded_op_runs_in_a_fresh_process_without_the_compiler_stack(artifacts, pnex_env, launcher):
    native.load_launcher()  # built (and its build recorded) by now
    env = {**pnex_env, "PNEX_LAUNCHER": launcher}
    result = run_blocked(
        CHECK_RICH
        + textwrap.dedent(f"""
        import torch
        import torch.utils.cpp_extension as cpp_extension

        def no_build(*args, **kwargs):
            raise AssertionError("the launcher was built, not imported")

        cpp_extension.load = no_build  # a recorded build is imported as it is
        import pnex_magic as pnex
        op = pnex.load({str(artifacts['rich'])!r})
        assert op._native == ({launcher!r} == "native")
        check_rich(op, strided=False)
        check_rich(op, strided=True)
        print("BLOCKED", imported_blocked())
        """),
        env,
    )
    assert "BLOCKED []" in result.stdout
    assert "no cubin" not in result.stderr


def test_loaded_op_in_cuda_graphs_and_torch_compile(artifacts, pnex_env):
    result = run_blocked(
        f"""
        import torch
        import pnex_magic as pnex
        op = pnex.load({str(artifacts['copy'])!r})
        x = torch.randn(3000, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op(x)  # loads the module before capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = op(x)
        x.copy_(torch.randn(3000, device="cuda"))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, x)

        f = torch.compile(lambda t: op(t * 2) + 1, fullgraph=True)
        z = torch.randn(4097, device="cuda")
        torch.testing.assert_close(f(z), z * 2 + 1)
        print("BLOCKED", imported_blocked())
        """,
        pnex_env,
    )
    assert "BLOCKED []" in result.stdout


def test_loaded_op_differentiates_through_its_saved_backward(artifacts, pnex_env):
    result = run_blocked(
        f"""
        import torch
        import pnex_magic as pnex
        op = pnex.load({str(artifacts['scale'])!r})
        x = torch.randn(1000, dtype=torch.float64, device="cuda", requires_grad=True)
        w = torch.randn(1000, dtype=torch.float64, device="cuda", requires_grad=True)
        gy, gz = torch.randn(2, 1000, dtype=torch.float64, device="cuda")
        y, z = op(x, w, 0.5)
        torch.testing.assert_close(y, x.detach() * w.detach() + 0.5)
        torch.testing.assert_close(z, x.detach() * x.detach())
        gx, gw = torch.autograd.grad((y, z), (x, w), (gy, gz))
        torch.testing.assert_close(gx, w.detach() * gy + 2 * x.detach() * gz)
        torch.testing.assert_close(gw, x.detach() * gy)
        print("BLOCKED", imported_blocked())
        """,
        pnex_env,
    )
    assert "BLOCKED []" in result.stdout


AOTI_CONTROL_COMPILE = """
import sys, torch

class Plain(torch.nn.Module):  # no pnex op
    def forward(self, x):
        return x * 2 + 1

x = torch.randn(1000, device="cuda")
ep = torch.export.export(Plain(), (x,))
torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[1])
print("PACKAGED")
"""

AOTI_CONTROL_RUN = """
import sys, torch

runner = torch._inductor.aoti_load_package(sys.argv[1])
x = torch.randn(1000, device="cuda")
torch.testing.assert_close(runner(x), x * 2 + 1)
print("CONTROL OK")
"""


def _aoti_control_crash(tmp_path, env) -> str | None:
    """Package a plain model (``x * 2 + 1``, no pnex op) in a fresh process and run it in
    another, as the pnex test does with its model.  Returns why the pnex test would measure
    torch's environment when that crashes (a signal), else None; fails if it errs otherwise."""
    import signal
    import subprocess
    import sys

    package = tmp_path / "plain.pt2"
    for stage, script in (("compile and package", AOTI_CONTROL_COMPILE), ("load and run", AOTI_CONTROL_RUN)):
        run = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-u", "-c", script, str(package)],
            env=env, capture_output=True, text=True, timeout=600,
        )
        if run.returncode < 0:  # killed by a signal: a crash inside torch, not a Python error
            frames = [line.strip() for line in run.stderr.splitlines() if line.strip().startswith("File ")]
            where = f" at {frames[0].rsplit(' in ', 1)[-1]}" if frames else ""
            return (
                f"torch's AOTInductor crashes here without pnex: the control, a plain model with no pnex op "
                f"(x * 2 + 1), died with {signal.Signals(-run.returncode).name}{where} ({stage} in a fresh process, "
                f"torch {torch.__version__}); the pnex test would measure torch's environment, not pnex"
            )
        assert run.returncode == 0, f"the AOTInductor control failed to {stage} ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    return None


def test_aot_inductor_package_runs_in_a_fresh_process_after_load(tmp_path, pnex_env):
    crash = _aoti_control_crash(tmp_path, pnex_env)
    if crash:
        pytest.skip(crash)
    rich = make_rich()

    class Model(torch.nn.Module):
        def forward(self, a, acc):
            out, counts, rowmax = rich(a, acc, 0.5, 2, True)
            return torch.relu(out) + 1, counts.float().sum(), rowmax * 2

    a = torch.randn(29, 41, device="cuda")
    acc = torch.randn(29, dtype=torch.float64, device="cuda")
    acc_after = acc.clone()
    expected = Model()(a, acc_after)  # eager; acc_after is updated in place
    ep = torch.export.export(Model(), (a, acc.clone()))
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "model.pt2"))
    artifact = pnex.save(rich, tmp_path / "rich.pnex", archs=(device_arch(),))
    io = {"a": a.cpu(), "acc": acc.cpu(), "acc_after": acc_after.cpu(), "expected": [t.cpu() for t in expected]}
    torch.save(io, tmp_path / "io.pt")
    result = run_blocked(
        f"""
        import torch
        import pnex_magic as pnex
        pnex.load({str(artifact)!r})
        print("loaded the artifact")
        runner = torch._inductor.aoti_load_package({str(package)!r})
        print("loaded the package")
        io = torch.load({str(tmp_path / "io.pt")!r})
        acc = io["acc"].cuda()
        outputs = runner(io["a"].cuda(), acc)
        torch.cuda.synchronize()
        print("ran the package")
        for got, want in zip(outputs, io["expected"]):
            torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(acc.cpu(), io["acc_after"])  # the InMut argument, updated in place
        print("AOTI OK", len(outputs), "BLOCKED", imported_blocked())
        """,
        pnex_env,
    )
    assert "AOTI OK 3 BLOCKED []" in result.stdout


def test_an_artifact_without_this_gpus_cubin_runs_its_ptx(artifacts, pnex_env):
    arch = device_arch()
    script = (
        CHECK_RICH
        + textwrap.dedent(f"""
        import torch
        import pnex_magic as pnex
        op = pnex.load({str(artifacts['rich_ptx'])!r})
        assert {arch!r} not in op.definition.archs
        try:
            check_rich(op, strided=False)
            check_rich(op, strided=True)
            print("RAN")
        except pnex.KernelLaunchError as exc:
            print("REFUSED", exc)
        print("BLOCKED", imported_blocked())
        """)
    )
    if importlib.util.find_spec("cuda.bindings.nvjitlink") is not None:
        linked = run_blocked(script, pnex_env, block_nvjitlink=False)
        assert "RAN" in linked.stdout and "BLOCKED []" in linked.stdout
        said = [line for line in linked.stderr.splitlines() if "no cubin" in line]
        assert len(said) == 1 and f"architecture, {arch}" in said[0] and "linked into a cubin by nvJitLink" in said[0]
    jit = run_blocked(script, pnex_env)
    said = [line for line in jit.stderr.splitlines() if "no cubin" in line]
    assert len(said) == 1 and "compiled by the CUDA driver" in said[0]
    # The driver compiles PTX up to its own CUDA version: newer PTX is refused, with what to do.
    assert "RAN" in jit.stdout or "driver compiled the kernel's PTX and could not" in jit.stdout, jit.stdout
