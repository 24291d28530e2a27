"""The LLTM workload: the recurrent cell of PyTorch's C++/CUDA extension tutorial, its
element-wise part fused into a pnex forward kernel and a pnex backward kernel wired into
autograd (:func:`lltm_ops`, one pair per dtype), the tutorial's eager model (:class:`LLTM`)
and references, a small training loop, and :func:`bench_lltm` (forward + backward against
eager and ``torch.compile``, the goal judged round by round)."""

# No `from __future__ import annotations`: kernel annotations such as pnex.In(DTYPE, ...)
# must be evaluated where they are written (DTYPE is a local of lltm_ops).
import math
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from numba import cuda

import pnex_magic as pnex
from pnex_magic.autograd import attach_backward
from workloads_lib.provenance import named_in_workloads
from workloads_lib.results import COMPILED, COMPILED_GRAPHS, EAGER, Row, Workload, _check_close, _fmt_us
from workloads_lib.rounds import _each_round, _run_rounds
from workloads_lib.timing import host_seconds, time_per_call

__all__ = [
    "LLTM", "LLTMPnex", "LLTMOps", "LLTM_THREADS_PER_BLOCK", "lltm_ops", "lltm_forward", "lltm_backward",
    "lltm_cell_reference", "lltm_cell_backward_reference", "train_lltm", "bench_lltm",
]


class LLTM(torch.nn.Module):
    """The tutorial's LLTM cell in plain PyTorch (its "Python version")."""

    def __init__(self, input_features: int, state_size: int):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        # 3 * state_size for input gate, output gate and candidate cell gate.
        # input_features + state_size because we will multiply with [input, h].
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size))
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.state_size)
        for weight in self.parameters():
            weight.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):
        old_h, old_cell = state
        X = torch.cat([old_h, input], dim=1)
        # Compute the input, output and candidate cell gates with one MM.
        gate_weights = F.linear(X, self.weights, self.bias)
        # Split the combined gate weight matrix into its components.
        gates = gate_weights.chunk(3, dim=1)
        input_gate = torch.sigmoid(gates[0])
        output_gate = torch.sigmoid(gates[1])
        # Here we use an ELU instead of the usual tanh.
        candidate_cell = F.elu(gates[2])
        # Compute the new cell state.
        new_cell = old_cell + candidate_cell * input_gate
        # Compute the new hidden state and output.
        new_h = torch.tanh(new_cell) * output_gate
        return new_h, new_cell


def lltm_cell_reference(gates: torch.Tensor, old_cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's element-wise part (after the matmul) in eager PyTorch:
    what ``lltm_forward`` fuses into one kernel."""
    ig, og, cc = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(cc) * torch.sigmoid(ig)
    return torch.tanh(new_cell) * torch.sigmoid(og), new_cell


def lltm_cell_backward_reference(
    grad_new_h: torch.Tensor, grad_new_cell: torch.Tensor, gates: torch.Tensor, new_cell: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tutorial's ``lltm_backward`` up to ``d_gates`` (before its matmuls), in eager
    PyTorch: what ``lltm_backward`` fuses into one kernel.  Returns (d_gates, d_old_cell)."""
    gate_in, gate_out, gate_cand = gates.chunk(3, dim=1)
    input_gate, output_gate = torch.sigmoid(gate_in), torch.sigmoid(gate_out)
    candidate_cell = F.elu(gate_cand)
    d_output_gate = torch.tanh(new_cell) * grad_new_h
    d_tanh_new_cell = output_gate * grad_new_h
    d_new_cell = (1 - torch.tanh(new_cell) ** 2) * d_tanh_new_cell + grad_new_cell
    d_old_cell = d_new_cell
    d_candidate_cell = input_gate * d_new_cell
    d_input_gate = candidate_cell * d_new_cell
    d_input_gate = d_input_gate * (1 - input_gate) * input_gate  # d_sigmoid
    d_output_gate = d_output_gate * (1 - output_gate) * output_gate
    e = gate_cand.exp()  # d_elu, alpha = 1
    d_candidate_cell = d_candidate_cell * ((gate_cand > 0).type_as(e) + ((e - 1) < 0).type_as(e) * e)
    return torch.cat([d_input_gate, d_output_gate, d_candidate_cell], dim=1), d_old_cell


class LLTMOps(NamedTuple):
    forward: Any  #: (gates, old_cell) -> (new_h, new_cell), with autograd
    backward: Any  #: (grad_new_h, grad_new_cell, gates, new_cell) -> (grad_gates, grad_old_cell)


LLTM_THREADS_PER_BLOCK = (128, 2)
_lltm_cache: dict = {}


def lltm_ops(dtype: torch.dtype = torch.float32) -> LLTMOps:
    """The LLTM's fused kernels for ``dtype`` (float32 for speed, float64 for
    gradcheck), the backward attached to the forward.  Made once per dtype."""
    if dtype in _lltm_cache:
        return _lltm_cache[dtype]
    import numba

    DTYPE = dtype
    # The kernels' float type, for literals: real(1.0) keeps float32 kernels in single
    # precision (a bare 1.0 is a float64 and would promote the arithmetic).
    real = numba.from_dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    suffix = "" if dtype == torch.float32 else "_" + str(dtype).removeprefix("torch.")

    def lltm_forward(
        gates: pnex.In(DTYPE, (None, None)),
        old_cell: pnex.In(DTYPE, ("gates.size(0)", "gates.size(1) // 3")),
        new_h: pnex.Out(DTYPE, "old_cell"),
        new_cell: pnex.Out(DTYPE, "old_cell"),
    ):
        # gates = [input, output, candidate] pre-activations, from X @ W.T + b (one matmul)
        s, b = cuda.grid(2)
        S = old_cell.shape[1]
        if b < old_cell.shape[0] and s < S:
            one = real(1.0)
            input_gate = one / (one + math.exp(-gates[b, s]))
            output_gate = one / (one + math.exp(-gates[b, S + s]))
            z = gates[b, 2 * S + s]
            candidate_cell = z if z > 0 else math.exp(z) - one  # ELU
            c = old_cell[b, s] + candidate_cell * input_gate
            new_cell[b, s] = c
            new_h[b, s] = math.tanh(c) * output_gate

    def lltm_backward(
        grad_new_h: pnex.In(DTYPE, (None, None)),
        grad_new_cell: pnex.In(DTYPE, "grad_new_h"),
        gates: pnex.In(DTYPE, ("grad_new_h.size(0)", "3 * grad_new_h.size(1)")),
        new_cell: pnex.In(DTYPE, "grad_new_h"),
        grad_gates: pnex.Out(DTYPE, "gates"),
        grad_old_cell: pnex.Out(DTYPE, "grad_new_h"),
    ):
        # Recomputes the activations from the saved gates instead of saving them.
        s, b = cuda.grid(2)
        S = new_cell.shape[1]
        if b < new_cell.shape[0] and s < S:
            one = real(1.0)
            input_gate = one / (one + math.exp(-gates[b, s]))
            output_gate = one / (one + math.exp(-gates[b, S + s]))
            z = gates[b, 2 * S + s]
            if z > 0:
                candidate_cell = z
                d_elu = one
            else:
                e = math.exp(z)
                candidate_cell = e - one
                d_elu = e
            t = math.tanh(new_cell[b, s])
            gh = grad_new_h[b, s]
            d_new_cell = (one - t * t) * output_gate * gh + grad_new_cell[b, s]
            grad_old_cell[b, s] = d_new_cell
            grad_gates[b, s] = candidate_cell * d_new_cell * input_gate * (one - input_gate)
            grad_gates[b, S + s] = t * gh * output_gate * (one - output_gate)
            grad_gates[b, 2 * S + s] = input_gate * d_new_cell * d_elu

    for fn in (lltm_forward, lltm_backward):
        fn.__name__ += suffix  # an op's name comes from its function's: one op per dtype
        fn.__qualname__ = fn.__name__
        named_in_workloads(fn)
    forward = pnex.jit(n_threads=("old_cell.size(1)", "old_cell.size(0)"), threads_per_block=LLTM_THREADS_PER_BLOCK)(
        lltm_forward
    )
    backward = pnex.jit(
        n_threads=("grad_new_h.size(1)", "grad_new_h.size(0)"), threads_per_block=LLTM_THREADS_PER_BLOCK
    )(lltm_backward)
    attach_backward(forward, backward)
    _lltm_cache[dtype] = LLTMOps(forward, backward)
    return _lltm_cache[dtype]


lltm_forward, lltm_backward = lltm_ops(torch.float32)


class LLTMPnex(LLTM):
    """The LLTM with its element-wise part fused into one pnex kernel each way:
    ``gates = addmm(bias, [h, x], W.T)`` (cuBLAS), then ``lltm_forward``; autograd runs
    ``lltm_backward`` and the matmuls' own backward."""

    def __init__(self, input_features: int, state_size: int, forward_op: Any = None):
        super().__init__(input_features, state_size)
        self.forward_op = forward_op

    def forward(self, input, state):
        old_h, old_cell = state
        op = self.forward_op or lltm_ops(self.weights.dtype).forward
        X = torch.cat([old_h, input], dim=1)
        gates = torch.addmm(self.bias, X, self.weights.t())
        return op(gates, old_cell)


def _lltm_data(batch, features, state, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(batch, features, generator=g, dtype=dtype)
    h = torch.randn(batch, state, generator=g, dtype=dtype)
    C = torch.randn(batch, state, generator=g, dtype=dtype)
    return X.to(device), h.to(device), C.to(device)


def train_lltm(
    model: torch.nn.Module,
    teacher: torch.nn.Module,
    *,
    steps: int,
    seq_len: int,
    batch: int,
    lr: float = 0.5,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` for ``steps`` SGD steps to reproduce ``teacher``'s final hidden
    state over a random input sequence of ``seq_len`` steps; returns the losses."""
    p = next(model.parameters())
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(seq_len, batch, model.input_features, generator=g, dtype=p.dtype).to(p.device)

    def run(cell):
        h = torch.zeros(batch, cell.state_size, dtype=p.dtype, device=p.device)
        c = torch.zeros_like(h)
        for x in xs:
            h, c = cell(x, (h, c))
        return h

    with torch.no_grad():
        target = run(teacher)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(run(model), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def bench_lltm(
    batch: int = 16,
    features: int = 32,
    state: int = 128,
    *,
    device: torch.device | str | None = None,
    forward_op: Any = None,
    repeat: int = 10,
    loops: int = 50,
    compile_variants: bool = True,
    rounds: int | None = None,
    compile_modes: tuple[str, ...] = ("default", "reduce-overhead"),
) -> Workload:
    """Forward + backward of one LLTM step, as the tutorial measures it:
    ``new_h, new_C = rnn(X, (h, C)); (new_h.sum() + new_C.sum()).backward()``; every
    variant in each of ``rounds`` interleaved rounds.  The eager model is compiled in
    each of ``compile_modes`` (the CUDA-graph modes on a GPU only); the pnex model in
    the default mode and, on a GPU, ``reduce-overhead``."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    reference = LLTM(features, state).to(device)
    X, h, C = _lltm_data(batch, features, state, device)

    def make_pnex():
        m = LLTMPnex(features, state, forward_op=forward_op).to(device)
        m.load_state_dict(reference.state_dict())
        return m

    def fwd_bwd(rnn, graphs=False):
        # A training step's gradients: set to None first (as optimizer.zero_grad() does),
        # so that no step reads the previous one's; with CUDA graphs, a new step is marked
        # so that the graphs' static outputs may be reused.
        rnn.zero_grad(set_to_none=True)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        new_h, new_C = rnn(X, (h, C))
        (new_h.sum() + new_C.sum()).backward()
        return new_h, new_C

    def once(rnn, graphs=False):
        new_h, new_C = fwd_bwd(rnn, graphs)
        return [t.detach().clone() for t in (new_h, new_C, rnn.weights.grad, rnn.bias.grad)]

    expected = once(reference)

    def variant(name, rnn, *, check=True, graphs=False):
        def run():
            text = ""
            if check:
                got = once(rnn, graphs)
                oks, errs = zip(*(_check_close(a, e, 1e-4) for a, e in zip(got, expected)))
                worst = max(errs, key=lambda s: float(s.split("largest difference ", 1)[1].split()[0]))
                text = ("matches eager: " if all(oks) else "DIFFERS from eager: ") + worst + " (outputs and grads)"
            m = time_per_call(lambda: fwd_bwd(rnn, graphs), device, repeat=repeat, loops=loops, warmup=5)
            host = host_seconds(lambda: fwd_bwd(rnn, graphs), device) if device.type == "cuda" else None
            return Row(name, m.median, check=text, host_seconds=host)

        return run

    rows: list[Row] = []
    variants = [(EAGER, variant(EAGER, reference, check=False))]
    graph_modes = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs
    for mode in compile_modes if compile_variants else ():
        if mode in graph_modes and device.type != "cuda":
            continue
        twin = LLTM(features, state).to(device)
        twin.load_state_dict(reference.state_dict())
        name = {"default": COMPILED, "reduce-overhead": COMPILED_GRAPHS}.get(mode, f"torch.compile(mode='{mode}')")
        compiled = torch.compile(twin) if mode == "default" else torch.compile(twin, mode=mode)
        variants.append((name, variant(name, compiled, graphs=mode in graph_modes)))
    variants.append(("pnex fused kernels (eager)", variant("pnex fused kernels (eager)", make_pnex())))
    if compile_variants:
        name = "pnex fused kernels in torch.compile"
        variants.append((name, variant(name, torch.compile(make_pnex(), fullgraph=True))))
    if compile_variants and device.type == "cuda":
        # CUDA graphs remove the per-launch cost that dominates at the tutorial's size;
        # measured for both, so that neither side is compared with a handicapped other.
        name = "pnex fused kernels in torch.compile(mode='reduce-overhead')"
        variants.append((name, variant(name, torch.compile(make_pnex(), mode="reduce-overhead", fullgraph=True),
                                       graphs=True)))
    _run_rounds(rows, variants, rounds)

    w = Workload("LLTM", f"batch {batch}, {features} features, state {state}", "forward+backward", rows,
                 device=str(device))
    w.headline, mine = w.best("pnex")
    if device.type == "cuda":
        eager = w.seconds(EAGER)
        _, compiled = w.best("torch.compile")
        if (batch, features, state) == (16, 32, 128):
            w.goal = "fastest pnex variant faster than eager and every torch.compile variant in every round"
            ours = [r.variant for r in w.rows if r.variant.startswith("pnex")]
            theirs = [r.variant for r in w.rows if not r.variant.startswith("pnex")]
            verdicts = _each_round(w, ours, theirs)
            w.goal_met = None if not verdicts or None in verdicts else all(verdicts)
            w.goal += f" ({sum(v is True for v in verdicts)} of {len(verdicts)} rounds)"
            if w.goal_met is False:
                w.goal_why = _rounds_lost(w, ours, theirs)
        else:
            w.goal = "fastest pnex variant no slower than eager"
            if None not in (mine, eager):
                w.goal_met = mine <= eager
                if not w.goal_met:
                    w.goal_why = f"{w.headline} takes {_fmt_us(mine)}, eager {_fmt_us(eager)}"
    return w


def _rounds_lost(w: Workload, ours: list[str], theirs: list[str]) -> str:
    """The rounds the pnex variants lost, and to which variant: "lost round 2:
    torch.compile 512.0 µs against 518.3 µs"."""
    by_name = {r.variant: r.rounds for r in w.rows}

    def at(name: str, i: int) -> float | None:
        times = by_name.get(name) or []
        return times[i] if i < len(times) else None

    lost = []
    for i in range(max((len(v) for v in by_name.values()), default=0)):
        mine = [at(n, i) for n in ours if at(n, i) is not None]
        if not mine:
            continue
        beaten = sorted((at(n, i), n) for n in theirs if at(n, i) is not None and at(n, i) <= min(mine))
        if beaten:
            lost.append(f"round {i + 1}: {beaten[0][1]} {_fmt_us(beaten[0][0])} against {_fmt_us(min(mine))}")
    return "lost " + ", ".join(lost) if lost else ""
