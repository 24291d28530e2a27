"""``%%pnex --sanitize``'s back end (:mod:`pnex_magic.sanitize`): finding
compute-sanitizer, reading its output, mapping it to the kernel's Python lines, and
the child process; on a GPU, a planted out-of-bounds write and a planted
shared-memory race found at the right lines.

The recorded outputs follow compute-sanitizer's documented format (``=========``
prefix, a record's details indented, a blank ``=========`` line between records),
with the names Numba's kernels get (demangled) and the file names of their line
information (the kernel's file, or a notebook cell's).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from numba import cuda, float32

import pnex_magic as pnex
from pnex_magic import sanitize as S
from pnex_magic.errors import PnexError

FUNC = (
    "__main__::copy[abi:v1][abi:cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3CwAkMXLaJtQYkOIgxJU0gCqOkEJoHkbttqdVhoqlspQGNFHSgJ5Bn"
    "XagIAE](Array<float, 1, C, readonly, aligned>, Array<float, 1, C, mutable, aligned>)"
)

MEMCHECK = f"""\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at {FUNC}+0x1b0 in /tmp/ipykernel_2211/1733263541.py:6
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f3c7ec00400 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3c7ec00000 of size 1,024 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f3a1] in libcuda.so.1
=========         Host Frame: cuLaunchKernel [0x34b8e] in libcuda.so.1
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: cudaStreamSynchronize [0x4f6c2] in libcudart.so.13
=========
========= ERROR SUMMARY: 2 errors
"""

MEMCHECK_NO_LINEINFO = """\
========= COMPUTE-SANITIZER
pnex-sanitize: RuntimeError: CUDA error: unspecified launch failure
========= Invalid __global__ read of size 4 bytes
=========     at __main__::copy(Array<float, 1, C, readonly, aligned>)+0x90
=========     by thread (0,0,0) in block (4,0,0)
=========     Address 0x7f3c7ec01000 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at __main__::racy(Array<float, 1, C, readonly, aligned>)+0x120 in /work/kern.py:9
=========     and Read access at __main__::racy(Array<float, 1, C, readonly, aligned>)+0x1f0 in /work/kern.py:10 [248 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

RACECHECK_HAZARD = """\
========= COMPUTE-SANITIZER
========= ERROR: Potential WAW hazard detected at __shared__ 0x0 in block (0,0,0) :
=========     Write Thread (0,0,0) at __main__::racy()+0x2f0 in /work/kern.py:9
=========     Write Thread (1,0,0) at __main__::racy()+0x2f0 in /work/kern.py:9
=========     Current Value : 1, Incoming Value : 2
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

SYNCCHECK = """\
========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in block
=========     at __main__::reduce(Array<float, 1, C, mutable, aligned>)+0x11f0 in /work/kern.py:14
=========     by thread (32,0,0) in block (0,0,0)
=========
========= ERROR SUMMARY: 1 error
"""

INITCHECK = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at __main__::scan(Array<float, 1, C, readonly, aligned>)+0x70 in /work/kern.py:12
=========     by thread (31,0,0) in block (1,0,0)
=========     Address 0x7f3c7ec000fc
=========
========= ERROR SUMMARY: 1 error
"""

CLEAN = """\
========= COMPUTE-SANITIZER
pnex-sanitize: ran copy()
========= ERROR SUMMARY: 0 errors
"""


def test_memcheck_record():
    [f] = S.parse_output(MEMCHECK, "memcheck")  # the failed synchronisation that follows is dropped
    assert f.tool == "memcheck" and f.kind == "Invalid __global__ write of size 4 bytes" and f.severity == "error"
    assert f.function == FUNC
    assert (f.file, f.line) == ("/tmp/ipykernel_2211/1733263541.py", 6)
    assert (f.thread, f.block, f.address) == ((255, 0, 0), (3, 0, 0), "0x7f3c7ec00400")
    assert f.details[0] == "Address 0x7f3c7ec00400 is out of bounds"


def test_without_line_info_there_is_no_line():
    [f] = S.parse_output(MEMCHECK_NO_LINEINFO, "memcheck")
    assert f.file is None and f.line is None and f.function.startswith("__main__::copy(")
    assert f.block == (4, 0, 0)


def test_racecheck_analysis_and_hazard_records():
    [race] = S.parse_output(RACECHECK, "racecheck")
    assert race.kind == "Race reported between Write access and Read access (248 hazards)"
    assert (race.file, race.line, race.other_file, race.other_line) == ("/work/kern.py", 9, "/work/kern.py", 10)
    [hazard] = S.parse_output(RACECHECK_HAZARD, "racecheck")
    assert hazard.kind == "Potential WAW hazard at __shared__" and hazard.block == (0, 0, 0)
    assert (hazard.thread, hazard.line, hazard.other_line, hazard.address) == ((0, 0, 0), 9, 9, "0x0")


def test_synccheck_initcheck_and_clean_logs():
    [sync] = S.parse_output(SYNCCHECK, "synccheck")
    assert sync.kind.startswith("Barrier error detected") and (sync.line, sync.thread) == (14, (32, 0, 0))
    [init] = S.parse_output(INITCHECK, "initcheck")
    assert init.kind.startswith("Uninitialized __global__ memory read") and init.line == 12
    assert S.parse_output(CLEAN, "memcheck") == []
    assert S.parse_output("", "memcheck") == []


def test_findings_map_to_the_kernels_lines(tmp_path):
    kern = tmp_path / "kern.py"
    kern.write_text("\n" * 7 + "def racy(a):\n    tile[t] = a[t]\n    out[t] = tile[63 - t]\n")
    [race] = S.parse_output(RACECHECK.replace("/work/kern.py", str(kern)), "racecheck")
    mapped = S.map_to_source(race, str(kern), 8, 10)
    assert mapped.python_line == 9 and mapped.source_text == "tile[t] = a[t]"
    assert mapped.other_source_text == "out[t] = tile[63 - t]"
    assert "line 9: `tile[t] = a[t]`, and line 10: `out[t] = tile[63 - t]`" in mapped.summary()
    outside = S.map_to_source(race, str(kern), 1, 5)  # not the kernel's lines
    assert outside.python_line is None and outside.source_text is None


def test_an_inlined_frame_maps_through_its_device_frames(tmp_path):
    kern = tmp_path / "kern.py"
    kern.write_text("def k(a):\n    a[0] = 1\n")
    text = f"""\
========= Invalid __global__ write of size 4 bytes
=========     at numba::cpython::helper()+0xb0 in /site-packages/numba/helpers.py:39
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x87654320 is out of bounds
=========         Device Frame: __main__::k()+0x30 in {kern}:2
=========
"""
    [f] = S.parse_output(text, "memcheck")
    mapped = S.map_to_source(f, str(kern), 1, 2)
    assert (mapped.line, mapped.source_text) == (2, "a[0] = 1")


def test_the_report_reads_as_text_and_html():
    finding = S.Finding("memcheck", "Invalid __global__ write of size 4 bytes", line=6, thread=(1, 0, 0),
                        block=(3, 0, 0), source_text="r[i + 1] = a[i]", details=("Address 0x10 is out of bounds",))
    report = S.SanitizerReport("copy", "compute-sanitizer", ("memcheck", "initcheck"), (finding,),
                               {"memcheck": MEMCHECK}, {}, {"memcheck": 1})
    text = str(report)
    assert text.splitlines()[0] == "compute-sanitizer found 1 problem(s) in copy() (memcheck, initcheck):"
    assert "memcheck: Invalid __global__ write of size 4 bytes at line 6: `r[i + 1] = a[i]`, thread (1, 0, 0) " \
           "of block (3, 0, 0) (Address 0x10 is out of bounds)" in text
    assert "<td><code>r[i + 1] = a[i]</code></td>" in report._repr_html_() and not report.ok
    clean = S.SanitizerReport("copy", "cs", ("memcheck",), (), {}, {}, {"memcheck": 0})
    assert clean.ok and str(clean) == "compute-sanitizer found no errors in copy() (memcheck)"
    assert "no errors" in clean._repr_html_()


# ----------------------------------------------------------------------------- finding the tool


@pytest.fixture
def no_sanitizer(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(S, "_site_roots", lambda: [str(tmp_path / "site")])
    real_isfile = os.path.isfile
    monkeypatch.setattr(S.os.path, "isfile", lambda p: False if str(p).startswith("/usr/local/cuda") else real_isfile(p))
    monkeypatch.setattr(S.os, "access", lambda p, mode: False if str(p).startswith("/usr/local/cuda") else
                        os.path.exists(p) and bool(os.stat(p).st_mode & stat.S_IXUSR))
    return tmp_path


def test_missing_sanitizer_says_what_to_install(no_sanitizer):
    with pytest.raises(PnexError) as info:
        S.find_sanitizer()
    text = str(info.value)
    assert text.startswith("no compute-sanitizer was found")
    assert 'pip install "nvidia-cuda-sanitizer-api==13.*"' in text and "nvidia-cuda-sanitizer-api-cu12" in text


def test_sanitizer_on_path_and_in_cuda_home(no_sanitizer, monkeypatch):
    bin_dir = no_sanitizer / "no-cuda" / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "compute-sanitizer"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert S.find_sanitizer() == tool
    monkeypatch.setenv("PATH", str(bin_dir))
    assert S.find_sanitizer() == tool


def test_a_wheels_sanitizer_without_its_executable_bit_runs_from_a_copy(no_sanitizer, fresh_cache):
    wheel = no_sanitizer / "site" / "nvidia" / "cuda_sanitizer_api"
    (wheel / "bin").mkdir(parents=True)
    (wheel / "lib").mkdir()
    (wheel / "lib" / "libsanitizer-public.so").write_bytes(b"\0")
    tool = wheel / "bin" / "compute-sanitizer"
    tool.write_text("#!/bin/sh\necho ok\n")
    tool.chmod(0o644)  # as the cu12 wheel ships it
    found = S.find_sanitizer()
    assert found != tool and str(found).startswith(str(fresh_cache))
    assert os.access(found, os.X_OK) and (found.parent.parent / "lib" / "libsanitizer-public.so").exists()
    assert not os.access(tool, os.X_OK)  # the wheel is left as it is


# ----------------------------------------------------------------------------- the child


def _child(*args: str, env=None) -> subprocess.CompletedProcess:
    root = str(Path(__file__).resolve().parents[1])
    env = dict(env or os.environ, PYTHONPATH=root)
    return subprocess.run([sys.executable, "-m", "pnex_magic._sanitize_child", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_child_usage(tmp_path):
    done = _child()
    assert done.returncode == 2 and "folder" in done.stderr
    done = _child(str(tmp_path))
    assert done.returncode == 2 and "has no kernel.pnex or args.pt" in done.stderr
    done = _child("--help")
    assert done.returncode == 0 and "kernel.pnex and args.pt" in done.stdout


@pnex.jit(n_threads="a.numel()")
def planted_oob(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i + 1] = a[i]  # planted: one past the end in the last thread


@pnex.jit(n_threads=64, threads_per_block=64)
def planted_race(a: pnex.In("f32", (64,)), out: pnex.Out("f32", "a")):
    tile = cuda.shared.array(64, float32)
    t = cuda.threadIdx.x
    tile[t] = a[t]  # planted: no cuda.syncthreads() between this write
    out[t] = tile[63 - t]  # and this read of another thread's element


def _line(op, text: str) -> int:
    fn = op._pnex.fn
    lines, first = __import__("inspect").getsourcelines(fn)
    return first + next(k for k, line in enumerate(lines) if text in line)


def test_run_sanitizer_end_to_end_with_a_recorded_tool(monkeypatch, tmp_path):
    """Everything but the GPU: the op saved, the arguments saved, one child per tool,
    the tool's log parsed and mapped to the kernel's lines."""
    fn = planted_oob._pnex.fn
    line = _line(planted_oob, "out[i + 1] = a[i]")
    monkeypatch.setattr(S, "find_sanitizer", lambda: Path("/opt/fake/compute-sanitizer"))
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        folder = Path(argv[-1])
        assert (folder / "kernel.pnex").is_file() and (folder / "args.pt").is_file()
        log = Path(argv[argv.index("--log-file") + 1])
        tool = argv[argv.index("--tool") + 1]
        text = CLEAN if tool != "memcheck" else MEMCHECK.replace("/tmp/ipykernel_2211/1733263541.py:6",
                                                                 f"{fn.__code__.co_filename}:{line}")
        log.write_text(text)
        assert kwargs["env"]["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
        return subprocess.CompletedProcess(argv, 1 if tool == "memcheck" else 0, "", "")

    monkeypatch.setattr(S.subprocess, "run", fake_run)
    report = S.run_sanitizer(planted_oob, [torch.ones(256)], arch="sm_90")
    assert report.tools == ("memcheck", "initcheck")  # no shared memory: no racecheck, no synccheck
    assert [c[c.index("--tool") + 1] for c in calls] == ["memcheck", "initcheck"]
    assert all(c[c.index("--kernel-name") + 1].startswith("kne=_Z") for c in calls)
    [f] = report.findings
    assert (f.python_line, f.source_text) == (line, "out[i + 1] = a[i]  # planted: one past the end in the last thread")
    assert report.returncodes == {"memcheck": 1, "initcheck": 0}
    assert S.run_sanitizer(planted_race, [torch.ones(64)], arch="sm_90").tools == TOOLS_ALL


TOOLS_ALL = ("memcheck", "racecheck", "synccheck", "initcheck")


def test_run_sanitizer_refuses_bad_input(monkeypatch):
    monkeypatch.setattr(S, "find_sanitizer", lambda: Path("/opt/fake/compute-sanitizer"))
    with pytest.raises(PnexError, match="no CUDA tensor"):
        S.run_sanitizer(planted_oob, [torch.ones(4)])
    with pytest.raises(PnexError, match="unknown compute-sanitizer tool"):
        S.run_sanitizer(planted_oob, [torch.ones(4)], tools=["leakcheck"], arch="sm_90")
    with pytest.raises(PnexError, match="runs a pnex op"):
        S.run_sanitizer(lambda x: x, [torch.ones(4)], arch="sm_90")


# ----------------------------------------------------------------------------- GPU


def _needs_line_info(op):
    arch = "sm_%d%d" % torch.cuda.get_device_capability()
    if ".loc" not in op._pnex.compiled(arch).ptx:
        pytest.xfail("kernels are compiled without line information (-lineinfo): no lines to map")


@pytest.mark.gpu
def test_gpu_sanitizer_finds_the_planted_out_of_bounds_write():
    _needs_line_info(planted_oob)
    report = S.run_sanitizer(planted_oob, [torch.ones(1000, device="cuda")], tools=["memcheck"])
    assert not report.ok, report.logs
    lines = {f.python_line for f in report.findings}
    assert _line(planted_oob, "out[i + 1] = a[i]") in lines, str(report)
    assert any(f.kind.startswith("Invalid __global__ write") for f in report.findings)


@pytest.mark.gpu
def test_gpu_sanitizer_finds_the_planted_shared_memory_race():
    _needs_line_info(planted_race)
    report = S.run_sanitizer(planted_race, [torch.ones(64, device="cuda")], tools=["racecheck"])
    races = report.by_tool("racecheck")
    assert races, report.logs
    lines = {f.python_line for f in races} | {f.line for f in races if f.other_source_text} | \
        {f.other_line for f in races if f.other_source_text}
    assert {_line(planted_race, "tile[t] = a[t]"), _line(planted_race, "out[t] = tile[63 - t]")} <= lines, str(report)


@pytest.mark.gpu
def test_gpu_a_correct_kernel_is_clean_under_every_tool():
    report = S.run_sanitizer(planted_race, [torch.ones(64, device="cuda")], tools=["memcheck", "initcheck"])
    assert report.ok, str(report) + "\n" + "\n".join(report.logs.values())
