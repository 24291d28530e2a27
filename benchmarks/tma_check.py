"""Quick GPU check of the TMA warp-specialised GEMM (examples/tensor_cores/gemm_tma.py)
against a float64 product, on shapes that exercise buffer reuse and every dtype.

    python benchmarks/tma_check.py
"""
import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing to check")
        return 0
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    failures = 0
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        for bn, stages, persistent in ((256, 4, False), (256, 3, False), (128, 6, False), (256, 3, True),
                                       (128, 5, True)):
            lin = TmaLinear(name, bn, stages, persistent)
            for m, n, k in ((128, bn, 64), (256, 2 * bn, 64 * 9), (1024, 1024, 4096), (384, 3 * bn, 64 * 5)):
                a = torch.randn(m, k, device="cuda", dtype=dt)
                w = torch.randn(n, k, device="cuda", dtype=dt)
                c = lin(a, w)
                ref = a.double() @ w.double().T
                err = float(torch.linalg.norm((c.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
                ok = err < (2e-3 if name == "f16" else 1e-2)
                failures += not ok
                print(f"{name} BN={bn} STAGES={stages}{' persistent' if persistent else ''} {m}x{n}x{k}: rel error {err:.2e} {'ok' if ok else 'WRONG'}",
                      flush=True)
    print("tma_check:", "all ok" if not failures else f"{failures} wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
