"""The add + GroupNorm kernel equals the eager chain, forward and backward, and the connections run it only where
it can run: on the CPU, in float32 or float64, outside compile, autocast and recording, with a C compiler."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import skiplab
from skiplab.connections import kernels
from skiplab.connections.base import iter_connections, recording
from skiplab.connections.kernels import add_group_norm as agn
from skiplab.connections.kernels import build
from tests.conftest import make_branch, make_input, randomise_affine
from tests.connections.kernel_checks import mutated

needs_kernel = pytest.mark.skipif(kernels.load("add_group_norm") is None, reason="no C compiler on this machine")


def hand(s, f, w, b, a, c, eps):
    """The chain written out: mean and biased variance over each example's C·H·W values, then the affine map."""
    h = a * s + c * f
    for i in range(w.shape[0]):
        flat = h.reshape(h.shape[0], -1)
        mu = flat.mean(1)
        var = ((flat - mu[:, None]) ** 2).mean(1)
        shape = (-1, *([1] * (h.dim() - 1)))
        xhat = (h - mu.view(shape)) / torch.sqrt(var.view(shape) + eps)
        y = xhat * w[i].view(1, -1, *([1] * (h.dim() - 2))) + b[i].view(1, -1, *([1] * (h.dim() - 2)))
        h = s + y
    return y


def inputs(shape, k, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(shape, generator=g, dtype=dtype).requires_grad_()
    f = torch.randn(shape, generator=g, dtype=dtype).requires_grad_()
    w = (1 + 0.3 * torch.randn(k, shape[1], generator=g, dtype=dtype)).requires_grad_()
    b = (0.3 * torch.randn(k, shape[1], generator=g, dtype=dtype)).requires_grad_()
    return s, f, w, b


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("k,a,c", [(1, 1.0, 1.0), (1, 2.0, 0.5), (2, 1.0, 1.0), (3, 1.0, 1.0), (8, 1.5, 0.7)])
@pytest.mark.parametrize("shape", [(5, 4, 3, 7), (6, 3, 10), (3, 16, 8, 8), (2, 40, 5, 7)])  # the last: two flushes
def test_kernel_equals_the_hand_chain_and_group_norm_outputs_and_gradients(dtype, tol, k, a, c, shape):
    s, f, w, b = inputs(shape, k, dtype)
    y, rstd = agn.add_group_norm(s, f, w, b, a, c, 1e-5)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    got = torch.autograd.grad(y, (s, f, w, b), dy)
    for want_y in (hand(s, f, w, b, a, c, 1e-5), agn.reference(s, f, w, b, a, c, 1e-5)):
        want = torch.autograd.grad(want_y, (s, f, w, b), dy)
        torch.testing.assert_close(y, want_y, rtol=tol, atol=tol)
        for x, z in zip(got, want):
            torch.testing.assert_close(x, z, rtol=tol, atol=tol * max(1.0, z.abs().max().item()))
    assert rstd.shape == (k, shape[0]) and not rstd.requires_grad
    h = a * s.detach() + c * f.detach()  # the first norm's 1/σ, by hand
    torch.testing.assert_close(rstd[0], 1 / torch.sqrt(h.reshape(shape[0], -1).var(1, unbiased=False) + 1e-5),
                               rtol=tol, atol=tol)


@needs_kernel
@pytest.mark.parametrize("k", [1, 2, 3])
def test_kernel_passes_gradcheck(k):
    s, f, w, b = inputs((3, 2, 4, 4), k)
    assert torch.autograd.gradcheck(lambda *t: agn.add_group_norm(*t, 1.3, 0.9)[0], (s, f, w, b))


@needs_kernel
def test_kernel_is_as_accurate_as_group_norm_when_the_mean_dwarfs_the_spread():
    """Sums about a pivot, and y = (h − μ)·(r·w) + b: with a mean 10^4 times the spread, float32, the kernel is no
    further from the float64 chain (on the same inputs) than PyTorch's float32 group norm is."""
    s, f, w, b = (t.detach() for t in inputs((4, 8, 16, 16), 2, torch.float32))
    s, f = s * 0.1 + 1000.0, f * 0.01
    exact = agn.reference(s.double(), f.double(), w.double(), b.double())
    kernel_error = (agn.add_group_norm(s, f, w, b)[0] - exact).abs().max().item()
    torch_error = (agn.reference(s, f, w, b) - exact).abs().max().item()
    assert kernel_error <= torch_error < 1e-2


@needs_kernel
def test_kernel_gives_one_result_at_a_thread_count_and_agrees_across_counts():
    s, f, w, b = inputs((9, 4, 5, 5), 2, torch.float32)
    before = torch.get_num_threads()
    try:
        runs = {}
        for threads in (1, 2, 2, 3):
            torch.set_num_threads(threads)
            y, _ = agn.add_group_norm(s, f, w, b)
            runs.setdefault(threads, []).append((y, *torch.autograd.grad(y.square().sum(), (s, f, w, b))))
    finally:
        torch.set_num_threads(before)
    for a, b_ in zip(*runs[2]):
        assert torch.equal(a, b_)
    for a, b_ in zip(runs[1][0], runs[3][0]):
        torch.testing.assert_close(a, b_, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_the_kernels_second_derivatives_are_the_formulas():
    """Asked for a graph, the kernel's backward is the reference formula's (C code is no graph): second derivatives
    in s, F and every gain and bias, against finite differences."""
    s, f, w, b = inputs((3, 2, 4), 2)
    assert torch.autograd.gradgradcheck(lambda *t: agn.add_group_norm(*t)[0], (s, f, w, b))


@needs_kernel
@pytest.mark.parametrize("mutation", [
    ("rest + q.a * dh", "q.a * dh"),                                           # the later norms' share of ds dropped
    ("g * ((hh[p] - q->mu[p]) * q->r[p])", "g * (hh[p] - q->mu[p])"),          # ∂w without the 1/σ
    ("s2 += d * d;", "s2 += d;"),                                              # a wrong variance
    ("hh[i + 1] = sv + ((hh[i]", "hh[i + 1] = ((hh[i]"),                      # the chain's recomputed h without s
    ("for (int i = k - 1; i > p; i--)", "for (int i = k - 1; i > p + 1; i--)"),  # a later norm's ∂h skipped
    ("< FLUSH && ch + 1 < c) continue;", "< FLUSH) continue;"),                # the last channels' sums never added
    ("s1v[u] = s2v[u] = (vreal){0};", ";"),                                    # a flushed block's sums added again
])
def test_the_comparison_fails_for_a_mutated_kernel(mutation, monkeypatch, tmp_path):
    """The oracle above can fail: each mutation of the C source, built and run in its place, is caught."""
    lib = mutated("add_group_norm", agn.SIGNATURES, *mutation, tmp_path)
    monkeypatch.setattr(agn, "_kernel", lambda: lib)
    s, f, w, b = inputs((3, 40, 5, 7), 2)  # 1,400 positions an example: the moments flushed twice
    y = agn.add_group_norm(s, f, w, b)[0]
    want = agn.reference(s, f, w, b)
    got_grads = torch.autograd.grad(y.sin().sum(), (s, f, w, b))
    want_grads = torch.autograd.grad(want.sin().sum(), (s, f, w, b))
    same = torch.allclose(y, want) and all(torch.allclose(x, z) for x, z in zip(got_grads, want_grads))
    assert not same


# The connections: which ones choose the kernel, and that they run it where (and only where) it can run.

def conv_conn(spec, dim=4, dtype=torch.float64):
    conn = skiplab.connection(spec, dim=dim, layout="conv").to(dtype)
    randomise_affine(conn)
    return conn


def ran_kernel(y):
    return type(y.grad_fn).__name__ == "_AddGroupNormBackward"


@pytest.mark.parametrize("spec,kernel", [
    ("2rSkip+LN", "add_group_norm"), ("3rSkip+LN", "add_group_norm"), ("1rSkip+LN", None), ("2xSkip+LN", None),
    ("1xSkip+LN(f=0.5)", None), ("2rSkip+BN", None), ("2rSkip+RMS", None), ("1xSkip", None),
])
def test_connections_choose_the_kernel_where_they_are_built(spec, kernel):
    """Chosen for chains of two norms or more, where it measured faster; one norm's chain keeps PyTorch's."""
    assert conv_conn(spec).kernel == kernel
    assert skiplab.connection(spec, dim=4, layout="seq").kernel is None


@needs_kernel
@pytest.mark.parametrize("spec", ["2rSkip+LN", "3rSkip+LN", "2xSkip+LN", "1xSkip+LN(f=0.5)", "1rSkip+LN"])
def test_connections_with_the_kernel_equal_their_eager_formula(spec):
    torch.manual_seed(0)
    conn = conv_conn(spec)
    conn.kernel = "add_group_norm"  # chosen by krSkip+LN, k >= 2; asked for here by the others
    branch = make_branch("conv", 4).double()
    x = make_input("conv", dim=4).double().requires_grad_()
    params = [x, *conn.parameters(), *branch.parameters()]
    y = conn(x, branch)
    assert ran_kernel(y)
    ratio = conn.stats().get("ratio")
    got = torch.autograd.grad(y.sin().sum(), params)
    conn.kernel = None
    y_eager = conn(x, branch)
    assert not ran_kernel(y_eager)
    torch.testing.assert_close(y, y_eager)
    for a, b in zip(got, torch.autograd.grad(y_eager.sin().sum(), params)):
        torch.testing.assert_close(a, b)
    if ratio is not None:  # krSkip's learned ratio reads the kernel's σ as it read the norms'
        torch.testing.assert_close(ratio, conn.stats()["ratio"])


@pytest.mark.parametrize("spec", ["2rSkip+LN", "3rSkip+LN"])
def test_a_channels_last_stream_keeps_its_layout_and_its_values(spec):
    """The kernel reads (N, C, H, W) in order; a channels-last network's stream goes the eager way, which keeps
    its layout (no conversion a block), to the same values and gradients."""
    torch.manual_seed(0)
    conn = conv_conn(spec, dtype=torch.float32)
    branch = make_branch("conv", 4).to(memory_format=torch.channels_last)
    x = make_input("conv", dim=4).requires_grad_()
    y = conn(x, branch)
    cl = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    y_cl = conn(cl, branch)
    assert y_cl.is_contiguous(memory_format=torch.channels_last) and not ran_kernel(y_cl)
    torch.testing.assert_close(y_cl, y)
    torch.testing.assert_close(torch.autograd.grad(y_cl.sin().sum(), cl)[0], torch.autograd.grad(y.sin().sum(), x)[0])


def test_connections_run_the_eager_formula_where_the_kernel_cannot(monkeypatch):
    conn = conv_conn("2rSkip+LN", dtype=torch.float32)
    branch = make_branch("conv", 4)
    x = make_input("conv", dim=4)
    if kernels.load("add_group_norm") is not None:
        assert ran_kernel(conn(x, branch))
    assert not ran_kernel(conv_conn("2rSkip+LN", dtype=torch.bfloat16)(x.bfloat16(), make_branch("conv", 4).bfloat16()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not ran_kernel(conn(x, branch))
    with recording(conn) as rec:  # an analysis wants the intermediate sums: the eager chain records them
        assert not ran_kernel(conn(x, branch))
    assert rec[""] or list(rec.values())[0]
    conn.norms[1] = nn.GroupNorm(1, 4, affine=False)  # a norm the kernel does not compute
    assert not ran_kernel(conn(x, branch))
    monkeypatch.setenv("SKIPLAB_KERNELS", "0")
    assert kernels.load("add_group_norm") is None
    assert not ran_kernel(conv_conn("2rSkip+LN", dtype=torch.float32)(x, branch))


@needs_kernel
def test_usable_only_for_what_the_kernel_takes():
    s, f = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    w, b = torch.ones(2, 3), torch.zeros(2, 3)
    assert agn.usable(s, f, w, b) and agn.usable(s.double(), f.double(), w.double(), b.double())
    assert agn.usable(s, f, torch.ones(agn.MAX_K, 3), torch.zeros(agn.MAX_K, 3))
    for args in ((s.bfloat16(), f.bfloat16(), w.bfloat16(), b.bfloat16()),  # a dtype it is not built for
                 (s, f.double(), w, b), (s, f, w.double(), b), (s, f, w, b.double()),  # dtypes mixed
                 (s, f[:, :, :3], w, b),  # s and F of two shapes
                 (s, f, torch.ones(2, 4), torch.zeros(2, 4)),  # gains of another number of channels
                 (s, f, w, torch.zeros(1, 3)),  # k gains, another number of biases
                 (s, f, torch.ones(agn.MAX_K + 1, 3), torch.zeros(agn.MAX_K + 1, 3)),  # a chain too long
                 (s, f, torch.ones(3), torch.zeros(3)),  # one norm's gains not stacked
                 (s[:, :, 0, 0], f[:, :, 0, 0], w, b),  # no positions axis
                 (s[:0], f[:0], w, b),  # no examples
                 (s.to(memory_format=torch.channels_last), f, w, b),  # a channels-last stream (or branch)
                 (s, f.to(memory_format=torch.channels_last), w, b)):
        assert not agn.usable(*args)
    assert agn.usable(s[:, :, :, :2], f[:, :, :, :2], w, b)  # another view of (N, C, ...): made contiguous, taken
    norms = [nn.GroupNorm(1, 3), nn.GroupNorm(1, 3)]
    weights, biases, eps = agn.group_norm_params(norms)
    assert weights == [n.weight for n in norms] and biases == [n.bias for n in norms] and eps == 1e-5
    assert agn.group_norm_params([nn.GroupNorm(1, 3), nn.GroupNorm(1, 3, eps=1e-6)]) is None
    assert agn.group_norm_params([nn.GroupNorm(1, 3), nn.GroupNorm(1, 3, affine=False)]) is None
    assert agn.group_norm_params([nn.GroupNorm(1, 3), nn.GroupNorm(3, 3)]) is None


def test_a_machine_without_a_compiler_warns_once_and_runs_eager(monkeypatch, tmp_path):
    monkeypatch.setenv("SKIPLAB_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    build._load.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match=r"add_group_norm kernel could not be built \(no C compiler found"):
            assert build.load("add_group_norm") is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert build.load("add_group_norm") is None  # once per process
        y = conv_conn("2rSkip+LN", dtype=torch.float32)(make_input("conv", dim=4), make_branch("conv", 4))
        assert not ran_kernel(y)
    finally:
        build._load.cache_clear()
    assert list(tmp_path.iterdir()) == []


@needs_kernel
def test_the_cache_keeps_one_library_per_kind_of_processor(monkeypatch, tmp_path):
    monkeypatch.setenv("SKIPLAB_KERNEL_CACHE", str(tmp_path))
    first = build._build("add_group_norm")
    assert first.parent == tmp_path and first.exists()
    assert build._build("add_group_norm") == first  # built once
    monkeypatch.setattr(build, "_cpu_flags", lambda: "another kind of processor")
    second = build._build("add_group_norm")
    assert second != first and second.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, second.name])  # no temporary left


@needs_kernel
def test_a_changed_header_builds_anew(monkeypatch, tmp_path):
    """The cache key holds the folder's headers too: a kernel that includes vectors.h is rebuilt when it changes."""
    here = tmp_path / "src"
    here.mkdir()
    for name in ("norm_project.c", "vectors.h"):
        (here / name).write_text((build.HERE / name).read_text())
    monkeypatch.setattr(build, "HERE", here)
    monkeypatch.setenv("SKIPLAB_KERNEL_CACHE", str(tmp_path / "cache"))
    first = build._build("norm_project")
    (here / "vectors.h").write_text((here / "vectors.h").read_text() + "/* changed */\n")
    second = build._build("norm_project")
    assert second != first and first.exists() and second.exists()


@needs_kernel
def test_a_preact_resnet_with_the_kernel_trains_as_the_eager_one():
    """Two SGD steps of a PreAct-ResNet-20 with 2rSkip+LN, kernel on and off, from the same weights."""
    from skiplab.models import build_model, model_config

    losses = {}
    for kernel in ("add_group_norm", None):
        torch.manual_seed(0)
        model = build_model(model_config("preact-resnet20", connection="2rSkip+LN")).train()
        for _, conn in iter_connections(model):
            assert conn.kernel == "add_group_norm"
            conn.kernel = kernel
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
        losses[kernel] = []
        for _ in range(2):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[kernel].append(loss.item())
    assert losses["add_group_norm"] == pytest.approx(losses[None], rel=1e-5)


@pytest.mark.parametrize("spec", ["2rSkip+LN", "2xSkip+LN"])
def test_under_compile_the_connection_traces_its_eager_formula_without_a_graph_break(spec):
    """Compiling sees the eager chain (which the compiler fuses itself), never the ctypes call: no graph break."""
    torch._dynamo.reset()
    conn = conv_conn(spec, dtype=torch.float32)
    branch = make_branch("conv", 4)
    x = make_input("conv", dim=4)
    explained = torch._dynamo.explain(lambda t: conn(t, branch))(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(lambda t: conn(t, branch), backend="eager")
    y = compiled(x)
    assert not ran_kernel(y)
    conn.kernel = None
    torch.testing.assert_close(y, conn(x, branch))
    torch._dynamo.reset()
