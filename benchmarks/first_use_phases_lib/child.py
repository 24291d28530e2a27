"""One fresh process of ``benchmarks/first_use_phases.py`` (``--child``): two new kernels from the
start of their definition to their first result, phase by phase."""

from __future__ import annotations

import time

from first_use_phases_lib.instruments import _KERNEL, _AfterImport, _Clock, _Collections, _long_lived_heap


def child(device: str, salt: float, warmup_at_import: bool = False, ablate: tuple[str, ...] = (),
          prepare: bool = False, heap: int = 0, threshold0: int = 0) -> dict:
    """One fresh process's figures (run as ``python first_use_phases.py --child ...``);
    ``warmup_at_import``: pnex's background warm-up started right after ``import
    pnex_magic`` (the experiment of starting it at import); ``ablate``: parts of
    :mod:`pnex_magic.numbasetup` turned off (``scipy``: the BLAS probe finds SciPy;
    ``gc``: no freeze of older objects; ``setup``: no set-up of pnex's, Numba's own);
    ``prepare``: the untimed first child, which waits for the C++ launcher's build;
    ``heap``: that many more long-lived objects made after ``import torch``
    (:func:`_long_lived_heap`); ``threshold0``: the collector's first threshold
    (:func:`gc.set_threshold`; 0: Python's, 700), lower for more collections: the more
    objects of a GPU host's first kernel imitated."""
    begin = time.perf_counter()
    clock = _Clock()
    collections = _Collections(clock)
    _AfterImport(clock).install()
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        torch.ones(1, device="cuda")
        sync()
    kept = _long_lived_heap(heap)  # noqa: F841 - lives as long as the process
    if threshold0:
        import gc

        gc.set_threshold(threshold0, *gc.get_threshold()[1:])
    t_torch = time.perf_counter()
    import pnex_magic as pnex

    if warmup_at_import:
        from pnex_magic import warmup

        warmup.start()
    if ablate:
        import contextlib

        from pnex_magic import numbasetup

        if "scipy" in ablate:
            numbasetup._blas_probe_without_scipy = lambda: contextlib.nullcontext([])
        if "gc" in ablate:
            numbasetup._older_objects_frozen = lambda: contextlib.nullcontext(False)
        if "setup" in ablate:
            numbasetup.typing_setup = lambda: None
    t_pnex = time.perf_counter()
    from numba import cuda

    t_numba = time.perf_counter()
    n = 1024 if device == "cuda" else 64
    a = torch.randn(n, device=device)
    from pnex_magic import cache

    found: dict = {"torch_s": t_torch - begin, "import_pnex_s": t_pnex - t_torch, "import_numba_cuda_s": t_numba - t_pnex}
    clock.take()  # the imports' stages are not the kernel's
    collections.take()
    collections.take_full()
    for which, value in (("first", salt), ("second", salt + 0.5)):
        hits, misses = cache.stats.hits, cache.stats.misses
        name = f"phases_{which}"
        t0 = time.perf_counter()
        clock.enter("pnex.jit (definition path imports)")
        jit = pnex.jit  # noqa: F841 - the first access imports the definition path
        clock.leave()
        scope = {"pnex": pnex, "cuda": cuda}
        exec(compile(_KERNEL.format(name=name, salt=value), f"<{name}>", "exec"), scope)
        op = scope[name]
        if device == "cuda":
            clock.enter("first call")
            out = op(a)
            sync()
            clock.leave()
            torch.testing.assert_close(out, a.double().mul(value).float())  # the kernel computes in float64
        t1 = time.perf_counter()
        built = op._pnex.compiled_if_available()
        if built is None or not built.cubin:
            raise RuntimeError(f"the {which} kernel has no cubin")  # (without a GPU: the compile's result)
        if (cache.stats.hits - hits, cache.stats.misses - misses) != (0, 1):
            raise RuntimeError(f"the {which} kernel was not new (cache hits/misses {cache.stats.hits - hits}/"
                               f"{cache.stats.misses - misses})")
        phases = clock.take()
        main_phases = phases.get("main", {})
        main_phases["other"] = main_phases.pop("outside", 0.0)
        found[which] = {"seconds": t1 - t0, "phases": main_phases, "background": phases.get("background", {}),
                        "gc": collections.take(), "full_collections": collections.take_full()}
        if which == "first":
            found["script_s"] = t1 - t_torch
    from pnex_magic import numbasetup, warmup

    found["warmup"] = warmup.state()
    found["numbasetup"] = numbasetup.state()  # whether the set-up ran under pnex's freeze, on which thread
    if prepare and device == "cuda":  # the C++ launcher is built before anything is timed (as first_use.py's)
        from pnex_magic.launch import switch

        switch.wait(900)
        found["launcher"] = switch.status()
    return found
