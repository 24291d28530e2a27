"""``%pnex_doctor`` on which compiler wheels fit which driver, with faked versions:
``cu13`` needs a CUDA 13 driver (580+); CUDA 12 drivers (Colab's) need ``cu12``."""

from __future__ import annotations

import pytest

IPython = pytest.importorskip("IPython")
from IPython.testing import globalipapp  # noqa: E402


@pytest.fixture(scope="module")
def ip():
    shell = globalipapp.get_ipython()  # the module's name: rebound to the shell once started
    shell.run_line_magic("load_ext", "pnex_magic")
    return shell


def test_doctor_says_which_extra_fits_the_driver():
    from pnex_magic.frontends.doctor import driver_vs_wheels, extra_for

    assert extra_for((12, 8)) == "cu12" and extra_for((13, 0)) == "cu13" and extra_for((13, 2), "12.8") == "cu13"
    assert extra_for(None, "12.8") == "cu12" and extra_for(None, "13.0") == "cu13" and extra_for(None, None) == "cu13"
    check, fix = driver_vs_wheels((12, 4), (13, 0))  # Colab's driver, the CUDA 13 wheels
    assert check.status == "missing" and "CUDA 13.0 but the driver supports CUDA 12.4" in check.detail
    assert 'pip install "pnex_magic[cu12]"' in fix and "580" in check.detail
    for driver, linker in (((12, 2), (12, 9)), ((13, 0), (12, 9)), ((13, 0), (13, 2))):
        check, fix = driver_vs_wheels(driver, linker)
        assert check.status == "ok" and not fix, (driver, linker)
    assert driver_vs_wheels(None, (13, 0)) is None and driver_vs_wheels((12, 4), None) is None


def test_doctor_flags_compiler_wheels_newer_than_the_driver(ip, monkeypatch):
    from cuda.bindings import driver, nvjitlink

    monkeypatch.setattr(driver, "cuDriverGetVersion", lambda: (driver.CUresult.CUDA_SUCCESS, 12040))
    monkeypatch.setattr(nvjitlink, "version", lambda: (13, 0))
    report = ip.run_line_magic("pnex_doctor", "")
    assert report["NVIDIA driver"].detail == "supports CUDA 12.4"
    assert report["driver vs wheels"].status == "missing"
    assert any('pnex_magic[cu12]"' in a for a in report.advice)
    assert "cu13: CUDA 13 drivers (580 or newer)" in report["extras"].detail and "this driver: [cu12]" in report["extras"].detail
    monkeypatch.setattr(driver, "cuDriverGetVersion", lambda: (driver.CUresult.CUDA_SUCCESS, 13000))
    assert ip.run_line_magic("pnex_doctor", "")["driver vs wheels"].status == "ok"
