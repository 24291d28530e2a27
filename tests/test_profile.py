"""``pnex.profile`` and ``%%pnex --profile`` (issue 36) without a GPU: Nsight Compute's
CSV read back (:mod:`pnex_magic.ncu`), the figures and lines mapped to the kernel's
source, the report's Profile tab and its "why", the command line, the child process,
and the notes where nothing can be profiled.

The recorded ``ncu`` output (``tests/fixtures/ncu``) is in Nsight Compute 2022.3's CSV
layout, with made-up figures (``make_layout_fixture.py`` there says how); a recording
from a GPU (``benchmarks/profile_check.py``) goes beside it, and
:func:`test_every_recorded_fixture_reads_as_sane_figures` reads every one.
``tests/test_profile_gpu.py`` profiles real kernels.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import ncu, profiling
from pnex_magic.efficiency import UNEXPLAINED, Efficiency, Reason
from pnex_magic.errors import PnexError
from toolchain import needs_nvvm
from pnex_magic.render.profile import profile_html

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "ncu"
RAW = (FIXTURES / "gather-h100-layout-raw.csv").read_text()
SOURCE = (FIXTURES / "gather-h100-layout-source.csv").read_text()
CELL = "/tmp/ipykernel_2211/1733263541.py"  # the recorded cell's file, as its line information names it

CELL_SOURCE = '''
def gather_scale(a: In("f32", (None,)), idx: In("i64", "a"), s: Scalar("f32"), r: Out("f32", "a")):
    i = cuda.grid(1)
    if i < a.shape[0]:
        j = idx[i]
        r[i] = a[j] * s
'''
VERSION = "NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.3.1.0 (build 36398880) (public-release)\n"


@pytest.fixture(scope="module")
def gather_scale():
    """The recorded cell's kernel, compiled from the same file name and lines."""
    linecache.cache[CELL] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(True), CELL)
    ns = {"cuda": cuda, "In": pnex.In, "Scalar": pnex.Scalar, "Out": pnex.Out}
    exec(compile(CELL_SOURCE, CELL, "exec"), ns)  # noqa: S102 - a kernel whose co_filename is the recorded cell's
    return pnex.jit(n_threads="a.numel()")(ns["gather_scale"])


# --------------------------------------------------------------------------- reading ncu's CSV


def test_the_raw_page_gives_speed_of_light_occupancy_and_stalls():
    [kernel] = ncu.parse_raw(RAW)  # the ==PROF== line before the CSV is skipped
    assert kernel.name.startswith("__main__::gather_scale[abi:v1]")
    assert kernel.units["gpu__time_duration.sum"] == "msecond"
    f = ncu.figures(kernel)
    assert f.device == "NVIDIA H100 80GB HBM3" and f.duration == pytest.approx(452.192e-6)
    assert (f.memory_sol, f.compute_sol, f.dram_sol) == pytest.approx((0.71204118, 0.1438166, 0.58339142))
    assert (f.achieved_occupancy, f.theoretical_occupancy) == pytest.approx((0.82471203, 1.0))
    assert f.tensor_pipe == 0.0 and f.stall_source == "sampled warp states"
    total = 6650 + 13000 + 6500 + 47250 + 117700  # every sample of the five lines
    assert [s.name for s in f.stalls[:3]] == ["long_scoreboard", "lg_throttle", "wait"]
    assert f.stalls[0].share == pytest.approx(142000 / total) and f.issuing == pytest.approx(11100 / total)
    assert "selected" not in [s.name for s in f.stalls]
    assert f.stalls[0].meaning == "waiting for a load's data from global or local memory"


def test_without_samples_the_warp_state_statistics_rank_the_stalls():
    [kernel] = ncu.parse_raw(RAW)
    values = {k: ("0" if k.startswith("smsp__pcsamp_warps_issue_stalled") else v) for k, v in kernel.values.items()}
    f = ncu.figures(dataclasses.replace(kernel, values=values))
    assert f.stall_source == "cycles per issued instruction"
    assert [s.name for s in f.stalls[:3]] == ["long_scoreboard", "lg_throttle", "wait"]
    assert f.issuing == pytest.approx(1.0 / sum((26.90, 2.68, 2.40, 1.0, 0.51, 0.44, 0.55, 0.21, 0.14, 0.05, 0.04,
                                                 0.02, 0.01)))


def test_values_with_thousands_separators_and_missing_ones():
    assert ncu.number("1,234.5") == 1234.5 and ncu.number("-") is None and ncu.number("n/a") is None
    assert ncu.parse_raw("==ERROR== no report\n") == []


def test_the_source_page_gives_samples_per_line():
    lines = {c.line: c for c in ncu.parse_source(SOURCE)}
    assert sorted(lines) == [2, 3, 4, 5, 6] and {c.file for c in lines.values()} == {CELL}
    assert (lines[6].samples, lines[6].stalled) == (117700, 104040)
    assert lines[6].top_reason() == "long_scoreboard" and lines[2].top_reason() == "imc_miss"
    assert lines[5].reasons["lg_throttle"] == 12600  # stall_lg, by its canonical name


def test_later_versions_column_names_read_too():
    text = textwrap.dedent('''\
        ==PROF== Disconnected from process 1
        "File Path","/work/k.py"
        "Function Name","k"
        "# Line","Source","# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_long_sb (Not-issued)"
        "7","    r[i] = a[i]","-","-","1,200","1,100","1,000","950"
        "","","0x7f00","LDG.E R2, [R2.64]","600","550","500","470"
        "9","    return","-","-","-","-","-","-"
    ''')
    [line7, line9] = ncu.parse_source(text)
    assert (line7.file, line7.line, line7.samples, line7.stalled) == ("/work/k.py", 7, 1200, 1100)
    assert line7.reasons == {"long_scoreboard": 1000} and line9.samples == 0


def _fixture_pairs():
    return sorted(FIXTURES.glob("*-raw.csv"))


@pytest.mark.parametrize("raw", _fixture_pairs(), ids=lambda p: p.name)
def test_every_recorded_fixture_reads_as_sane_figures(raw):
    kernels = ncu.parse_raw(raw.read_text())
    assert kernels, raw
    for kernel in kernels:
        f = ncu.figures(kernel)
        for share in (f.memory_sol, f.compute_sol, f.achieved_occupancy, f.theoretical_occupancy):
            assert share is not None and 0.0 <= share <= 1.0, (raw.name, f)
        assert f.duration and 0 < f.duration < 10
        assert f.stalls and sum(s.share for s in f.stalls) + (f.issuing or 0) == pytest.approx(1.0)
        assert [s.share for s in f.stalls] == sorted((s.share for s in f.stalls), reverse=True)
        assert all(s.name in ncu.STALLS for s in f.stalls[:3]), f.stalls
    source = raw.with_name(raw.name.replace("-raw.csv", "-source.csv"))
    if source.exists():
        lines = ncu.parse_source(source.read_text())
        assert lines and all(c.line > 0 and c.samples >= c.stalled >= 0 for c in lines)


# --------------------------------------------------------------------------- the profile


def test_hot_lines_map_to_the_kernels_source(gather_scale):
    hot = profiling.hot_lines(ncu.parse_source(SOURCE), gather_scale._pnex.fn)
    assert [h.line for h in hot] == [6, 5, 3, 2, 4]  # most stalled samples first
    assert (hot[0].text, hot[0].reason) == ("r[i] = a[j] * s", "long_scoreboard")
    assert hot[0].share == pytest.approx(117700 / 191100) and hot[0].stalled_share == pytest.approx(104040 / 191100)
    assert profiling.hot_lines(ncu.parse_source(SOURCE.replace(CELL, "/elsewhere/other.py")), gather_scale._pnex.fn) \
        == ()


def recorded_profile(gather_scale) -> profiling.KernelProfile:
    [kernel] = ncu.parse_raw(RAW)
    return profiling.KernelProfile("gather_scale", ncu.figures(kernel),
                                   profiling.hot_lines(ncu.parse_source(SOURCE), gather_scale._pnex.fn),
                                   "/cache/profiles/gather_scale.ncu-rep", version="2025.3.1.0")


def test_the_profile_reads_as_text_html_and_a_reason(gather_scale):
    p = recorded_profile(gather_scale)
    text = str(p)
    assert "speed of light: memory 71%, compute 14%, DRAM 58%" in text
    assert "occupancy : 82% achieved, 100% theoretical" in text
    assert "stall     : long_scoreboard, 74% of samples: waiting for a load's data from global or local memory" in text
    assert "line 6    : 62% of samples, mostly long_scoreboard: r[i] = a[j] * s" in text
    reason = p.reason()
    assert reason.kind == "profile"
    assert reason.finding == (
        "Nsight Compute: memory at 71% and compute at 14% of their speed of light; achieved occupancy 82% of 100% "
        "possible; warps stall most on long_scoreboard, 74% of samples: waiting for a load's data from global or local "
        "memory; most at line 6, `r[i] = a[j] * s` (62% of samples)")
    assert reason.advice.startswith("memory latency: keep more independent loads in flight")
    html = p._repr_html_()
    assert html == profile_html(p)
    for piece in ("71%", "long_scoreboard", "<code style", "r[i] = a[j] * s", "where warps wait", "ncu-ui"):
        assert piece in html, piece
    busy = dataclasses.replace(p, figures=dataclasses.replace(p.figures, memory_sol=0.9))
    assert busy.reason().advice.startswith("memory is near its speed of light")
    idle = dataclasses.replace(p, figures=dataclasses.replace(p.figures, memory_sol=0.3))
    assert idle.reason().advice.startswith("neither memory nor compute is busy (latency-bound): memory latency")
    none = profiling.KernelProfile.unavailable("k", "profiling needs a GPU")
    assert str(none) == "profile   : not profiled: profiling needs a GPU" and none.reason() is None
    assert "not profiled: profiling needs a GPU" in profile_html(none)


def _efficiency(reasons=()):
    return Efficiency(op_bandwidth=1.0e12, eager_bandwidth=None, copy_bandwidth=3.83e12, peak_bandwidth=4.8e12,
                      peak_source="test", device="NVIDIA H100", bytes_moved=1 << 30, reasons=tuple(reasons))


def test_the_why_uses_the_profile_instead_of_asking_for_one(gather_scale):
    p = recorded_profile(gather_scale)
    e = _efficiency()
    assert e.explanation is UNEXPLAINED and "--profile" in e.reason
    found = profiling.with_profile(e, p)
    assert found.explanation.kind == "profile" and "--profile" not in found.reason
    assert "why       : below 85% of the ceiling: Nsight Compute: memory at 71%" in "\n".join(found.lines())
    own = Reason("occupancy", "occupancy 25% limited by registers", "cap them")
    both = profiling.with_profile(_efficiency([own]), p)
    assert both.explanation is own and [r.kind for r in both.also] == ["profile"]  # the report's model first
    near = dataclasses.replace(e, op_bandwidth=3.7e12)
    assert profiling.with_profile(near, p) is near  # at the ceiling: nothing to explain
    assert profiling.with_profile(e, profiling.KernelProfile.unavailable("k", "no ncu")) is e


# --------------------------------------------------------------------------- running ncu


def test_the_command_profiles_one_launch_of_the_entry_with_the_clocks_left_alone():
    argv = ncu.profile_command("/opt/ncu", "/tmp/r.ncu-rep", "_ZN8__main__1kE", ["python", "-m", "child", "dir"])
    assert argv[:1] == ["/opt/ncu"] and argv[-4:] == ["python", "-m", "child", "dir"]
    pairs = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 5) if argv[i].startswith("-")}
    assert pairs["--clock-control"] == "none" and pairs["--launch-count"] == "1" and pairs["-o"] == "/tmp/r.ncu-rep"
    assert pairs["--kernel-name-base"] == "mangled" and pairs["--kernel-name"] == "_ZN8__main__1kE"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--section"] == list(ncu.SECTIONS)
    assert {"SpeedOfLight", "Occupancy", "WarpStateStats", "SourceCounters"} <= set(ncu.SECTIONS)
    base = ncu.profile_command("/opt/ncu", "r", "k", ["p"], clock_control="base")
    assert base[base.index("--clock-control") + 1] == "base"
    with pytest.raises(ValueError, match="clock_control"):
        ncu.profile_command("/opt/ncu", "r", "k", ["p"], clock_control="boost")
    reads = ncu.import_commands("/opt/ncu", "r.ncu-rep")
    assert reads["raw"][1:6] == ["--import", "r.ncu-rep", "--page", "raw", "--csv"]
    assert reads["source"][reads["source"].index("--print-source") + 1] == "cuda,sass"


@pytest.fixture
def no_ncu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("PNEX_NCU", raising=False)
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    real = os.path.isfile
    monkeypatch.setattr(ncu.os.path, "isfile", lambda p: False if str(p).startswith("/usr/local/cuda") else real(p))
    return tmp_path


def _tool(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "ncu"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    return tool


def test_finding_ncu(no_ncu, monkeypatch):
    assert ncu.find_ncu() is None
    opt = _tool(no_ncu / "opt" / "2025.3.1")
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [str(opt)] if "nsight-compute" in pattern else [])
    assert ncu.find_ncu() == str(opt)
    home = _tool(no_ncu / "no-cuda" / "bin")
    assert ncu.find_ncu() == str(home)
    on_path = _tool(no_ncu / "empty")
    assert ncu.find_ncu() == str(on_path)
    chosen = _tool(no_ncu / "chosen")
    monkeypatch.setenv("PNEX_NCU", str(chosen))
    assert ncu.find_ncu() == str(chosen)


def test_without_ncu_or_a_gpu_the_error_says_what_is_missing(no_ncu, gather_scale, monkeypatch):
    x = torch.rand(64)
    idx = torch.randint(0, 64, (64,))
    with pytest.raises(profiling.ProfilerUnavailable, match="profiling needs a GPU: the arguments hold no CUDA tensor"):
        pnex.profile(gather_scale, x, idx, 2.0)
    monkeypatch.setattr(profiling, "_device", lambda args: torch.device("cuda", 0))
    with pytest.raises(profiling.ProfilerUnavailable) as info:
        pnex.profile(gather_scale, x, idx, 2.0)
    assert str(info.value) == ncu.NCU_ADVICE and "nsight-compute" in str(info.value) and "PNEX_NCU" in str(info.value)
    with pytest.raises(PnexError, match="profiles an op made by pnex.jit"):
        pnex.profile(lambda a: a, x)


_REAL_RUN = subprocess.run


def _fake_ncu(calls: list, *, raw=RAW, source=SOURCE, profiled=True, said=""):
    def run(argv, **kwargs):
        if "ncu" not in Path(argv[0]).name:  # the disassembler, say: the real thing
            return _REAL_RUN(argv, **kwargs)
        calls.append((argv, kwargs))
        if "--version" in argv:
            return subprocess.CompletedProcess(argv, 0, VERSION, "")
        if "--import" in argv:
            page = argv[argv.index("--page") + 1]
            return subprocess.CompletedProcess(argv, 0, raw if page == "raw" else source, "")
        folder = Path(argv[-1])
        assert sorted(p.name for p in folder.iterdir()) == ["args.pt", "kernel.pnex", "launch.json"]
        if profiled:
            Path(argv[argv.index("-o") + 1]).write_bytes(b"NVIDIA Nsight Compute report")
        return subprocess.CompletedProcess(argv, 0, "==PROF== Connected to process 4242\n" + said, "")
    return run


def test_profile_end_to_end_with_a_recorded_ncu(gather_scale, monkeypatch, fresh_cache):
    """Everything but the GPU: the op and its arguments saved for the child, ncu's command,
    the report read back twice, the lines mapped to the kernel's source."""
    calls = []
    monkeypatch.setattr(profiling, "_device", lambda args: torch.device("cuda", 0))
    monkeypatch.setattr(profiling.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/opt/nvidia/nsight-compute/2025.3.1/ncu")
    monkeypatch.setattr(profiling.subprocess, "run", _fake_ncu(calls))
    p = pnex.profile(gather_scale, torch.rand(256), torch.randint(0, 256, (256,)), 2.0)
    (argv, kwargs), *reads = calls
    entry = gather_scale._pnex.compiled("sm_90").entry
    assert argv[argv.index("--kernel-name") + 1] == entry and argv[argv.index("--clock-control") + 1] == "none"
    assert argv[-4:-1] == [sys.executable, "-m", "pnex_magic._profile_child"]
    assert kwargs["env"]["PNEX_LAUNCHER"] == "driver" and str(ROOT) in kwargs["env"]["PYTHONPATH"]
    assert [r[0][r[0].index("--page") + 1] for r in reads[:2]] == ["raw", "source"]
    assert p.ok and p.version == "2025.3.1.0" and p.kernel == "gather_scale"
    assert Path(p.report_path).is_file() and Path(p.report_path).parent == fresh_cache / "profiles"
    assert p.figures.memory_sol == pytest.approx(0.712, abs=1e-3) and p.hot_lines[0].text == "r[i] = a[j] * s"
    assert p.raw_csv == RAW and p.note == ""


def test_ncu_failures_say_what_it_printed(gather_scale, monkeypatch):
    monkeypatch.setattr(profiling, "_device", lambda args: torch.device("cuda", 0))
    monkeypatch.setattr(profiling.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/opt/ncu")
    args = (torch.rand(32), torch.randint(0, 32, (32,)), 1.0)
    monkeypatch.setattr(profiling.subprocess, "run", _fake_ncu([], profiled=False,
                                                               said="==WARNING== No kernels were profiled.\n"))
    with pytest.raises(PnexError, match=r"profiled no launch of gather_scale\(\)(.|\n)*No kernels were profiled"):
        pnex.profile(gather_scale, *args)
    monkeypatch.setattr(profiling.subprocess, "run", _fake_ncu([], profiled=False, said="==ERROR== ERR_NVGPUCTRPERM"))
    with pytest.raises(profiling.ProfilerUnavailable, match="performance counters"):
        pnex.profile(gather_scale, *args)
    monkeypatch.setattr(profiling.subprocess, "run", _fake_ncu([], raw="==PROF== nothing\n"))
    with pytest.raises(PnexError, match="holds no launch"):
        pnex.profile(gather_scale, *args)


def test_child_usage(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = lambda *a: subprocess.run([sys.executable, "-m", "pnex_magic._profile_child", *a],  # noqa: E731
                                    capture_output=True, text=True, env=env, timeout=120)
    done = run()
    assert done.returncode == 2 and "folder" in done.stderr
    done = run(str(tmp_path))
    assert done.returncode == 2 and "has no kernel.pnex or args.pt or launch.json" in done.stderr
    done = run("--help")
    assert done.returncode == 0 and "kernel.pnex, args.pt and launch.json" in done.stdout


# --------------------------------------------------------------------------- %%pnex --profile

IPython = pytest.importorskip("IPython")
from IPython.core.error import UsageError  # noqa: E402
from IPython.testing import globalipapp  # noqa: E402

CELL_BODY = CELL_SOURCE.lstrip("\n")  # the magic puts the %%pnex line first: the def is on line 2 again


@pytest.fixture(scope="module")
def ip():
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "pnex_magic")
    shell.run_cell("import torch\nx = torch.rand(64)\nidx = torch.randint(0, 64, (64,))")
    return shell


def test_profile_needs_args(ip):
    with pytest.raises(UsageError, match="--profile needs --args"):
        ip.run_cell_magic("pnex", "--n-threads a.numel() --profile", CELL_BODY)


def test_on_cpu_the_profile_tab_says_profiling_needs_a_gpu(ip, fresh_cache):
    ip.run_cell_magic("pnex", "--n-threads a.numel() --args (x, idx, 2.0) --eager 'lambda a, i, s: a[i] * s' "
                      "--profile -o rep", CELL_BODY)
    rep = ip.user_ns["rep"]
    assert rep.kernel.profile is not None and not rep.kernel.profile.ok
    assert [t for t, _ in rep.sections()][-1] == "Profile"
    assert "profiling needs a GPU" in dict(rep.sections())["Profile"]
    assert "profile   : not profiled: profiling needs a GPU" in rep.to_text()
    assert torch.equal(ip.user_ns["gather_scale"](ip.user_ns["x"], ip.user_ns["idx"], 2.0),
                       ip.user_ns["x"][ip.user_ns["idx"]] * 2.0)  # the op is bound all the same


def test_the_profile_tab_with_a_recorded_ncu(ip, monkeypatch, fresh_cache):
    calls = []
    run = _fake_ncu(calls)

    def in_the_cell(argv, **kwargs):  # the recorded lines are the cell's: name its file as IPython did
        cell = next(name for name, entry in reversed(list(linecache.cache.items()))
                    if len(entry) == 4 and entry[2] and any("r[i] = a[j] * s" in line for line in entry[2])
                    and name != CELL)
        done = run(argv, **kwargs)
        done.stdout = done.stdout.replace(CELL, cell)
        return done

    monkeypatch.setattr(profiling, "_device", lambda args: torch.device("cuda", 0))
    monkeypatch.setattr(profiling.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/opt/ncu")
    monkeypatch.setattr(profiling.subprocess, "run", in_the_cell)
    ip.run_cell_magic("pnex", "--n-threads a.numel() --args (x, idx, 2.0) --profile -o rep", CELL_BODY)
    rep = ip.user_ns["rep"]
    tab = dict(rep.sections())["Profile"]
    for piece in ("Nsight Compute 2025.3.1.0", "memory (speed of light)", "long_scoreboard", "r[i] = a[j] * s",
                  "most at line 6"):
        assert piece in tab, piece
    assert "line 6    : 62% of samples, mostly long_scoreboard: r[i] = a[j] * s" in rep.to_text()
    assert "Profile" in rep.to_html()


def test_a_kernel_that_cannot_be_saved_says_why_it_cannot_be_profiled(monkeypatch):
    table = torch.arange(4, dtype=torch.float32)  # a global the kernel reads: passed by reference, not saveable

    @pnex.jit(n_threads="a.numel()")
    def lookup(a: pnex.In("i64", (None,)), r: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            r[i] = table[a[i]]

    monkeypatch.setattr(profiling, "_device", lambda args: torch.device("cuda", 0))
    monkeypatch.setattr(profiling.torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/opt/ncu")
    with pytest.raises(PnexError, match="runs the kernel in a child process from a saved copy of the op, and cannot "
                                        "save 'lookup': it reads the device array"):
        pnex.profile(lookup, torch.zeros(4, dtype=torch.int64))


def test_a_kernel_without_a_line_table_says_so():
    """A cubin without a line table (a kernel linked from LTO-IR beside NVRTC helpers,
    which cannot carry one) gives a profile with no lines: the note says why instead of
    reporting no samples (the H200 profiles of 2026-11-28 had no hot lines and no word)."""
    from types import SimpleNamespace

    lined = SimpleNamespace(ptx=".loc 1 3 0", cubin=b"\x7fELF...debug_line...")
    assert profiling._line_table_note(lined) == ""
    assert "compiled without line information" in profiling._line_table_note(SimpleNamespace(ptx="", cubin=b""))
    unlined = SimpleNamespace(ptx=".loc 1 3 0", cubin=b"\x7fELF...debug_frame...")
    assert "cubin has no line table" in profiling._line_table_note(unlined)


@needs_nvvm
def test_hopper_kernels_keep_their_line_table(gather_scale):
    """A plain kernel's cubin (nvJitLink from PTX with -lineinfo) has its line table, and
    so does a setmaxnreg/wgmma kernel's, linked from LTO-IR (until 2026-11-28 it had none:
    its profiles could name no line); the profile's note is then empty."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "tensor_cores"))
    import gemm_pingpong

    from pnex_magic.report import _definition_of

    plain = _definition_of(gather_scale, "t").compiled("sm_90")
    assert profiling._line_table_note(plain) == ""
    hopper = _definition_of(gemm_pingpong.make_linear_pingpong("f16", 5), "t").compiled("sm_90a")
    assert b".debug_line" in hopper.cubin and profiling._line_table_note(hopper) == ""
