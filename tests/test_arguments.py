"""Arguments a kernel can be handed wrongly, and the interface rules that prevent it:

* an ``InMut`` tensor whose elements overlap (an ``expand()``-ed view), or that shares
  memory with another argument, is refused as torch's in-place operators refuse it,
  unless the aliasing is declared with ``InMut(..., may_alias=...)``;
* scalar parameters may have defaults (``s: float = 1.0``, schema ``float s=1.0``),
  in every way of calling the op; nothing else may;
* a kernel with no ``Out`` and no ``InMut`` can have no effect and is refused;
* with grad mode on, an ``InMut`` tensor that requires grad is refused (autograd cannot
  see the kernel's writes), through the op object, ``torch.ops.pnex`` and
  ``torch.compile``; under ``torch.no_grad()`` or ``inference_mode`` it is written.

CPU tests run the op's Python path (the simulator); the ``gpu`` tests at the end run
the same checks in the C++ launcher and the Python driver launcher."""

import pytest
import torch
from numba import cuda

import pnex_magic as pnex
from pnex_magic import ArgumentShapeError, ArgumentTypeError, KernelDefinitionError
from pnex_magic.calls import launch_info
from pnex_magic.launch.description import describe_launch


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _distinct(fn, variant):
    """Give each variant its own op: an op's name comes from where the kernel was
    defined, and a same-signature redefinition re-points every earlier op object."""
    fn.__qualname__ = f"{fn.__qualname__}[{variant!r}]"
    return pnex.jit(n_threads=f"{next(iter(fn.__annotations__))}.numel()")(fn)


def make_accumulate(may_alias=False):
    """acc += a * s: each thread reads then writes only its own element, so it is safe
    when ``acc`` is ``a`` (what ``may_alias`` declares)."""

    def accumulate(
        a: pnex.In("f32", (None,)),
        acc: pnex.InMut("f32", "a", may_alias=may_alias),
        s: float,
    ):
        i = cuda.grid(1)
        if i < a.shape[0]:
            acc[i] += a[i] * s

    return _distinct(accumulate, may_alias)


def make_swap(may_alias=False):
    def swap(x: pnex.InMut("f32", (None,)), y: pnex.InMut("f32", "x", may_alias=may_alias)):
        i = cuda.grid(1)
        if i < x.shape[0]:
            t = x[i]
            x[i] = y[i]
            y[i] = t

    return _distinct(swap, may_alias)


accumulate = make_accumulate()

OVERLAP_WORDS = r"argument 'acc' is written by the kernel \(InMut\), but more than one of its elements refers to a single memory location"
ALIAS_WORDS = r"arguments 'acc' \(InMut\) and 'a' \(In\) share memory.*may_alias='a'"


# ---------------------------------------------------------------- internal overlap


@pytest.mark.parametrize(
    "make_acc",
    [lambda: torch.zeros(1).expand(6), lambda: torch.broadcast_to(torch.zeros(2, 1), (2, 3))[1]],
    ids=["expand", "row-of-a-broadcast"],
)
def test_inmut_with_overlapping_elements_is_refused(make_acc):
    acc = make_acc()
    assert acc.stride() == (0,) and acc.shape[0] > 1
    base = acc._base if acc._base is not None else acc
    before = base.clone()
    with pytest.raises(ArgumentShapeError, match=rf"accumulate\(\): {OVERLAP_WORDS}.*acc.clone\(\)"):
        accumulate(rand(acc.shape[0], seed=1), acc, 2.0)
    assert torch.equal(base, before)  # nothing was written


def test_overlap_checks_only_what_the_kernel_writes():
    a = rand(1, seed=2).expand(6)  # an expanded In is read, never written: fine
    acc = rand(6, seed=3)
    expected = acc + a * 2.0
    accumulate(a, acc, 2.0)
    torch.testing.assert_close(acc, expected)
    # A stride-0 axis of size 1 holds one element: nothing overlaps.
    acc1 = torch.full((1,), 7.0).expand(1)
    one = rand(1, seed=4)
    accumulate(one, acc1, 3.0)
    torch.testing.assert_close(acc1, 7.0 + one * 3.0)


def test_overlap_is_refused_before_anything_runs_in_every_python_path():
    acc = torch.zeros(1).expand(4)
    with pytest.raises(ArgumentShapeError, match=OVERLAP_WORDS):
        launch_info(accumulate.spec, (rand(4, seed=5), acc, 1.0))  # what %%pnex --args checks

    @torch.compile(fullgraph=True)
    def f(a, acc):
        accumulate(a, acc, 2.0)
        return acc

    with pytest.raises(Exception, match=OVERLAP_WORDS):  # raised by the fake implementation while tracing
        f(rand(4, seed=6), acc)


# ---------------------------------------------------------------- aliasing between arguments


def test_same_tensor_as_in_and_inmut_is_refused_naming_both():
    a = rand(5, seed=7)
    before = a.clone()
    with pytest.raises(ArgumentShapeError, match=rf"accumulate\(\): {ALIAS_WORDS}"):
        accumulate(a, a, 1.0)
    assert torch.equal(a, before)
    x = rand(10, seed=8)
    with pytest.raises(ArgumentShapeError, match=ALIAS_WORDS):  # views that overlap
        accumulate(x[:6], x[3:9], 1.0)
    with pytest.raises(ArgumentShapeError, match=ALIAS_WORDS):  # equal views, not the same tensor object
        accumulate(x[:5], x[:5], 1.0)
    accumulate(x[:0], x[:0], 1.0)  # empty: nothing to share


def test_two_inmuts_sharing_memory_are_refused():
    swap = make_swap()
    x = rand(6, seed=9)
    with pytest.raises(ArgumentShapeError, match=r"swap\(\): arguments 'x' \(InMut\) and 'y' \(InMut\) share memory.*writes it too"):
        swap(x, x)
    with pytest.raises(ArgumentShapeError, match=r"'x' \(InMut\) and 'y' \(InMut\) share memory"):
        swap(x[:4], x[2:])
    y = rand(6, seed=10)
    x0, y0 = x.clone(), y.clone()
    swap(x, y)
    assert torch.equal(x, y0) and torch.equal(y, x0)


def test_views_that_do_not_overlap_are_accepted():
    x = rand(12, seed=11)
    reference = x.clone()
    reference[6:] += reference[:6] * 3.0
    accumulate(x[:6], x[6:], 3.0)  # one storage, disjoint halves
    torch.testing.assert_close(x, reference)
    # Interleaved strided views (not dense): not judged, as torch's in-place operators.
    y = rand(12, seed=12)
    reference = y.clone()
    reference[1::2] += reference[::2] * -1.0
    accumulate(y[::2], y[1::2], -1.0)
    torch.testing.assert_close(y, reference)


def test_transposed_view_of_the_same_memory_is_refused():
    @pnex.jit(n_threads=("m.size(1)", "m.size(0)"))
    def add_rows(m: pnex.In("f32", (None, None)), acc: pnex.InMut("f32", "m")):
        x, y = cuda.grid(2)
        if y < m.shape[0] and x < m.shape[1]:
            acc[y, x] += m[y, x]

    m = rand(4, 4, seed=13)
    with pytest.raises(ArgumentShapeError, match=r"add_rows\(\): arguments 'acc' \(InMut\) and 'm' \(In\) share memory"):
        add_rows(m, m.t())


def test_declared_aliasing_is_allowed():
    inplace = make_accumulate(may_alias="a")
    assert inplace.spec.param("acc").may_alias == ("a",)
    assert "may_alias=('a',)" in inplace.spec.param("acc").describe()
    a = rand(7, seed=14)
    expected = a * (1 + 2.5)
    inplace(a, a, 2.5)  # acc is a: a += a * 2.5
    torch.testing.assert_close(a, expected)
    still_checked = torch.zeros(1).expand(7)
    with pytest.raises(ArgumentShapeError, match=OVERLAP_WORDS):  # overlap within acc is never allowed
        inplace(rand(7, seed=15), still_checked, 1.0)
    # may_alias=True: any other tensor argument; on the second of two InMuts it covers the pair.
    assert make_accumulate(may_alias=True).spec.overlap_checks == ()
    swap = make_swap(may_alias="x")
    assert swap.spec.overlap_checks == ()
    x = rand(5, seed=16)
    x0 = x.clone()
    swap(x, x)  # swapping an element with itself
    assert torch.equal(x, x0)


def test_declared_aliasing_under_torch_compile():
    inplace = make_accumulate(may_alias=True)

    @torch.compile(fullgraph=True)
    def f(a):
        inplace(a, a, 0.5)
        return a

    a = rand(6, seed=17)
    expected = a * 1.5
    torch.testing.assert_close(f(a), expected)
    torch.testing.assert_close(a, expected)

    @torch.compile(fullgraph=True)
    def g(a):
        accumulate(a, a, 0.5)
        return a

    with pytest.raises(Exception, match=ALIAS_WORDS):
        g(rand(6, seed=18))


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("b", r"may_alias names 'b', which is not another In or InMut parameter \(those are: a\)"),
        ("acc", r"may_alias names 'acc'"),
        (("a", 3), r"may_alias must be True, False, a parameter name or a tuple of names, got \('a', 3\)"),
        (1.5, r"may_alias must be True, False"),
    ],
)
def test_may_alias_must_name_other_tensor_arguments(option, words):
    with pytest.raises(KernelDefinitionError, match=rf"kernel 'accumulate', parameter 'acc': {words}"):
        make_accumulate(may_alias=option)


def test_launch_description_carries_the_memory_checks():
    d = describe_launch(accumulate.spec)
    assert [i for i, _ in d["internal_overlap"]] == [1]
    [[written, other, message]] = d["overlap"]
    assert (written, other) == (1, 0) and "'acc' (InMut) and 'a' (In) share memory" in message
    assert describe_launch(make_accumulate(may_alias="a").spec)["overlap"] == []
    d = describe_launch(make_swap().spec)
    assert [i for i, _ in d["internal_overlap"]] == [0, 1] and [(w, o) for w, o, _ in d["overlap"]] == [(0, 1)]


# ---------------------------------------------------------------- scalar defaults


@pnex.jit(n_threads="a.numel()")
def axpb(
    a: pnex.In("f32", (None,)),
    out: pnex.Out("f32", "a"),
    s: float = 1.5,
    n: int = 3,
    flip: bool = False,
):
    i = cuda.grid(1)
    if i < a.shape[0]:
        v = a[i] * s + n
        out[i] = -v if flip else v


def axpb_reference(a, s=1.5, n=3, flip=False):
    v = a.double() * s + n
    return (-v if flip else v).float()


def test_defaults_are_in_the_schema_and_the_signature():
    assert axpb.spec.schema == "(Tensor a, float s=1.5, int n=3, bool flip=False) -> Tensor"
    assert str(axpb._opoverload._schema).endswith("(Tensor a, float s=1.5, int n=3, bool flip=False) -> Tensor")
    assert "s: float = 1.5, n: int = 3, flip: bool = False" in axpb.spec.python_signature()
    assert axpb.spec.param("s").describe() == "Scalar(float32, default=1.5)"


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((), {}, {}),
        ((2.0,), {}, {"s": 2.0}),
        ((1.5, 3, False), {}, {}),  # every value equal to its default: the dispatcher drops them
        ((1.5,), {"flip": True}, {"flip": True}),
        ((), {"n": -4}, {"n": -4}),
        ((0.25, 7, True), {}, {"s": 0.25, "n": 7, "flip": True}),
    ],
)
def test_defaults_fill_what_the_call_leaves_out(args, kwargs, expected):
    a = rand(9, seed=19)
    out = axpb(a, *args, **kwargs)
    torch.testing.assert_close(out, axpb_reference(a, **expected))


def test_defaults_through_the_dispatcher_compile_and_opcheck():
    a = rand(8, seed=20)
    packet = getattr(torch.ops.pnex, axpb.definition.op_name)
    torch.testing.assert_close(packet(a), axpb_reference(a))
    torch.testing.assert_close(packet.default(a, 2.0), axpb_reference(a, s=2.0))
    torch.testing.assert_close(packet(a, n=1), axpb_reference(a, n=1))

    @torch.compile(fullgraph=True)
    def f(a):
        return axpb(a) + axpb(a, 0.5, flip=True)

    torch.testing.assert_close(f(a), axpb_reference(a) + axpb_reference(a, s=0.5, flip=True))
    torch.library.opcheck(axpb, (a,))
    torch.library.opcheck(axpb, (a, 2.0, 1, True))
    info = launch_info(axpb.spec, (a,))  # what %%pnex --args (a,) checks
    assert info.n_threads == (8,)


def test_defaults_reach_the_backward_kernel():
    @pnex.jit(n_threads="x.numel()")
    def scaled(x: pnex.In("f64", (None,)), y: pnex.Out("f64", "x"), c: float = 3.0):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i] * x[i] * c

    @pnex.autograd.backward_of(scaled)
    @pnex.jit(n_threads="x.numel()")
    def scaled_backward(
        grad_y: pnex.In("f64", (None,)), x: pnex.In("f64", "grad_y"), c: float, grad_x: pnex.Out("f64", "x")
    ):
        i = cuda.grid(1)
        if i < x.shape[0]:
            grad_x[i] = 2 * x[i] * c * grad_y[i]

    for args, c in (((), 3.0), ((3.0,), 3.0), ((-0.5,), -0.5)):
        x = rand(5, seed=21).double().requires_grad_()
        scaled(x, *args).sum().backward()
        torch.testing.assert_close(x.grad, 2 * x.detach() * c)


def test_missing_arguments_without_defaults_are_still_named():
    with pytest.raises(ArgumentTypeError, match=r"axpb\(\) is missing argument\(s\) 'a'; it takes \(a, s, n, flip\)"):
        axpb()
    with pytest.raises(ArgumentTypeError, match=r"axpb\(\) takes 4 argument\(s\) \(a, s, n, flip\) but 5 were given"):
        axpb(rand(3, seed=22), 1.0, 2, True, 5)


def _kernel_with(annotation_text: str, default: str):
    namespace = {"pnex": pnex, "cuda": cuda}
    exec(  # noqa: S102 -- builds one kernel per parametrised case
        "def k(a: pnex.In('f32', (None,)), out: pnex.Out('f32', 'a'), "
        f"p: {annotation_text} = {default}):\n    pass\n",
        namespace,
    )
    return namespace["k"]


@pytest.mark.parametrize(
    ("annotation", "default", "words"),
    [
        ("pnex.In('f32', 'a')", "None", r"has a default value \(None\), but only scalar parameters can "
         r"have defaults, and this is an In tensor"),
        ("pnex.InMut('f32', 'a')", "None", r"this is an InMut tensor"),
        ("pnex.Out('f32', 'a')", "None", r"this is an Out tensor \(the op creates it\).*put the scalar after the tensor"),
        ("pnex.Unused", "None", r"this is an Unused parameter"),
        ("float", "None", r"the default None is not an int or a float \(the parameter is float32\)"),
        ("float", "'1.0'", r"the default '1.0' is not an int or a float"),
        ("float", "True", r"the default True is not an int or a float"),
        ("int", "1.5", r"the default 1.5 is not an int \(the parameter is int64\)"),
        ("bool", "1", r"the default 1 is not a bool"),
        ("float", "float('inf')", r"the default inf is not finite"),
        ("pnex.Scalar('i8')", "300", r"default=300 does not fit in the parameter's dtype, int8"),
        ("pnex.Scalar('u8')", "-1", r"default=-1 does not fit in the parameter's dtype, uint8"),
    ],
)
def test_what_cannot_have_a_default_is_refused(annotation, default, words):
    with pytest.raises(KernelDefinitionError, match=rf"(?s)kernel 'k', parameter 'p'.*{words}"):
        pnex.jit(n_threads="a.numel()")(_kernel_with(annotation, default))


def test_int_default_for_a_float_parameter_becomes_a_float():
    op = pnex.jit(n_threads="a.numel()")(_kernel_with("float", "2"))
    assert op.spec.param("p").default == 2.0 and isinstance(op.spec.param("p").default, float)
    assert op.spec.schema.endswith("float p=2.0) -> Tensor")


# ---------------------------------------------------------------- kernels that can have no effect


def test_kernel_without_out_or_inmut_is_refused():
    def reads_only(a: pnex.In("f32", (None,)), s: float):
        i = cuda.grid(1)
        if i < a.shape[0]:
            print(a[i] * s)

    with pytest.raises(KernelDefinitionError, match=r"kernel 'reads_only' has no Out and no InMut parameter, so it "
                       r"can have no effect.*Out\(dtype, shape\).*InMut\(dtype, shape\)"):
        pnex.jit(n_threads="a.numel()")(reads_only)


# ---------------------------------------------------------------- InMut tensors that require grad


def make_accumulate_double():
    """acc += a; out = 2 * a: an InMut and an Out."""

    @pnex.jit(n_threads="a.numel()")
    def accumulate_double(a: pnex.In("f32", (None,)), acc: pnex.InMut("f32", "a"), out: pnex.Out("f32", "a")):
        i = cuda.grid(1)
        if i < a.shape[0]:
            acc[i] += a[i]
            out[i] = a[i] * 2.0

    return accumulate_double


def grad_words(name):
    return (
        rf"argument '{name}' is written in place by the kernel \(InMut\) while grad mode is on.*"
        rf"torch\.no_grad\(\).*{name} as an Out that the op returns, with a backward attached"
    )


REQUIRING_GRAD = {
    "leaf": lambda n, device: torch.randn(n, device=device, requires_grad=True),
    "non-leaf": lambda n, device: torch.randn(n, device=device, requires_grad=True) * 1.5,
}


def _callers(op):
    return {"op object": op, "torch.ops": getattr(torch.ops.pnex, op.definition.op_name)}


def check_inmut_requiring_grad(op, device):
    """The refusals and what stays allowed, through the op object and torch.ops."""
    n = 257
    for kind, make in REQUIRING_GRAD.items():
        for how, call in _callers(op).items():
            a, acc = torch.randn(n, device=device), make(n, device)
            before = acc.detach().clone()
            with pytest.raises(ArgumentTypeError, match=rf"accumulate_double\(\): {grad_words('acc')}") as caught:
                call(a, acc)
            assert ("a leaf tensor" if kind == "leaf" else "computed from tensors that do") in str(caught.value)
            assert torch.equal(acc.detach(), before), f"{kind}, {how}: the refused call wrote acc"
            for mode in (torch.no_grad, torch.inference_mode):
                expected = acc.detach() + a
                with mode():
                    out = call(a, acc)
                torch.testing.assert_close(acc.detach(), expected)
                torch.testing.assert_close(out, a * 2)
            assert acc.requires_grad
    # Only the In requires grad: allowed; autograd's "not implemented" answer stays for the Out.
    a, acc = torch.randn(n, device=device, requires_grad=True), torch.randn(n, device=device)
    expected = acc + a.detach()
    out = op(a, acc)
    torch.testing.assert_close(acc, expected)
    torch.testing.assert_close(out.detach(), a.detach() * 2)
    assert out.requires_grad
    with pytest.raises(RuntimeError, match="not implemented|no autograd formula"):
        out.sum().backward()


def check_inmut_requiring_grad_under_compile(op, device):
    compiled = torch.compile(lambda a, acc: op(a, acc) + 1, fullgraph=True)
    a, acc = torch.randn(300, device=device), REQUIRING_GRAD["non-leaf"](300, device)
    with pytest.raises(Exception, match=grad_words("acc")) as caught:  # at tracing, on fake tensors
        compiled(a, acc)
    chain, error = [], caught.value
    while error is not None:
        chain.append(error)
        error = error.__cause__
    assert any(isinstance(e, ArgumentTypeError) for e in chain), chain
    expected = acc.detach() + a
    with torch.no_grad():
        out = compiled(a, acc)
    torch.testing.assert_close(acc.detach(), expected)
    torch.testing.assert_close(out, a * 2 + 1)


def test_inmut_requiring_grad_is_refused_with_grad_mode_on():
    check_inmut_requiring_grad(make_accumulate_double(), "cpu")


def test_inmut_requiring_grad_under_torch_compile():
    check_inmut_requiring_grad_under_compile(make_accumulate_double(), "cpu")


def test_the_refusal_names_the_inmut_that_requires_grad():
    swap = make_swap()
    x, y = torch.randn(40), torch.randn(40, requires_grad=True) * 3
    with pytest.raises(ArgumentTypeError, match=rf"swap\(\): {grad_words('y')}"):
        swap(x, y)
    with pytest.raises(ArgumentTypeError, match=rf"swap\(\): {grad_words('x')}"):
        swap(y, x)
    with torch.no_grad():
        x0, y0 = x.clone(), y.detach().clone()
        swap(x, y)
    assert torch.equal(x, y0) and torch.equal(y.detach(), x0)


# ---------------------------------------------------------------- the same on a GPU


@pytest.fixture(params=["native", "driver"])
def gpu_launcher(request, monkeypatch):
    monkeypatch.setenv("PNEX_LAUNCHER", request.param)
    return request.param


@pytest.mark.gpu
def test_memory_checks_on_gpu(gpu_launcher):
    op = make_accumulate()
    assert op._native == (gpu_launcher == "native")
    a = torch.randn(1000, device="cuda")
    expanded = torch.zeros(1, device="cuda").expand(1000)
    with pytest.raises(ArgumentShapeError, match=rf"accumulate\(\): {OVERLAP_WORDS}"):
        op(a, expanded, 1.0)
    with pytest.raises(ArgumentShapeError, match=rf"accumulate\(\): {ALIAS_WORDS}"):
        op(a, a, 1.0)
    x = torch.randn(2000, device="cuda")
    with pytest.raises(ArgumentShapeError, match=ALIAS_WORDS):
        op(x[:1000], x[500:1500], 1.0)
    reference = x.clone()
    reference[1000:] += reference[:1000] * 2.0
    op(x[:1000], x[1000:], 2.0)
    torch.testing.assert_close(x, reference)
    swap = make_swap()
    with pytest.raises(ArgumentShapeError, match=r"swap\(\): arguments 'x' \(InMut\) and 'y' \(InMut\) share memory"):
        swap(a, a)
    inplace = make_accumulate(may_alias="a")
    expected = a * 1.25
    inplace(a, a, 0.25)
    torch.testing.assert_close(a, expected)


@pytest.mark.gpu
def test_defaults_on_gpu(gpu_launcher):
    op = pnex.jit(n_threads="a.numel()")(axpb.definition.fn)
    assert op._native == (gpu_launcher == "native")
    a = torch.randn(3000, device="cuda")
    torch.testing.assert_close(op(a), axpb_reference(a))
    torch.testing.assert_close(op(a, 1.5, 3, False), axpb_reference(a))
    torch.testing.assert_close(op(a, -2.0, flip=True), axpb_reference(a, s=-2.0, flip=True))
    packet = getattr(torch.ops.pnex, op.definition.op_name)
    torch.testing.assert_close(packet(a, n=5), axpb_reference(a, n=5))  # the dispatcher fills s and flip


@pytest.mark.gpu
def test_inmut_requiring_grad_on_gpu(gpu_launcher):
    op = make_accumulate_double()
    assert op._native == (gpu_launcher == "native")
    check_inmut_requiring_grad(op, "cuda")
    check_inmut_requiring_grad_under_compile(op, "cuda")
