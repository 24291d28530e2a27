"""A 2-process DDP job whose model calls a pnex op in its forward pass.

Run by tests/test_gpu.py::test_ddp_two_processes through torchrun; uses PyTorch's own
distributed stack (NCCL). Each rank checks its gradients against a plain-PyTorch replica."""

import os

import torch
import torch.distributed as dist
from numba import cuda

import pnex_magic as pnex


@pnex.jit(n_threads="x.numel()")
def leaky(x: pnex.In("f32", (None, None)), slope: float, y: pnex.Out("f32", "x")):
    i = cuda.grid(1)
    if i < x.size:
        r, c = divmod(i, x.shape[1])
        v = x[r, c]
        y[r, c] = v if v > 0 else v * slope


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.slope = inputs[1]


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return torch.where(x > 0, grad, grad * ctx.slope), None


leaky.register_autograd(_backward, setup_context=_setup)


class Net(torch.nn.Module):
    def __init__(self, use_pnex: bool):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 8)
        self.use_pnex = use_pnex

    def forward(self, x):
        h = self.fc1(x)
        h = leaky(h, 0.1) if self.use_pnex else torch.nn.functional.leaky_relu(h, 0.1)
        return self.fc2(h)


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    model = Net(True).cuda()
    reference = Net(False).cuda()
    reference.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    torch.manual_seed(100 + rank)
    x = torch.randn(32, 64, device="cuda")
    target = torch.randn(32, 8, device="cuda")
    loss = torch.nn.functional.mse_loss(ddp(x), target)
    loss.backward()
    # reference: the mean of every rank's gradient, computed with plain PyTorch
    ref_loss = torch.nn.functional.mse_loss(reference(x), target)
    ref_loss.backward()
    for p in reference.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    print(f"rank {rank} on cuda:{local}: DDP gradients through pnex op match (loss {loss.item():.4f})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
