"""Run one persistent GEMM configuration on a few shapes and check it (a hang shows as a timeout)."""
import sys, time
sys.path.insert(0, "examples/tensor_cores")
import torch, torch.nn.functional as F
from gemm_tma import TmaLinear as T
cfg = sys.argv[1]
lin = eval(f"T('f16', {cfg})")
bn = lin.bn
for m, n, k in ((256, bn, 64), (4096, 2048, 256), (8192, 1024, 1024), (1024, 8 * bn, 4096), (4096, 4096, 4096)):
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / k ** 0.5
    bias = torch.randn(n, device="cuda", dtype=torch.float16, generator=gen)
    t = time.time()
    c = lin(a, w, bias) if lin.gelu else lin(a, w)
    torch.cuda.synchronize()
    ref = a.double() @ w.double().t()
    if lin.gelu:
        ref = F.gelu(ref + bias.double())
    ok = bool(((c.double() - ref).abs() <= ref.abs() * 2**-11 + 4e-3).all())
    print(f"{cfg:45s} {m}x{n}x{k} {'ok' if ok else 'WRONG'} {time.time() - t:.3f}s", flush=True)
