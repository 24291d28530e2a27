"""benchmarks/gemm_ncu.py without a GPU: a profiled launch (ncu's raw page, as parsed by
pnex_magic.ncu) becomes a row with its duration, tensor-pipe share, stalls and launch
figures, metrics ncu did not print are left out rather than zero, and unknown kernel
names are refused before anything runs."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gemm_ncu  # noqa: E402

from pnex_magic.ncu import RawKernel  # noqa: E402


def _kernel(**extra):
    values = {"gpu__time_duration.sum": "235300", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active":
              "90.4", "sm__throughput.avg.pct_of_peak_sustained_elapsed": "86", "launch__grid_size": "132",
              "launch__registers_per_thread": "168", "smsp__pcsamp_warps_issue_stalled_barrier": "60",
              "smsp__pcsamp_warps_issue_stalled_wait": "30", "smsp__pcsamp_warps_issue_stalled_selected": "10", **extra}
    return RawKernel("linear_persistent", values, {"gpu__time_duration.sum": "nsecond"})


def test_a_profiled_launch_becomes_a_row():
    row = gemm_ncu._row(_kernel(), "tma-persistent", (4096, 4096, 4096))
    assert row["contender"] == "tma-persistent" and (row["m"], row["n"], row["k"]) == (4096, 4096, 4096)
    assert abs(row["us"] - 235.3) < 1e-9
    assert abs(row["tensor_pipe"] - 0.904) < 1e-9 and abs(row["compute_sol"] - 0.86) < 1e-9
    assert row["grid"] == 132 and row["registers"] == 168
    assert [name for name, _ in row["stalls"]] == ["barrier", "wait"]
    assert abs(row["issuing"] - 0.1) < 1e-9
    assert "l2_hit_rate" not in row and "cluster" not in row  # not printed: left out, not zero
    assert gemm_ncu._row(_kernel(**{"lts__t_sector_hit_rate.pct": "72.5"}), "x", (1, 1, 1))["l2_hit_rate"] == 72.5


def test_unknown_kernels_are_refused(capsys):
    assert gemm_ncu.main(["--kernels", "tma,cutlass"]) == 2
    assert "unknown kernels ['cutlass']" in capsys.readouterr().out
