"""skiplab's HC and mHC against lucidrains' hyper-connections package (``hyper_connections.py``: HC, static and
dynamic; ``manifold_constrained_hyper_connections.py``: mHC), the same weights copied across.

HC maps one to one. The package's ``HyperConnections(n, dim=D, layer_index=k)`` holds ``static_alpha`` = [A_m | A_r]
(n × (1 + n)), ``dynamic_alpha_fn`` = [W_m | W_r] (D × (1 + n)), ``static_beta`` = B, ``dynamic_beta_fn`` = W_β and the
scales s_α, s_β; it normalises the streams with an RMSNorm without ε whose gain is 1 + γ (skiplab: ``HC+RMS``,
``stream_norm.weight`` = 1 + γ, ε = 0); it has no static kind (``kind=static`` is its dynamic form with W = 0),
hands the branch h₀ itself (skiplab applies the sub-layer's own norm first: the reference branch does it here)
and folds the streams into the batch, (B·n, T, D) against skiplab's (B, T, n, D). Both start from the same
parameters (compared one by one, for each sub-layer index of an 8-layer stack); then, with the weights randomised and
copied across, the outputs and gradients agree, at width 64.

Its mHC is not the paper's parameterisation: it projects each stream on its own, like HC (the paper flattens the n
streams, x̃ = RMSNorm(vec(x)), and projects x̃ with φ), uses HC's initial values as the biases, and stores H^resᵀ,
so that its Sinkhorn–Knopp, the same iteration, starts with H^res's rows. The comparisons where they meet: the
Sinkhorn–Knopp function on one matrix; the whole connection on streams of one RMS per position (there the
per-stream norm and the flattened one agree) with φ block-diagonal and Sinkhorn–Knopp run to convergence; and the
initial maps, which differ by design (asserted below, described in skiplab.connections.hyper.MHC). The package
computes its mHC and its Sinkhorn–Knopp in float32: those comparisons hold to float32's precision, HC's to float64's.

The last test mutates a constant of each design (HC's initial scales, mHC's 2 in H^post = 2σ) and shows the
comparison then fails.
"""

import copy
import importlib.metadata
import math

import pytest
import torch

import skiplab
from skiplab import Place
from skiplab.connections import hyper
from skiplab.connections.hyper import sinkhorn
from tests.noise import assert_within_noise, noise

rearrange = pytest.importorskip("einops").rearrange
_hc = pytest.importorskip("hyper_connections.hyper_connections")
_mhc = pytest.importorskip("hyper_connections.manifold_constrained_hyper_connections")
HyperConnections, get_expand_reduce_stream_functions = _hc.HyperConnections, _hc.get_expand_reduce_stream_functions
ManifoldConstrainedHyperConnections, sinkhorn_knopps = _mhc.ManifoldConstrainedHyperConnections, _mhc.sinkhorn_knopps

HYPER_CONNECTIONS_VERSION = "0.4.11"  # the version these mappings were checked against
D, N = 64, 4


def test_checked_against_the_installed_version():
    assert importlib.metadata.version("hyper-connections") == HYPER_CONNECTIONS_VERSION, (
        "hyper-connections changed: check the mappings in this module and update HYPER_CONNECTIONS_VERSION")


def branch_fn(seed: int = 1) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(D, 2 * D), torch.nn.Tanh(), torch.nn.Linear(2 * D, D)).double()


def streams(seed: int = 0, equal_rms: bool = False) -> torch.Tensor:
    """(B, T, n, D) streams, not centred; ``equal_rms``: the n streams of a position share one RMS."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, N, D, generator=g, dtype=torch.float64) * 1.5 + 0.2
    if equal_rms:
        x = x / x.pow(2).mean(-1, keepdim=True).sqrt() * (1 + torch.rand(2, 3, 1, 1, generator=g, dtype=torch.float64))
    return x.requires_grad_()


def folded(x: torch.Tensor) -> torch.Tensor:  # skiplab's (B, T, n, D) -> the package's (B·n, T, D)
    return rearrange(x, "b t s d -> (b s) t d")


def unfolded(y: torch.Tensor) -> torch.Tensor:
    return rearrange(y, "(b s) t d -> b t s d", s=N)


def through(ref, x: torch.Tensor, branch) -> torch.Tensor:
    """The package's connection around ``branch``: it returns the branch input and the function that adds it back."""
    h, add_residual = ref(x)
    return add_residual(branch(h))


def randomise(module: torch.nn.Module, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def fresh_pair(kind: str, tanh: str = "yes", k: int = 5):
    """skiplab's HC+RMS and the package's HyperConnections for sub-layer k (1-based) of a stack, as each starts."""
    place = Place(k, "encoder", 8)
    ours = skiplab.connection(f"HC+RMS(n={N},kind={kind},tanh={tanh})", D, place=place).double()
    ref = HyperConnections(N, dim=D, layer_index=place.index - 1, tanh=tanh == "yes").double()
    return ours, ref


def same_initial_parameters(ours, ref) -> None:
    """Every parameter of skiplab's HC equals the package's at initialisation: A_m = e_{k mod n} (the package's
    ``layer_index`` = skiplab's 0-based sub-layer index), A_r = I, B = 1; dynamic: W_m, W_r, W_β = 0, s_α = s_β =
    0.01, the stream norm's gain 1 (the package's 1 + γ, γ = 0). skiplab's static kind has no W, s or stream norm:
    the package's static form is its dynamic one with W = 0."""
    with torch.no_grad():
        pairs = [(ours.a_m, ref.static_alpha[:, 0]), (ours.a_r, ref.static_alpha[:, 1:]), (ours.b, ref.static_beta)]
        if ours.dynamic:
            pairs += [(ours.w_m, ref.dynamic_alpha_fn[:, 0]), (ours.w_r, ref.dynamic_alpha_fn[:, 1:]),
                      (ours.w_b, ref.dynamic_beta_fn), (ours.s_alpha, ref.dynamic_alpha_scale),
                      (ours.s_beta, ref.dynamic_beta_scale), (ours.stream_norm.weight, 1 + ref.norm.gamma)]
        else:
            assert not ref.dynamic_alpha_fn.any() and not ref.dynamic_beta_fn.any()
        for got, want in pairs:
            assert got.shape == want.shape and torch.equal(got, want)


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("kind,tanh", [("static", "yes"), ("dynamic", "yes"), ("dynamic", "no")])
def test_hc_starts_from_the_packages_initial_parameters(kind, tanh, k):
    same_initial_parameters(*fresh_pair(kind, tanh, k))


def hc_pair(kind: str, tanh: str = "yes", k: int = 5, kernel: bool = True):
    """skiplab's HC+RMS and the package's HyperConnections for sub-layer k (1-based) of a stack, same weights.
    ``kernel=False``: skiplab's PyTorch path (``hyper_mix``, what CUDA and a machine without the CPU kernels run)
    rather than the CPU kernels."""
    ours, ref = fresh_pair(kind, tanh, k)
    if not kernel:
        ours.kernel = None
    randomise(ours)
    randomise(ref.norm, seed=4)
    with torch.no_grad():
        ref.static_alpha.copy_(torch.cat([ours.a_m[:, None], ours.a_r], 1))
        ref.static_beta.copy_(ours.b)
        if kind == "dynamic":
            assert ours.s_alpha.item() != 0.01  # randomised: the scales are compared too
            ours.stream_norm.weight.copy_(1 + ref.norm.gamma)
            ours.stream_norm.eps = 0.0  # the package's RMSNorm (F.normalize) has no ε
            ref.dynamic_alpha_fn.copy_(torch.cat([ours.w_m[:, None], ours.w_r], 1))
            ref.dynamic_beta_fn.copy_(ours.w_b)
            ref.dynamic_alpha_scale.copy_(ours.s_alpha)
            ref.dynamic_beta_scale.copy_(ours.s_beta)
        else:  # the package's static HC is its dynamic one with the projections at zero
            ref.dynamic_alpha_fn.zero_(), ref.dynamic_beta_fn.zero_()
    return ours, ref


@pytest.mark.parametrize("kernel", [True, False], ids=["kernels", "pytorch"])
@pytest.mark.parametrize("kind,tanh", [("static", "yes"), ("dynamic", "yes"), ("dynamic", "no")])
def test_hc_gives_the_packages_outputs_and_gradients(kind, tanh, kernel):
    ours, ref = hc_pair(kind, tanh, kernel=kernel)
    f = branch_fn()
    ref_norm = copy.deepcopy(ours.norm)  # the sub-layer's own pre-norm, inside the package's branch
    x = streams()
    x_ref = x.detach().clone().requires_grad_()
    y = ours(x, f)
    y_ref = unfolded(through(ref, folded(x_ref), lambda h: f(ref_norm(h))))
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=y.dtype)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    pairs = [(ours.a_m.grad, ref.static_alpha.grad[:, 0]), (ours.a_r.grad, ref.static_alpha.grad[:, 1:]),
             (ours.b.grad, ref.static_beta.grad), (ours.norm.weight.grad, ref_norm.weight.grad)]
    if kind == "dynamic":
        pairs += [(ours.w_m.grad, ref.dynamic_alpha_fn.grad[:, 0]), (ours.w_r.grad, ref.dynamic_alpha_fn.grad[:, 1:]),
                  (ours.w_b.grad, ref.dynamic_beta_fn.grad), (ours.s_alpha.grad, ref.dynamic_alpha_scale.grad),
                  (ours.s_beta.grad, ref.dynamic_beta_scale.grad), (ours.stream_norm.weight.grad, ref.norm.gamma.grad)]
    for got, want in pairs:
        assert want.abs().max() > 1e-6  # a gradient to compare
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernels", "pytorch"])
def test_a_two_layer_hc_stack_with_expansion_and_sum_is_the_packages(kernel):
    """Outputs, the input's gradient and every parameter's, through two layers (the second reads the first's
    streams: the gradient of the first layer's parameters passes through the second's mixes)."""
    pairs = [hc_pair("dynamic", k=k, kernel=kernel) for k in (1, 2)]
    f1, f2 = branch_fn(1), branch_fn(2)
    norms = [copy.deepcopy(ours.norm) for ours, _ in pairs]
    expand, reduce = get_expand_reduce_stream_functions(N)
    final = skiplab.final_norm(f"HC+RMS(n={N})", D).double()
    x = torch.randn(2, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(5), requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    h = skiplab.input_norm(f"HC+RMS(n={N})", D)(x)
    h = pairs[1][0](pairs[0][0](h, f1), f2)
    g = expand(x_ref)
    g = through(pairs[0][1], g, lambda t: f1(norms[0](t)))
    g = through(pairs[1][1], g, lambda t: f2(norms[1](t)))
    y, y_ref = final(h), final[0](reduce(g))  # Σ streams, then the norm
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=y.dtype)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-12)
    for ours, ref in pairs:
        grads = [(ours.a_m.grad, ref.static_alpha.grad[:, 0]), (ours.a_r.grad, ref.static_alpha.grad[:, 1:]),
                 (ours.b.grad, ref.static_beta.grad), (ours.w_m.grad, ref.dynamic_alpha_fn.grad[:, 0]),
                 (ours.w_r.grad, ref.dynamic_alpha_fn.grad[:, 1:]), (ours.w_b.grad, ref.dynamic_beta_fn.grad),
                 (ours.s_alpha.grad, ref.dynamic_alpha_scale.grad), (ours.s_beta.grad, ref.dynamic_beta_scale.grad),
                 (ours.stream_norm.weight.grad, ref.norm.gamma.grad)]
        for got, want in grads:
            assert want.abs().max() > 1e-6
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_sinkhorn_knopp_is_the_packages_on_the_same_matrix():
    logits = (1.5 * torch.randn(3, N, N, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    ref_logits = logits.clone().requires_grad_()
    logits.requires_grad_()
    for iters in (1, 7, 20):  # both: columns, then rows; the package computes in float32
        got, want = sinkhorn(logits, iters), sinkhorn_knopps(ref_logits, iters)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    w = torch.randn(3, N, N, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (got * w).sum().backward(), (want * w).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-6)
    # and against the package's own float32 result, in float32: the same to rounding
    got32 = sinkhorn(logits.detach().float(), 20)
    torch.testing.assert_close(got32, sinkhorn_knopps(logits.detach().float(), 20), rtol=1e-6, atol=1e-7)


def mhc_pair(iters: int, kernel: bool = True):
    """skiplab's mHC and the package's, the package's per-stream projections written as skiplab's block-diagonal φ
    (``kernel=False``: skiplab's PyTorch path rather than the CPU kernels)."""
    ours = skiplab.connection(f"mHC+RMS(n={N},iters={iters})", D, place=Place(2, "encoder", 4)).double()
    if not kernel:
        ours.kernel = None
    ref = ManifoldConstrainedHyperConnections(N, dim=D, layer_index=1, sinkhorn_iters=iters).double()
    randomise(ref, seed=6)
    with torch.no_grad():
        gain = 1 + ref.norm.gamma  # the package's per-stream RMSNorm gain, folded into φ
        fn, beta_fn = ref.dynamic_alpha_fn[0], ref.dynamic_beta_fn  # (D, 1 + n): [pre | res], (D,)
        ours.phi.zero_()
        for s in range(N):
            rows = slice(s * D, (s + 1) * D)  # stream s's block of vec(x)
            ours.phi[rows, s] = gain * fn[:, 0]  # H̃^pre_s from stream s
            ours.phi[rows, N + s] = gain * beta_fn  # H̃^post_s
            for t in range(N):  # the package's logit [s, t] (source s, target t) is skiplab's H̃^res[t, s]
                ours.phi[rows, 2 * N + t * N + s] = gain * fn[:, 1 + t]
        ours.alpha.copy_(torch.stack([ref.pre_branch_scale[0], ref.h_post_scale, ref.residual_scale[0]]))
        ours.b_pre.copy_(ref.static_alpha[:, 0])
        ours.b_res.copy_(ref.static_alpha[:, 1:].t())
        ours.b_post.copy_(ref.static_beta)
    return ours, ref


def compare_mhc(kernel: bool = True) -> None:
    """skiplab's mHC against the package's where the two parameterisations meet: outputs and gradients.

    The package computes the coefficients in float32 (its projections, scales and Sinkhorn–Knopp cast to float32)
    whatever the module's dtype, so its results carry float32 rounding that skiplab's float64 run does not. The
    tolerance is that rounding as measured where the test runs (tests/noise.py): skiplab's connection run again in
    float32 on the same weights and inputs, its distance from the float64 run per tensor, times noise.FACTOR."""
    ours, ref = mhc_pair(iters=100, kernel=kernel)  # converged: both orders of normalisation reach the same doubly stochastic matrix
    ours32 = copy.deepcopy(ours).float()
    f = branch_fn()
    f32 = copy.deepcopy(f).float()
    ref_norm = copy.deepcopy(ours.norm)
    x = streams(equal_rms=True)
    x_ref = x.detach().clone().requires_grad_()
    y = ours(x, f)
    y32 = ours32(x.detach().float().requires_grad_(), f32)
    y_ref = unfolded(through(ref, folded(x_ref), lambda h: f(ref_norm(h))))
    assert_within_noise(y, y_ref, noise((y32, y)), "outputs")
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(9), dtype=y.dtype)
    (y * w).sum().backward(), (y_ref * w).sum().backward(), (y32 * w.float()).sum().backward()

    def pre_blocks(module):  # the package's shared projection = the sum of skiplab's blocks, times the gain
        return (1 + ref.norm.gamma.detach()) * sum(module.phi.grad[s * D:(s + 1) * D, s] for s in range(N))

    pairs = [("b_pre", lambda m: m.b_pre.grad, ref.static_alpha.grad[:, 0]),
             ("b_res", lambda m: m.b_res.grad, ref.static_alpha.grad[:, 1:].t()),
             ("b_post", lambda m: m.b_post.grad, ref.static_beta.grad),
             ("alpha_pre", lambda m: m.alpha.grad[0], ref.pre_branch_scale.grad[0]),
             ("alpha_post", lambda m: m.alpha.grad[1], ref.h_post_scale.grad),
             ("alpha_res", lambda m: m.alpha.grad[2], ref.residual_scale.grad[0]),
             ("norm", lambda m: m.norm.weight.grad, ref_norm.weight.grad),
             ("phi_pre", pre_blocks, ref.dynamic_alpha_fn.grad[0][:, 0])]
    for name, grad, want in pairs:
        assert want.abs().max() > 1e-6, name
        assert_within_noise(grad(ours), want, noise((grad(ours32), grad(ours))), name)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernels", "pytorch"])
def test_mhc_gives_the_packages_outputs_where_the_two_parameterisations_meet(kernel):
    compare_mhc(kernel)


def test_the_comparisons_fail_when_a_constant_of_the_design_is_mutated(monkeypatch):
    """HC's s_α, s_β starting at 0.0101 (for the paper's 0.01): the initial parameters differ; mHC's H^post =
    2.02σ(·) (for Eq. 8's 2σ): the outputs and gradients differ."""
    with monkeypatch.context() as m:
        m.setattr(hyper, "HC_SCALE", 0.0101)
        with pytest.raises(AssertionError):
            same_initial_parameters(*fresh_pair("dynamic"))
        same_initial_parameters(*fresh_pair("static"))  # no scales there
    with monkeypatch.context() as m:
        m.setattr(hyper, "POST_GAIN", 2.02)
        with pytest.raises(AssertionError):
            compare_mhc()


def test_the_package_normalises_the_transposed_matrix_a_different_20_step_result_the_same_limit():
    raw = 3 * torch.randn(4, N, N, generator=torch.Generator().manual_seed(8))  # H̃^res, a spread 20 steps leave open
    ours, theirs = sinkhorn(raw, 20), sinkhorn_knopps(raw.mT, 20).mT  # the package stores H̃^resᵀ
    torch.testing.assert_close(ours.sum(-1), torch.ones(4, N))  # skiplab (the paper): last step T_r, rows exact
    torch.testing.assert_close(theirs.sum(-2), torch.ones(4, N))  # the package: H^res's columns exact
    assert (ours - theirs).abs().max() > 1e-3  # not converged: the order shows
    torch.testing.assert_close(sinkhorn(raw, 500), sinkhorn_knopps(raw.mT, 500).mT, rtol=1e-5, atol=1e-6)


def test_the_initial_maps_differ_by_design():
    """The package feeds HC's initial values to the constraints as logits; skiplab starts from transformers'
    DeepSeek-V4 biases (zero): H^pre = ½, H^post = 1, H^res = 11ᵀ/n (skiplab.connections.hyper.MHC)."""
    ref = ManifoldConstrainedHyperConnections(N, dim=D, layer_index=1).double()
    ours = skiplab.connection(f"mHC(n={N})", D, place=Place(2, "encoder", 4)).double()
    with torch.no_grad():
        ours.phi.zero_()
    x = streams().detach()
    _, _, kwargs = ref.width_connection(folded(x))
    h_post = kwargs["beta"][0, 0].flatten()  # (B, T, 1, n, 1): one position's n weights
    torch.testing.assert_close(h_post, torch.full((N,), 2 / (1 + math.exp(-1))).double())  # 2σ(1) ≈ 1.46
    pre, res, post = ours.weights(x)
    assert torch.equal(post, torch.ones_like(post)) and torch.equal(pre, torch.full_like(pre, 0.5))
    e = math.e
    torch.testing.assert_close(sinkhorn_knopps(ref.static_alpha[:, 1:].detach(), 20).diagonal(),
                               torch.full((N,), e / (e + N - 1)).double())  # diag H^res = e/(e + n − 1) ≈ 0.475
    torch.testing.assert_close(res, torch.full_like(res, 1 / N))
