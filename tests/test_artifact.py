"""Saved artifacts on CPU: pnex.save for several GPU architectures without a GPU, the
file's contents, pnex.load in a fresh process that cannot import Numba, NVVM or
nvJitLink (schema, fake implementation under torch.compile and torch.export, the
saved backward's wiring), the PTX fallback, the errors for files that are not
usable artifacts and for ops that cannot be saved, and %pnex_save.

A loaded op has no Python source, so on CPU it cannot run (the simulator needs the
source): what runs here is everything short of a launch.  tests/test_artifact_gpu.py
runs loaded ops on a GPU.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from numba import cuda
from torch._subclasses.fake_tensor import FakeTensorMode

import pnex_magic as pnex
from pnex_magic import autograd
from pnex_magic.artifact import SavedKernel
from pnex_magic.artifact.archive import FORMAT_VERSION
from pnex_magic.errors import ArgumentShapeError, ArtifactError, KernelDefinitionError, KernelLaunchError
from pnex_magic.launch.description import describe_launch
from pnex_magic.linking import has_external_calls, link_cubin

from artifact_kernels import make_copy, make_rich, make_scale_pair
from blocked_imports import run_blocked


def manifest_of(path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("manifest.json"))


def cubin_sm(cubin: bytes) -> int:
    """The SM version an ELF cubin was built for (byte 1 of e_flags)."""
    assert cubin[:4] == b"\x7fELF"
    return (struct.unpack_from("<I", cubin, 48)[0] >> 8) & 0xFF


# --------------------------------------------------------------------------- saving


def test_save_ships_a_cubin_per_architecture_and_layout_and_the_ptx(tmp_path):
    op = make_copy()
    path = pnex.save(op, tmp_path / "copy.pnex")
    manifest = manifest_of(path)
    assert manifest["format_version"] == FORMAT_VERSION and manifest["archs"] == list(pnex.artifact.DEFAULT_ARCHS)
    (entry,) = manifest["ops"]
    assert entry["op_name"] == op.definition.op_name and manifest["op"] == entry["op_name"]
    with zipfile.ZipFile(path) as zf:
        for layout in ("C", "A"):
            images = entry["layouts"][layout]
            assert images["ptx_arch"] == "sm_75"
            ptx = zf.read(images["ptx"]).decode()
            assert ".target sm_75" in ptx and f".entry {images['entry']}(" in ptx
            sms = {arch: cubin_sm(zf.read(name)) for arch, name in images["cubins"].items()}
            assert sms == {"sm_75": 75, "sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_100": 100}
        # The strided variant is another program (it reads strides); both are there.
        assert zf.read(entry["layouts"]["C"]["ptx"]) != zf.read(entry["layouts"]["A"]["ptx"])


def test_round_trip_of_an_op_with_inmut_scalars_and_several_outputs(tmp_path):
    op = make_rich()
    a, acc = torch.randn(5, 7), torch.randn(5, dtype=torch.float64)
    expected = op(a, acc.clone(), 0.5, 2, True)  # through the simulator, before loading replaces the op
    with pytest.raises(ArgumentShapeError) as before:
        op(a, torch.zeros(4, dtype=torch.float64), 0.5, 2, True)

    path = pnex.save(op, tmp_path / "rich.pnex", archs=("sm_90", "sm_75", "sm_80", "sm_90"))
    manifest = manifest_of(path)
    assert manifest["archs"] == ["sm_75", "sm_80", "sm_90"]
    entry = manifest["ops"][0]
    assert entry["schema"] == op.spec.schema
    assert "Tensor(acc!) acc" in entry["schema"] and entry["schema"].endswith("-> (Tensor, Tensor, Tensor)")
    assert entry["spec"]["params"] == [
        {"name": "a", "role": "in", "dtype": "float32", "shape": [None, None], "init": None},
        {"name": "acc", "role": "inmut", "dtype": "float64", "shape": ["a.size(0)"], "init": None},
        {"name": "scale", "role": "scalar", "dtype": "float32"},
        {"name": "k", "role": "scalar", "dtype": "int64"},
        {"name": "skip", "role": "unused"},
        {"name": "flag", "role": "scalar", "dtype": "bool"},
        {"name": "out", "role": "out", "dtype": "float32", "shape": ["a.size(0)", "a.size(1)"], "init": None},
        {"name": "counts", "role": "out", "dtype": "int32", "shape": ["a.size(0) * k + 1"], "init": 0},
        {"name": "rowmax", "role": "out", "dtype": "float32", "shape": ["max(a.size(0), 1)"], "init": -1.5},
    ]
    assert entry["spec"]["n_threads"] == ["a.size(1)", "a.size(0)"] and entry["spec"]["threads_per_block"] == [8, 4]
    assert entry["launch"] == json.loads(json.dumps(describe_launch(op.spec)))
    assert entry["backward"] is None

    loaded = pnex.load(path)
    assert isinstance(loaded._pnex, SavedKernel) and loaded._pnex.archs == ("sm_75", "sm_80", "sm_90")
    assert loaded.spec == op.spec  # every expression tree parsed back to the same thing
    assert loaded._qualname == op._qualname and str(loaded._opoverload._schema) == str(op._opoverload._schema)
    with FakeTensorMode():
        outs = loaded(torch.empty(5, 7), torch.empty(5, dtype=torch.float64), 0.5, 2, True)
    assert [(o.shape, o.dtype) for o in outs] == [(e.shape, e.dtype) for e in expected]
    with pytest.raises(ArgumentShapeError) as after:  # the same checks, the same words
        loaded(a, torch.zeros(4, dtype=torch.float64), 0.5, 2, True)
    assert str(after.value) == str(before.value)
    with pytest.raises(KernelLaunchError, match="loaded from a saved artifact.*pass CUDA tensors"):
        loaded(a, acc, 0.5, 2, True)
    with pytest.raises(KernelDefinitionError, match="loaded from .*rich.pnex.*Python source"):
        pnex.inspect(loaded)
    with pytest.raises(ArtifactError, match="it was loaded from .*rich.pnex; copy that file"):
        pnex.save(loaded, tmp_path / "again.pnex")


def test_saved_backward_is_attached_again_with_the_same_wiring(tmp_path):
    scale, scale_backward = make_scale_pair()
    path = pnex.save(scale, tmp_path / "scale.pnex", archs=("sm_80",))
    manifest = manifest_of(path)
    fwd, bwd = manifest["ops"]
    assert fwd["backward"] == scale_backward.definition.op_name == bwd["op_name"] and bwd["backward"] is None
    assert bwd["spec"]["params"][0] == {"name": "grad_y", "role": "in", "dtype": "float64", "shape": [None], "init": None}

    loaded = pnex.load(path)
    attached = autograd.attached_backward(loaded)
    assert attached is not None and not attached.custom_context
    assert attached.backward.spec == scale_backward.spec and isinstance(attached.backward._pnex, SavedKernel)
    with FakeTensorMode():  # autograd runs the forward and the backward op's fake implementations
        x = torch.empty(6, dtype=torch.float64, requires_grad=True)
        w = torch.empty(6, dtype=torch.float64, requires_grad=True)
        y, z = loaded(x, w, 2.0)
        (y.sum() + z.sum()).backward()
        assert x.grad.shape == (6,) and w.grad.shape == (6,) and x.grad.dtype == torch.float64


def test_ptx_of_a_kernel_that_calls_external_functions_is_linked_self_contained(tmp_path):
    # Numba implements float16 multiplication for sm_80 as a call to a CUDA C++ helper.
    @pnex.jit(n_threads="a.numel()", arch="sm_80")
    def half_axpy(a: pnex.In("f16", (None,)), b: pnex.In("f16", "a"), c: "f16", out: pnex.Out("f16", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * c + b[i]

    assert has_external_calls(half_axpy.definition.compiled("sm_80").ptx)
    path = pnex.save(half_axpy, tmp_path / "half.pnex", archs=("sm_80", "sm_90"))
    images = manifest_of(path)["ops"][0]["layouts"]["C"]
    with zipfile.ZipFile(path) as zf:
        ptx = zf.read(images["ptx"]).decode()
        assert not has_external_calls(ptx) and f".entry {images['entry']}(" in ptx
        assert [cubin_sm(zf.read(images["cubins"][a])) for a in ("sm_80", "sm_90")] == [80, 90]
    cubin, _ = link_cubin(ptx, "sm_86", None, "half_axpy")  # what the fallback does for a GPU without a cubin
    assert cubin_sm(cubin) == 86


def test_kernel_image_falls_back_to_the_ptx_and_says_so_once(tmp_path, monkeypatch, caplog):
    op = make_copy()
    loaded = pnex.load(pnex.save(op, tmp_path / "copy.pnex", archs=("sm_75", "sm_90")))
    kernel = loaded._pnex
    image, entry = kernel.kernel_image("sm_90", "A")
    assert cubin_sm(image) == 90 and entry == manifest_of(tmp_path / "copy.pnex")["ops"][0]["layouts"]["A"]["entry"]
    with caplog.at_level(logging.WARNING, logger="pnex_magic.artifact.kernel"):
        image, _ = kernel.kernel_image("sm_86", "C")
        kernel.kernel_image("sm_86", "A")
    assert cubin_sm(image) == 86
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "no cubin for this GPU's architecture, sm_86 (it has sm_75, sm_90)" in messages[0]
    assert "linked into a cubin by nvJitLink" in messages[0]

    import importlib

    real_import = importlib.import_module

    def no_nvjitlink(name, *args):
        if "nvjitlink" in name:
            raise ImportError("no nvJitLink here")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_nvjitlink)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pnex_magic.artifact.kernel"):
        image, entry = kernel.kernel_image("sm_89", "C")
    assert image.endswith(b"\0") and b".target sm_75" in image and f".entry {entry}(".encode() in image
    assert "compiled by the CUDA driver (nvJitLink is not usable here: no nvJitLink here)" in caplog.text
    with pytest.raises(KernelLaunchError, match=r"has code for sm_75, sm_90 .*this GPU is sm_70: save it again"):
        kernel.kernel_image("sm_70", "C")


# --------------------------------------------------------------------------- a fresh process


def test_load_in_a_process_without_numba_nvvm_or_nvjitlink(tmp_path, pnex_env):
    op = make_rich()
    path = pnex.save(op, tmp_path / "rich.pnex", archs=("sm_75", "sm_90"))
    schema = f"pnex::{op.definition.op_name}{op.spec.schema}"

    class Model(torch.nn.Module):
        def forward(self, a, acc):
            out, counts, rowmax = op(a, acc, 0.5, 3, True)
            return out * 2, counts, rowmax

    # An ExportedProgram made here, loaded in the fresh process after pnex.load.
    n = torch.export.Dim("n")
    ep = torch.export.export(
        Model(), (torch.randn(4, 6), torch.zeros(4, dtype=torch.float64)), dynamic_shapes=({0: n}, {0: n})
    )
    torch.export.save(ep, tmp_path / "model.pt2")
    result = run_blocked(
        f"""
        import json, time
        import torch
        start = time.perf_counter()
        import pnex_magic as pnex
        op = pnex.load({str(path)!r})
        report = {{"schema": str(op._opoverload._schema), "blocked": imported_blocked()}}
        import sys
        report["compile_stage"] = [m for m in ("pnex_magic.compiler", "pnex_magic.report") if m in sys.modules]

        ep = torch.export.load({str(tmp_path / "model.pt2")!r})
        node = next(n for n in ep.graph.nodes if n.op == "call_function" and "pnex" in str(n.target))
        report["exported_shapes"] = [str(tuple(v.shape)) for v in node.meta["val"]]
        n = torch.export.Dim("n")
        again = torch.export.export(
            ep.module(), (torch.randn(3, 6), torch.zeros(3, dtype=torch.float64)), dynamic_shapes=({{0: n}}, {{0: n}})
        )
        report["reexported"] = sum("pnex" in str(node.target) for node in again.graph.nodes)

        graphs = []
        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward
        f = torch.compile(lambda a, acc: op(a, acc, 0.5, 2, True), backend=backend, fullgraph=True, dynamic=True)
        try:
            f(torch.randn(4, 6), torch.zeros(4, dtype=torch.float64))
        except pnex.KernelLaunchError as exc:
            report["cpu_call"] = str(exc)
        report["traced"] = sum("pnex" in str(node.target) for node in graphs[0].graph.nodes)
        report["blocked_after"] = imported_blocked()
        print("REPORT", json.dumps(report))
        """,
        pnex_env,
    )
    report = json.loads(result.stdout.split("REPORT ", 1)[1])
    assert report["schema"] == schema
    assert report["blocked"] == [] and report["blocked_after"] == []
    assert report["compile_stage"] == []  # loading imports no compile stage (nor the report)
    # The fake implementation's shape rules, on the symbolic batch size s: (s, 6), (3 * s + 1,), (max(s, 1),)
    out, counts, rowmax = report["exported_shapes"]
    symbol = re.fullmatch(r"\((s\d+), 6\)", out).group(1)
    assert counts == f"(3*{symbol} + 1,)" and rowmax in (f"(Max(1, {symbol}),)", f"({symbol},)")
    assert report["reexported"] == 1 and report["traced"] == 1
    assert "has no Python source here" in report["cpu_call"]


def test_saved_backward_wiring_in_a_fresh_process(tmp_path, pnex_env):
    scale, scale_backward = make_scale_pair()
    path = pnex.save(scale, tmp_path / "scale.pnex", archs=("sm_80",))
    result = run_blocked(
        f"""
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        import pnex_magic as pnex
        op = pnex.load({str(path)!r})
        backward = pnex.autograd.attached_backward(op).backward
        with FakeTensorMode():
            x = torch.empty(6, dtype=torch.float64, requires_grad=True)
            w = torch.empty(6, dtype=torch.float64, requires_grad=True)
            y, z = op(x, w, 2.0)
            (y.sum() + z.sum()).backward()
            print("GRADS", tuple(x.grad.shape), tuple(w.grad.shape))
        print("BACKWARD", backward.definition.op_name, backward.spec.python_signature())
        print("BLOCKED", imported_blocked())
        """,
        pnex_env,
    )
    assert "GRADS (6,) (6,)" in result.stdout
    assert f"BACKWARD {scale_backward.definition.op_name} {scale_backward.spec.python_signature()}" in result.stdout
    assert "BLOCKED []" in result.stdout


# --------------------------------------------------------------------------- what cannot be saved


def test_python_autograd_formulas_cannot_be_saved(tmp_path):
    scale, scale_backward = make_scale_pair()
    pnex.attach_backward(scale, scale_backward, setup_context=lambda ctx, inputs, output: None)
    with pytest.raises(ArtifactError, match=r"cannot save 'scale': its backward op 'scale_backward' was attached with a custom setup_context"):
        pnex.save(scale, tmp_path / "x.pnex")
    scale.register_autograd(lambda ctx, grad: (grad, None, None), setup_context=lambda ctx, inputs, output: None)
    with pytest.raises(ArtifactError, match=r"registered with register_autograd\(\), which is Python code"):
        pnex.save(scale, tmp_path / "x.pnex")
    with pytest.raises(ArtifactError, match="saves an op made by pnex.jit"):
        pnex.save(lambda x: x, tmp_path / "x.pnex")
    with pytest.raises(KernelDefinitionError, match="unknown GPU architecture 'sm_9x'"):
        pnex.save(make_copy(), tmp_path / "x.pnex", archs=("sm_80", "sm_9x"))
    with pytest.raises(KernelDefinitionError, match="archs is empty"):
        pnex.save(make_copy(), tmp_path / "x.pnex", archs=())
    assert not (tmp_path / "x.pnex").exists() and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- files that are not usable artifacts


@pytest.fixture(scope="module")
def good_artifact(tmp_path_factory):
    path = tmp_path_factory.mktemp("artifact") / "copy.pnex"
    pnex.save(make_copy(), path, archs=("sm_80", "sm_90"))
    return path.read_bytes()


def rewrite(data: bytes, change) -> bytes:
    """The artifact with ``change(name, content) -> content or None (drop)`` applied."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            content = change(name, src.read(name))
            if content is not None:
                dst.writestr(name, content)
    return out.getvalue()


def edit_manifest(data: bytes, edit) -> bytes:
    def change(name, content):
        if name != "manifest.json":
            return content
        manifest = json.loads(content)
        edit(manifest)
        return json.dumps(manifest)

    return rewrite(data, change)


def _spec(m):
    return m["ops"][0]["spec"]


CORRUPTIONS = {
    "empty file": (lambda d: b"", "not a zip file"),
    "not a zip": (lambda d: b"PK\x03\x04 but not really" * 10, "not a zip file"),
    "manifest is not JSON": (lambda d: rewrite(d, lambda n, c: b"{oops" if n == "manifest.json" else c), "not valid JSON"),
    "no manifest": (lambda d: rewrite(d, lambda n, c: None if n == "manifest.json" else c), "no 'manifest.json'"),
    "another format": (lambda d: edit_manifest(d, lambda m: m.update(format="zip of cats")), "not a pnex artifact manifest"),
    "a missing cubin": (lambda d: rewrite(d, lambda n, c: None if n.endswith("sm_90.cubin") else c), "sm_90.cubin.*truncated"),
    "an altered cubin": (
        lambda d: rewrite(d, lambda n, c: c[:100] + b"X" + c[101:] if n.endswith("C/sm_80.cubin") else c),
        "does not match its checksum",
    ),
    "an unparsable shape": (
        lambda d: edit_manifest(d, lambda m: _spec(m)["params"][1].update(shape=["__import__('os').system('x')"])),
        r"op 'copy1d_\w+' is malformed.*not allowed",
    ),
    "an unknown dtype": (lambda d: edit_manifest(d, lambda m: _spec(m)["params"][0].update(dtype="float128")), "unknown dtype 'float128'"),
    "a schema that does not match": (
        lambda d: edit_manifest(d, lambda m: _spec(m)["params"][0].update(role="inmut")),
        "its spec gives the schema",
    ),
    "a launch description that does not match": (
        lambda d: edit_manifest(d, lambda m: _spec(m).update(threads_per_block=[128])),
        "does not give the saved launch description",
    ),
    "a bad parameter name": (
        lambda d: edit_manifest(d, lambda m: _spec(m)["params"][0].update(name="a) -> Tensor; x")),
        "not a Python identifier",
    ),
    "a may_alias on an In": (
        lambda d: edit_manifest(d, lambda m: _spec(m)["params"][0].update(may_alias=["out"])),
        r"parameter 'a': may_alias is \['out'\]",
    ),
    "no ops": (lambda d: edit_manifest(d, lambda m: m.update(ops=[])), "lists no ops"),
    "a missing backward": (lambda d: edit_manifest(d, lambda m: m["ops"][0].update(backward="ghost")), "backward op 'ghost'"),
}


def test_a_format_1_artifact_still_loads(good_artifact, tmp_path):
    """Format 1 manifests predate the InMut memory checks in the launch description."""

    def older(m):
        m["format_version"] = 1
        for op in m["ops"]:
            del op["launch"]["internal_overlap"], op["launch"]["overlap"]

    path = tmp_path / "v1.pnex"
    path.write_bytes(edit_manifest(good_artifact, older))
    loaded = pnex.load(path)
    with FakeTensorMode():
        assert loaded(torch.empty(6)).shape == (6,)


def test_round_trip_keeps_scalar_defaults_and_may_alias(tmp_path):
    @pnex.jit(n_threads="a.numel()")
    def saved_axpy(
        a: pnex.In("f32", (None,)), acc: pnex.InMut("f32", "a", may_alias="a"), s: float = 0.5, n: int = 2
    ):
        i = cuda.grid(1)
        if i < a.shape[0]:
            acc[i] += a[i] * s + n

    path = pnex.save(saved_axpy, tmp_path / "axpy.pnex", archs=("sm_80",))
    params = manifest_of(path)["ops"][0]["spec"]["params"]
    assert params[1]["may_alias"] == ["a"] and params[2]["default"] == 0.5 and params[3]["default"] == 2
    assert "default" not in params[0] and "may_alias" not in params[0]
    loaded = pnex.load(path)
    assert loaded.spec == saved_axpy.spec
    assert str(loaded._opoverload._schema).endswith("(Tensor a, Tensor(acc!) acc, float s=0.5, int n=2) -> ()")
    with FakeTensorMode():
        a = torch.empty(4)
        loaded(a, a)  # defaults filled in; the aliasing is declared
        with pytest.raises(ArgumentShapeError, match="more than one of its elements refers to a single memory"):
            loaded(a, torch.empty(1).expand(4))


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_damaged_artifacts_give_one_clear_error(case, good_artifact, tmp_path):
    damage, message = CORRUPTIONS[case]
    path = tmp_path / "damaged.pnex"
    path.write_bytes(damage(good_artifact))
    with pytest.raises(ArtifactError, match=message):
        pnex.load(path)


def test_truncated_artifacts_give_one_clear_error(good_artifact, tmp_path):
    path = tmp_path / "cut.pnex"
    for cut in range(0, len(good_artifact), max(1, len(good_artifact) // 40)):
        path.write_bytes(good_artifact[:cut])
        with pytest.raises(ArtifactError, match="is not a usable pnex artifact"):
            pnex.load(path)
    # A flipped byte anywhere either hits something zip, the checksums or the manifest's
    # checks catch, or something nothing reads (a time stamp in a local header).
    flipped, refused = bytearray(good_artifact), 0
    for offset in range(0, len(flipped), max(1, len(flipped) // 60)):
        flipped[offset] ^= 0xFF
        path.write_bytes(bytes(flipped))
        try:
            pnex.load(path)
        except ArtifactError:
            refused += 1
        flipped[offset] ^= 0xFF
    assert refused >= 50


def test_newer_format_and_missing_files_are_named(good_artifact, tmp_path):
    path = tmp_path / "future.pnex"

    def future(m):
        m.update(format_version=FORMAT_VERSION + 1, pnex_magic="9.0.0")

    path.write_bytes(edit_manifest(good_artifact, future))
    with pytest.raises(
        ArtifactError,
        match=rf"is in pnex artifact format version {FORMAT_VERSION + 1} \(written by pnex_magic 9.0.0\), but this "
        rf"pnex_magic \({pnex.__version__}\) reads format version {FORMAT_VERSION} and older: upgrade",
    ):
        pnex.load(path)
    with pytest.raises(ArtifactError, match="no such artifact file"):
        pnex.load(tmp_path / "nothing.pnex")
    with pytest.raises(ArtifactError, match="it is a folder"):
        pnex.load(tmp_path)


# --------------------------------------------------------------------------- the expected digest


def test_load_with_the_files_sha256_registers_it(good_artifact, tmp_path):
    path = tmp_path / "trusted.pnex"
    path.write_bytes(good_artifact)
    digest = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    for given in (digest, digest.upper(), f" {digest}\n"):
        loaded = pnex.load(path, sha256=given)
        with FakeTensorMode():
            assert loaded(torch.empty(6)).shape == (6,)


def test_load_refuses_a_file_whose_sha256_differs(good_artifact, tmp_path):
    original = make_copy()
    path = tmp_path / "swapped.pnex"
    trusted = hashlib.sha256(good_artifact).hexdigest()
    for changed in (  # another op's intact artifact, a damaged one, one byte flipped
        pnex.save(make_rich(), tmp_path / "rich.pnex", archs=("sm_80",)).read_bytes(),
        good_artifact[: len(good_artifact) // 2],
        good_artifact[:-1] + bytes([good_artifact[-1] ^ 1]),
    ):
        path.write_bytes(changed)
        actual = hashlib.sha256(changed).hexdigest()
        with pytest.raises(ArtifactError, match=rf"swapped.pnex: its SHA-256 is {actual}, not the expected {trusted}"):
            pnex.load(path, sha256=trusted)
    x = torch.randn(6)  # still the op defined here (a loaded one cannot run on CPU): nothing was registered
    torch.testing.assert_close(getattr(torch.ops.pnex, original.definition.op_name)(x), x)


@pytest.mark.parametrize("given", ["abc", "g" * 64, 12345, b"0" * 64], ids=["short", "not-hex", "int", "bytes"])
def test_load_names_a_malformed_sha256(good_artifact, tmp_path, given):
    path = tmp_path / "copy.pnex"
    path.write_bytes(good_artifact)
    with pytest.raises(ArtifactError, match=r"pnex.load\(sha256=...\) takes the file's SHA-256 as 64 hexadecimal digits"):
        pnex.load(path, sha256=given)


# --------------------------------------------------------------------------- %pnex_save and the launcher's build record


def test_pnex_save_magic(tmp_path, pnex_env):
    pytest.importorskip("IPython")
    target = tmp_path / "magic copy.pnex"
    code = textwrap.dedent(
        f"""
        import json, zipfile
        from IPython.core.error import UsageError
        from artifact_kernels import make_copy
        get_ipython().run_line_magic("load_ext", "pnex_magic")
        copy_op, not_an_op = make_copy(), 3
        %pnex_save copy_op "{target}" --archs sm_80,sm_90
        print("ARCHS", json.loads(zipfile.ZipFile("{target}").read("manifest.json"))["archs"])
        for line in ("not_an_op '{target}'", "copy_op '{target}' --archs sm_x"):
            try:
                get_ipython().run_line_magic("pnex_save", line)
            except UsageError as exc:
                print("USAGE", exc)
        """
    )
    script = tmp_path / "save_magic.ipy"
    script.write_text(code)
    ipython = [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "--HistoryManager.enabled=False"]
    done = subprocess.run(
        ipython + [str(script)], capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent, env=pnex_env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(rf"pnex: saved copy_op \(pnex::copy1d_\w+\) to {re.escape(str(target))}, \d+ bytes", done.stdout)
    assert "ARCHS ['sm_80', 'sm_90']" in done.stdout
    assert "USAGE %pnex_save: 'not_an_op' is of type int; give the name of a pnex op" in done.stdout
    assert "USAGE %pnex_save --archs: unknown GPU architecture 'sm_x'" in done.stdout


def test_a_recorded_build_is_imported_without_cpp_extension(tmp_path, pnex_env):
    # A small extension module that is always installed stands in for the launcher; in a
    # subprocess, so that this one never holds two copies of it.
    run_blocked(
        f"""
        import importlib.util, os, shutil
        from pathlib import Path
        from pnex_magic.launch import build

        folder = Path({str(tmp_path)!r})
        library = folder / "_operand_flag_tests.so"
        shutil.copy(importlib.util.find_spec("numpy._core._operand_flag_tests").origin, library)
        assert build.import_built("_operand_flag_tests", folder) is None  # no record: build it
        build.record_build("_operand_flag_tests", folder)
        module = build.import_built("_operand_flag_tests", folder)
        assert module is not None and module.__file__ == str(library) and hasattr(module, "inplace_add")
        stat = library.stat()
        os.utime(library, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # rebuilt since the record: build again
        assert build.import_built("_operand_flag_tests", folder) is None
        """,
        pnex_env,
    )


# --------------------------------------------------------------------------- AOTInductor


@pytest.mark.slow
def test_aot_inductor_package_of_a_model_calling_a_pnex_op_runs_on_cpu(tmp_path):
    # The op defined in this process (the simulator runs it); the GPU test runs a package
    # after pnex.load in a fresh process.
    rich = make_rich()

    class Model(torch.nn.Module):
        def forward(self, a, acc):
            out, counts, rowmax = rich(a, acc, 0.5, 2, True)
            return torch.relu(out) + 1, counts.float().sum(), rowmax * 2

    a = torch.randn(29, 41)
    acc = torch.randn(29, dtype=torch.float64)
    package = torch._inductor.aoti_compile_and_package(
        torch.export.export(Model(), (a, acc.clone())), package_path=str(tmp_path / "model.pt2")
    )
    runner = torch._inductor.aoti_load_package(package)
    a = torch.randn(29, 41)  # fresh inputs of the same shape
    acc = torch.randn(29, dtype=torch.float64)
    got_acc = acc.clone()
    got = runner(a, got_acc)
    v = a * 0.5  # the kernel's effect, written with torch
    expected_counts = torch.zeros(29 * 2 + 1, dtype=torch.int32)
    expected_counts[0:58:2] = 41
    torch.testing.assert_close(got[0], torch.relu(v) + 1)
    torch.testing.assert_close(got[1], expected_counts.float().sum())
    torch.testing.assert_close(got[2], torch.clamp(v.amax(1), min=-1.5) * 2)
    torch.testing.assert_close(got_acc, acc + v.double().sum(1))  # the InMut argument, updated in place
