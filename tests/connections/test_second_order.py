"""Second derivatives through every design (a gradient penalty ‖∂L/∂x‖², a Hessian-vector product): the fused
backwards and the C kernels, differentiated again, agree with finite differences (gradgradcheck over the input and
every parameter) in both layouts, and with the plain formulas where the outer gradient is a constant."""

import pytest
import torch
from torch.func import functional_call

import skiplab
from skiplab.connections import REGISTRY, kernels, parse_spec, plain_formulas
from skiplab.models.linear_ce import linear_cross_entropy
from tests.connections.test_registry import EXAMPLES

D = 6


def setup(spec: str, layout: str):
    """(f(x, *params), (x, *params)): the connection on a tanh branch in float64, its parameters as inputs."""
    torch.manual_seed(0)
    conn = skiplab.connection(spec, D, layout=layout).double()
    lin = (torch.nn.Linear(D, D) if layout == "seq" else torch.nn.Conv2d(D, D, 1)).double()
    x = torch.randn(*((2, 3, D) if layout == "seq" else (2, D, 3, 3)), dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in conn.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in conn.named_parameters()]
    stack_in = skiplab.input_norm(conn.spec, D).double() if conn.needs_stack else None

    def f(x, *ps):
        h = stack_in(x) if stack_in is not None else x
        y = functional_call(conn, dict(zip(names, ps)), (h, lambda u: torch.tanh(lin(u))))
        return y.sum(-2) if conn.needs_stack else y

    return f, (x, *params)


def penalty_grads(f, inputs, plain: bool):
    """∂/∂(x, params) of ‖∂⟨w, f⟩/∂x‖² for a fixed w: the gradient penalty, whose outer gradient is a constant."""
    x, *params = (t.detach().clone().requires_grad_() for t in inputs)
    with plain_formulas() if plain else torch.enable_grad():
        y = f(x, *params)
        w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view(y.shape)
        (gx,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), (x, *params), allow_unused=True)


@pytest.mark.parametrize("spec", EXAMPLES)
def test_second_derivatives_match_finite_differences(spec, layout):
    if layout == "conv" and REGISTRY[parse_spec(spec).name].needs_stack:
        return  # hyper-connections' streams: seq only
    f, inputs = setup(spec, layout)
    if parse_spec(spec).name != "nGPT":  # asked for a graph, the first derivative is the one asked for without
        y = f(*inputs)
        w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view(y.shape)
        once = torch.autograd.grad((y * w).sum(), inputs, retain_graph=True, allow_unused=True)
        graphed = torch.autograd.grad((y * w).sum(), inputs, create_graph=True, allow_unused=True)
        for a, b in zip(once, graphed):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    if parse_spec(spec).name == "nGPT":  # its unit norm keeps no input to differentiate from: it says so
        with pytest.raises(RuntimeError, match="plain_formulas"):
            torch.autograd.gradgradcheck(f, inputs, fast_mode=True)
        with plain_formulas():
            assert torch.autograd.gradgradcheck(f, inputs, fast_mode=True)
        return
    assert torch.autograd.gradgradcheck(f, inputs, fast_mode=True)


@pytest.mark.parametrize("spec,layout", [("SAS", "seq"), ("SAS", "conv"), ("SAS(gate=single)", "seq"),
                                         ("2rSkip+LN", "conv"), ("3rSkip+LN", "conv"), ("2xSkip+RMS", "conv"),
                                         ("PreRMS", "seq"), ("HC", "seq"), ("mHC", "seq"), ("mHC+RMS", "seq")])
def test_a_gradient_penalty_equals_the_plain_formulas(spec, layout):
    """The penalty's gradient with the fused paths (the C kernels where they run) equals the plain formulas' (autograd
    all the way): once_differentiable handed back the first gradient as a constant here, silently."""
    f, inputs = setup(spec, layout)
    fused = penalty_grads(f, inputs, plain=False)
    plain = penalty_grads(f, inputs, plain=True)
    assert fused[0] is not None and fused[0].abs().sum() > 0
    for a, b, t in zip(fused, plain, inputs):  # None: the penalty does not depend on it (a last bias), as zeros
        torch.testing.assert_close(torch.zeros_like(t) if a is None else a, torch.zeros_like(t) if b is None else b,
                                   rtol=1e-9, atol=1e-11)


@pytest.mark.skipif(kernels.load("add_group_norm") is None, reason="no C compiler on this machine")
def test_the_kernels_run_in_the_penalty_cases():
    """The cases above reach the C kernels: the chain's node is the kernel's."""
    f, (x, *params) = setup("2rSkip+LN", "conv")
    assert type(f(x, *params).grad_fn).__name__.startswith("_AddGroupNorm")


def test_the_chunked_head_loss_refuses_a_second_derivative_and_plain_formulas_give_eagers():
    """It makes its gradient in the forward (no logits kept: its point): asked for a graph it says so in one line;
    inside plain_formulas it is the eager loss, whose second derivative autograd takes."""
    torch.manual_seed(0)
    h = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 7, (10,))
    y[3] = -100
    with pytest.raises(RuntimeError, match="no second derivative: use head_loss eager"):
        torch.autograd.grad(linear_cross_entropy(h, w, y, "chunked", chunk=3), h, create_graph=True)

    def grads(impl):
        (gh,) = torch.autograd.grad(linear_cross_entropy(h, w, y, impl, chunk=3), h, create_graph=True)
        return torch.autograd.grad(gh.square().sum(), (h, w))

    with plain_formulas():
        chunked = grads("chunked")
    for a, b in zip(chunked, grads("eager")):
        torch.testing.assert_close(a, b)
