"""The on-disk compile cache and the fingerprints it is keyed on."""

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import cache, tc
from pnex_magic.fingerprint import function_fingerprint

THIS_MODULE = sys.modules[__name__]

BLOCK = 4


def make_plain():
    @pnex.jit(n_threads="a.numel()")
    def cached_plain(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] + 1

    return cached_plain


def make_block_scaled():
    @pnex.jit(n_threads="a.numel()")
    def block_scaled(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] * BLOCK

    return block_scaled


def test_unchanged_kernel_is_a_hit(fresh_cache):
    first = make_plain()
    assert (cache.stats.hits, cache.stats.misses) == (0, 1)
    assert pnex.inspect(first).cache_hit is False
    second = make_plain()
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    assert pnex.inspect(second).cache_hit is True
    assert pnex.inspect(second).ptx == pnex.inspect(first).ptx
    assert pnex.inspect(second).registers == pnex.inspect(first).registers
    a = torch.arange(6, dtype=torch.float32)
    assert torch.equal(second(a), a + 1)
    # one entry on disk, holding PTX and cubin
    [entry] = cache.entries()
    assert entry.meta["key"] == second.definition.cache_key(pnex.inspect(second).arch)
    assert (entry.path / "kernel.ptx").read_text() == pnex.inspect(first).ptx
    assert (entry.path / "kernel.cubin").stat().st_size > 0


def test_changed_global_is_a_miss_and_takes_effect(fresh_cache, monkeypatch):
    a = torch.arange(5, dtype=torch.float32)
    monkeypatch.setattr(THIS_MODULE, "BLOCK", 4)
    four = make_block_scaled()
    assert torch.equal(four(a), a * 4)
    key_four = pnex.inspect(four).cache_key  # before redefinition points `four` at the new op
    monkeypatch.setattr(THIS_MODULE, "BLOCK", 8)
    eight = make_block_scaled()
    assert (cache.stats.hits, cache.stats.misses) == (0, 2)
    assert pnex.inspect(eight).cache_hit is False
    assert pnex.inspect(eight).cache_key != key_four
    assert torch.equal(eight(a), a * 8)
    # back to 4: the first entry is still there
    monkeypatch.setattr(THIS_MODULE, "BLOCK", 4)
    again = make_block_scaled()
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)
    assert torch.equal(again(a), a * 4)


def test_simulator_uses_globals_frozen_at_definition(fresh_cache, monkeypatch):
    a = torch.arange(5, dtype=torch.float32)
    monkeypatch.setattr(THIS_MODULE, "BLOCK", 4)
    four = make_block_scaled()  # compiled (PTX) with BLOCK = 4
    monkeypatch.setattr(THIS_MODULE, "BLOCK", 8)
    assert torch.equal(four(a), a * 4)  # first launch after the change


@pytest.mark.slow
def test_fresh_process_hits_the_cache(tmp_path, pnex_env):
    script = tmp_path / "fresh_kernel.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from numba import cuda
            import pnex_magic as pnex

            @pnex.jit(n_threads="a.numel()")
            def fresh(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
                i = cuda.grid(1)
                if i < a.shape[0]:
                    out[i] = a[i] * 3

            a = torch.arange(4, dtype=torch.float32)
            assert torch.equal(fresh(a), a * 3), "wrong result"
            report = pnex.inspect(fresh)
            print("CACHE_HIT", report.cache_hit, report.cache_key)
            """
        )
    )
    env = dict(pnex_env, PNEX_CACHE_DIR=str(tmp_path / "cache"))
    outputs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("CACHE_HIT")]
        outputs.append(line.split())
    assert outputs[0][1] == "False"
    assert outputs[1][1] == "True"
    assert outputs[0][2] == outputs[1][2]  # same key in both processes


def make_slot_kernel(which: str):
    if which == "first":

        @pnex.jit(n_threads="a.numel()", cache_id="shared slot/1")
        def slot_first(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
            i = cuda.grid(1)
            if i < a.shape[0]:
                out[i] = a[i] + 10

        return slot_first

    @pnex.jit(n_threads="a.numel()", cache_id="shared slot/1")
    def slot_second(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            out[i] = a[i] - 10

    return slot_second


def test_cache_id_slots_evict_each_other(fresh_cache):
    a = torch.arange(3, dtype=torch.float32)
    first = make_slot_kernel("first")
    second = make_slot_kernel("second")
    assert (cache.stats.hits, cache.stats.misses) == (0, 2)
    [entry] = cache.entries()  # one slot, named after the (sanitised) cache_id
    assert entry.path.name == "id-shared_slot_1"
    assert entry.meta["kernel"].endswith("slot_second")
    # the first kernel's entry was evicted: a miss, and its own code, never the other's
    first_again = make_slot_kernel("first")
    assert (cache.stats.hits, cache.stats.misses) == (0, 3)
    report = pnex.inspect(first_again)
    assert report.cache_hit is False
    assert "slot_first" in report.entry and "slot_second" not in report.ptx
    assert torch.equal(first_again(a), a + 10)
    assert torch.equal(second(a), a - 10)
    [entry] = cache.entries()
    assert entry.meta["kernel"].endswith("slot_first")
    # unchanged and not evicted since: a hit
    make_slot_kernel("first")
    assert (cache.stats.hits, cache.stats.misses) == (1, 3)


def test_different_options_are_different_keys(fresh_cache):
    op = make_plain()
    definition = op.definition
    assert definition.cache_key("sm_75") != definition.cache_key("sm_90")
    assert len(definition.cache_key("sm_75")) == 64
    capped = pnex.jit(n_threads="a.numel()", max_registers=32)(op.definition.fn)
    assert capped.definition.cache_key("sm_75") != definition.cache_key("sm_75")
    assert cache.stats.misses == 2


def test_cache_dir_locations(monkeypatch, tmp_path):
    monkeypatch.setenv("PNEX_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("PNEX_CACHE_DIR")
    assert cache.cache_dir() == tmp_path / "xdg" / "pnex_magic"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "pnex_magic"
    monkeypatch.setenv("PNEX_CACHE_DIR", "~/elsewhere")
    assert cache.cache_dir() == tmp_path / "home" / "elsewhere"
    monkeypatch.setenv("PNEX_CACHE_DIR", "")  # empty: as if unset
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "pnex_magic"


def test_xdg_cache_home_used_for_compiles(monkeypatch, tmp_path):
    monkeypatch.delenv("PNEX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    op = make_plain()
    entries = list((tmp_path / "pnex_magic").iterdir())
    assert len(entries) == 1 and (entries[0] / "meta.json").exists()
    assert json.loads((entries[0] / "meta.json").read_text())["kernel"].endswith("cached_plain")
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))


def test_store_and_load_round_trip(fresh_cache):
    key = "ab" * 32
    assert cache.load(key) is None
    path = cache.store(key, {"entry": "e"}, {"kernel.ptx": "ptx text", "kernel.cubin": b"\x00\x01"})
    assert path == fresh_cache / key[:40]
    entry = cache.load(key)
    assert entry is not None and entry.meta["entry"] == "e" and entry.meta["key"] == key
    assert entry.read_text("kernel.ptx") == "ptx text"
    assert entry.read_bytes("kernel.cubin") == b"\x00\x01"
    assert entry.read_text("missing") is None
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)
    # no temporary folders left behind
    assert [p.name for p in fresh_cache.iterdir()] == [key[:40]]
    assert cache.clear().removed["kernels"] == 1
    assert cache.entries() == []


def test_key_mismatch_in_slot_is_a_miss(fresh_cache):
    cache.store("a" * 64, {}, {}, cache_id="slot")
    assert cache.load("b" * 64, cache_id="slot") is None
    assert cache.load("a" * 64, cache_id="slot") is not None


def test_corrupt_entry_is_a_miss_and_recompiles(fresh_cache):
    make_plain()
    [entry] = cache.entries()
    (entry.path / "meta.json").write_text("{not json")
    op = make_plain()
    assert (cache.stats.hits, cache.stats.misses) == (0, 2)
    assert pnex.inspect(op).cache_hit is False
    assert torch.equal(op(torch.zeros(2)), torch.ones(2))
    assert len(cache.entries()) == 1  # rewritten


def test_unwritable_cache_still_compiles(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PNEX_CACHE_DIR", str(blocker / "cache"))
    assert cache.store("c" * 64, {}, {"x": "y"}) is None
    op = make_plain()
    assert pnex.inspect(op).cache_hit is False
    assert torch.equal(op(torch.zeros(2)), torch.ones(2))


# --------------------------------------------------------------------------------------
# Fingerprints: what the key covers.  No compiling here.
# --------------------------------------------------------------------------------------

SCALE = 2


@cuda.jit(device=True)
def _helper(v):
    return v * SCALE


def _uses_helper(a, out):
    i = cuda.grid(1)
    out[i] = _helper(a[i])


def _uses_config(a, out):
    out[0] = a[0] * SCALE


def test_fingerprint_is_stable():
    assert function_fingerprint(_uses_config) == function_fingerprint(_uses_config)
    assert function_fingerprint(_uses_config, "x") != function_fingerprint(_uses_config, "y")


def test_fingerprint_covers_globals_and_device_functions(monkeypatch):
    before = function_fingerprint(_uses_config)
    before_helper = function_fingerprint(_uses_helper)
    monkeypatch.setattr(THIS_MODULE, "SCALE", 3)
    assert function_fingerprint(_uses_config) != before
    # SCALE is read by the device function the kernel calls
    assert function_fingerprint(_uses_helper) != before_helper


def test_fingerprint_covers_closures():
    def make(k):
        def kernel(a, out):
            out[0] = a[0] * k

        return kernel

    assert function_fingerprint(make(1)) == function_fingerprint(make(1))
    assert function_fingerprint(make(1)) != function_fingerprint(make(2))
    assert function_fingerprint(make((1, 2))) != function_fingerprint(make((1, 3)))


def test_fingerprint_covers_array_constants(monkeypatch):
    import numpy as np

    monkeypatch.setattr(THIS_MODULE, "SCALE", np.arange(3))
    before = function_fingerprint(_uses_config)
    monkeypatch.setattr(THIS_MODULE, "SCALE", np.arange(3) + 1)
    assert function_fingerprint(_uses_config) != before


KERNEL_MODULE = """
from numba import cuda
import pnex_magic as pnex

SCALE = 2


def moved_k(a: pnex.In("f32", (None,)), out: pnex.Out("f32", "a")):
    \"\"\"Scales a.\"\"\"
    i = cuda.grid(1)
    if i < a.shape[0]:
        out[i] = a[i] * SCALE
"""


def test_a_kernel_named_into_another_module_keeps_that_name_in_its_copy(tmp_path, monkeypatch):
    """A kernel whose ``__module__`` is set after its ``def`` (``benchmarks/workloads_lib``'s
    ``named_in_workloads``, numpy's ``set_module``): the snapshot's copy keeps that name, so
    the cache key (which hashes the copy's ``module.qualname``) names the kernel as its op
    name does, and the kernel moved into a new file with ``__module__`` set to the old one
    keeps its key; the copy still reads the globals of the file it was written in."""
    from pnex_magic.define import definition
    from pnex_magic.snapshot import freeze

    (tmp_path / "pnex_origin_mod.py").write_text(KERNEL_MODULE)
    (tmp_path / "pnex_moved_mod.py").write_text(KERNEL_MODULE + '\nmoved_k.__module__ = "pnex_origin_mod"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    origin = __import__("pnex_origin_mod")
    moved = __import__("pnex_moved_mod")
    copy = freeze(moved.moved_k).function
    assert (copy.__module__, copy.__qualname__, copy.__doc__) == ("pnex_origin_mod", "moved_k", "Scales a.")
    assert copy.__globals__["__name__"] == "pnex_moved_mod"  # the file it was written in
    first, second = (definition(m.moved_k, n_threads="a.numel()") for m in (origin, moved))
    assert first.op_name == second.op_name
    assert first.cache_key("sm_80") == second.cache_key("sm_80")
    monkeypatch.setattr(moved, "SCALE", 3)  # the copy reads its own file's globals: another key
    third = definition(moved.moved_k, n_threads="a.numel()")
    assert third.snapshot.function.__globals__["SCALE"] == 3 and third.cache_key("sm_80") != first.cache_key("sm_80")


def test_cache_dir_fixture_isolated(fresh_cache):
    assert cache.cache_dir() == fresh_cache
    assert Path(fresh_cache).is_dir() and not any(Path(fresh_cache).iterdir())


def test_failed_store_leaves_no_temporary_folder(fresh_cache, monkeypatch):
    def refuse(src, dst):
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr(cache.os, "replace", refuse)
    assert cache.store("d" * 64, {}, {"kernel.ptx": "x"}) is None
    assert list(fresh_cache.iterdir()) == []


# --------------------------------------------------------------------------------------
# clear(): everything pnex keeps in the folder, counted by part.  No compiling here.
# --------------------------------------------------------------------------------------


def _fill(root: Path) -> dict[str, int]:
    """One or more items of every part of the cache (as the stages that make them name
    them), and things of the user's; returns the bytes of each part."""
    cache.store("1" * 64, {"kernel": "mod.copy_k"}, {"kernel.ptx": "p" * 300, "kernel.cubin": b"c" * 700})
    cache.store("2" * 64, {"kernel": "mod.other_k"}, {"kernel.ptx": "q" * 50}, cache_id="my slot")
    cache.store("3" * 64, {"kernel": "mod.broken"}, {"kernel.ptx": "r"})
    (root / ("3" * 40) / "meta.json").write_text("{not json")  # an entry of pnex's all the same
    cache.store_record("autotune", "a" * 64, {"kernel": "mod.copy_k", "choice": [32]})
    cache.store_record("autotune", "b" * 64, {"kernel": "mod.other_k", "choice": [64]})
    cache.store_record("simulated", "c" * 64, {"kernel": "copy_k", "form": "x" * 40})
    cache.store_record("code", "d" * 64, {"package": "/src/pnex_magic", "files": {}})
    cache.store_record("code", "e" * 64, {"package": "/src/pnex_magic", "version": "0123"})
    cache.store_record("sass", "f" * 64, {"text": "IMAD R1, R2"})
    launcher = cache.folder("launcher")
    (launcher / "k1").mkdir(parents=True)
    (launcher / "k1" / "pnex_launcher_k1.so").write_bytes(b"s" * 4000)
    (launcher / "k1.log").write_text("built in 40 s\n")
    (launcher / "k1.flock").touch()
    (launcher / "k2.failed.json").write_text('{"error": "no compiler"}')  # a failed build: its record and log
    (launcher / "k2.log").write_text("c++: not found\n")
    (launcher / "k2.flock").touch()
    (launcher / ".k2.tmp-4242").mkdir()  # what a killed build left
    (launcher / "pnex_jax_ffi.current.json").write_text("{}")  # the XLA handler's pointer
    tool = cache.folder("tools") / "nvidia" / "bin"
    tool.mkdir(parents=True)
    (tool / "compute-sanitizer").write_bytes(b"t" * 900)
    cache.folder("profiles").mkdir()
    (cache.folder("profiles") / "copy_k-20260101-1.ncu-rep").write_bytes(b"n" * 1200)
    old = time.time() - 7200
    for stale in (root / ".tmp-killed", cache.folder("sass") / ".tmp-killed.json"):  # killed writers', long ago
        stale.mkdir() if stale.suffix != ".json" else stale.write_text("{")
        os.utime(stale, (old, old))
    (root / ".tmp-live").mkdir()  # a writer's, now: left to it
    (root / "my-notes.txt").write_text("the user's")  # PNEX_CACHE_DIR may hold other things
    (root / "my-folder").mkdir()
    return {part: use.bytes for part, use in cache.usage().items()}


def test_clear_removes_every_part_and_counts_what_it_removed(fresh_cache):
    sizes = _fill(fresh_cache)
    items = {part: use.items for part, use in cache.usage().items()}
    assert items == {"kernels": 3, "autotune": 2, "simulated": 1, "code": 2, "sass": 1, "launcher": 3, "tools": 1,
                     "profiles": 1}
    assert sizes["kernels"] > 1000 and sizes["launcher"] > 4000 and sizes["profiles"] == 1200
    cleared = cache.clear()
    assert cleared.removed == items and cleared.total == 14 and cleared.left == () and cleared.kept == ()
    assert cleared.bytes_freed == sum(sizes.values())
    assert str(cleared).startswith(f"pnex cache {fresh_cache}: removed 3 compiled kernels, 2 autotune choices, "
                                   "1 simulated form, 2 code digest records, 1 SASS listing, 3 launcher builds, "
                                   "1 tool copy, 1 profile report")
    assert all(use.items == 0 for use in cache.usage().values())
    # Left: the user's things, a live writer's temporary folder, the builds' (empty) locks.
    left = sorted(str(p.relative_to(fresh_cache)) for p in fresh_cache.rglob("*"))
    assert left == [".tmp-live", "launcher", "launcher/k1.flock", "launcher/k2.flock", "my-folder", "my-notes.txt"]
    assert cache.clear().total == 0  # nothing more: the counts are of what was there


def test_clear_keeps_what_is_asked_and_what_is_in_use(fresh_cache):
    _fill(fresh_cache)
    with open(cache.build_lock(cache.folder("launcher") / "k1"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the build process holds it while it builds
        cleared = cache.clear(keep=("autotune", "profiles"))
        assert cleared.kept == ("autotune", "profiles") and "autotune" not in cleared.removed
        assert cleared.removed["launcher"] == 2  # k2's failure record and log, the XLA pointer
        assert cleared.left == (f"{cache.folder('launcher') / 'k1'}: a build in progress",)
        assert (cache.folder("launcher") / "k1" / "pnex_launcher_k1.so").exists()
    assert "kept autotune choices, profile reports; left " in str(cleared)
    assert [r.data["choice"] for r in cache.records("autotune")] == [[32], [64]]
    assert cache.usage()["profiles"].items == 1
    assert cache.clear(keep="autotune").removed == {"kernels": 0, "simulated": 0, "code": 0, "sass": 0, "launcher": 1,
                                                    "tools": 0, "profiles": 1}
    with pytest.raises(ValueError, match=r"clear\(keep=...\): no part named 'choices'; the parts are kernels, auto"):
        cache.clear(keep=["choices"])


def test_clear_of_one_kernel_removes_its_builds_choices_and_simulated_forms(fresh_cache):
    _fill(fresh_cache)
    cleared = cache.clear(kernel="copy_k")
    assert cleared.removed == {"kernels": 1, "autotune": 1, "simulated": 1}
    assert [e.meta["kernel"] for e in cache.entries()] == ["mod.other_k"]  # and the broken entry, unreadable
    assert [r.data["kernel"] for r in cache.records("autotune")] == ["mod.other_k"]
    use = cache.usage()
    assert (use["kernels"].items, use["simulated"].items, use["code"].items, use["launcher"].items) == (2, 0, 2, 3)


def test_records_of_an_unknown_kind_are_refused(fresh_cache):
    with pytest.raises(ValueError, match=r"no record kind 'choices'; the kinds are autotune, simulated, code, sass"):
        cache.store_record("choices", "a" * 64, {})
    with pytest.raises(ValueError, match=r"no folder named 'kernels'"):
        cache.folder("kernels")


def _uses_tc(bars, out):
    tc.mbarrier_wait(bars, 0, 0)
    tc.named_barrier(1, 64)
    out[0] = 1.0


def test_a_kernel_calling_pnex_tc_keeps_its_fingerprint_while_the_simulator_runs():
    """pnex.tc's primitives are pnex's own code (the code version in every key holds it):
    the fingerprint names them and does not walk into their simulator's state, the time of
    its last progress and the running threads, which made another key in every process
    (every tensor-core kernel was compiled again in each new process, 2026-11-29)."""
    import threading

    from pnex_magic.tc import simulate_bulk

    before = function_fingerprint(_uses_tc)
    simulate_bulk._last_change[0] += 1.0
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        assert function_fingerprint(_uses_tc) == before
    finally:
        done.set()
        thread.join()


def test_a_kernel_calling_pnex_tc_has_one_fingerprint_in_two_processes(tmp_path, pnex_env):
    script = tmp_path / "tc_key.py"
    script.write_text(textwrap.dedent(
        """
        import threading
        from pnex_magic import tc
        from pnex_magic.fingerprint import function_fingerprint

        def kernel(bars, out):
            tc.mbarrier_wait(bars, 0, 0)
            tc.named_barrier(1, 64)
            out[0] = 1.0

        threading.Thread(target=lambda: None).start()
        print("KEY", function_fingerprint(kernel))
        """))
    keys = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], env=pnex_env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        keys += [ln for ln in proc.stdout.splitlines() if ln.startswith("KEY")]
    assert len(keys) == 2 and keys[0] == keys[1]
