"""Quick GPU check of the TMA warp-specialised GEMM (examples/tensor_cores/gemm_tma.py)
against a float64 product, on shapes that exercise buffer reuse and every dtype: the
plain, persistent and clustered (2-block clusters, W multicast) kernels.

    python benchmarks/tma_check.py [--only cluster]
"""
import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("plain", "persistent", "cluster"), default=None,
                   help="check one kind of kernel (default: all)")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no GPU: nothing to check")
        return 0
    sys.path.insert(0, str(REPO / "examples" / "tensor_cores"))
    from gemm_tma import TmaLinear

    failures = 0
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        for bn, stages, kind in ((256, 4, "plain"), (256, 3, "plain"), (128, 6, "plain"), (256, 3, "persistent"),
                                 (128, 5, "persistent"), (256, 4, "cluster"), (256, 3, "cluster"), (128, 6, "cluster")):
            if args.only not in (None, kind):
                continue
            cluster = 2 if kind == "cluster" else 1
            lin = TmaLinear(name, bn, stages, kind == "persistent", cluster=cluster)
            # the clustered kernel needs M a multiple of 256: its M's are the others' rounded up
            for m, n, k in ((128, bn, 64), (256, 2 * bn, 64 * 9), (1024, 1024, 4096), (384, 3 * bn, 64 * 5)):
                m = -(-m // (128 * cluster)) * 128 * cluster
                a = torch.randn(m, k, device="cuda", dtype=dt)
                w = torch.randn(n, k, device="cuda", dtype=dt)
                c = lin(a, w)
                ref = a.double() @ w.double().T
                err = float(torch.linalg.norm((c.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))
                ok = err < (2e-3 if name == "f16" else 1e-2)
                failures += not ok
                print(f"{name} BN={bn} STAGES={stages}{'' if kind == 'plain' else ' ' + kind} {m}x{n}x{k}: "
                      f"rel error {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
    print("tma_check:", "all ok" if not failures else f"{failures} wrong")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
