"""Seconds to a new process's first result of the persistent GELU GEMM (make the op, call it
once, synchronise): run it twice with one PNEX_CACHE_DIR; the second process should load the
kernel the first compiled (python first_process.py [label])."""
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402

sys.path.insert(0, "examples/tensor_cores")
from gemm_tma import TmaLinear  # noqa: E402

from pnex_magic import cache  # noqa: E402

t1 = time.perf_counter()
lin = TmaLinear("f16", 256, 4, True, gelu=True)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
w = torch.randn(4096, 4096, device="cuda", dtype=torch.float16) / 64
b = torch.randn(4096, device="cuda", dtype=torch.float16)
lin(a, w, b)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"{sys.argv[1] if len(sys.argv) > 1 else ''} imports {t1 - t0:.2f} s, op made and first call {t2 - t1:.2f} s, "
      f"cache {cache.stats}")
