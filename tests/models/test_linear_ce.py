"""The output layer fused with its cross-entropy (skiplab.models.linear_ce): the chunked function against a hand
computation and against F.cross_entropy (loss and both gradients, every chunking, ignored rows, sums and means,
autocast), what it keeps for the backward, the GPT's loss through it, its errors, and the liger call's arguments
against liger-kernel's own function."""

import ast
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from skiplab.compiled import CompileStats
from skiplab.models import GPT, GPTConfig
from skiplab.models import linear_ce
from skiplab.models.linear_ce import MIN_CHUNK, default_chunk, linear_cross_entropy


def losses_and_grads(h, w, y, impl, **kw):
    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = linear_cross_entropy(h, w, y, impl, **kw)
    (1.7 * loss).backward()  # a scale other than 1 reaches the gradients
    return loss.detach(), h.grad, w.grad


def test_chunked_matches_a_hand_computation():
    h = [[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]]
    w = [[1.0, 0.0], [0.0, 1.0], [-1.0, 1.0], [0.5, 0.5]]
    y = [2, -100, 0]  # the middle row ignored
    z = [[sum(a * b for a, b in zip(hr, wr)) for wr in w] for hr in h]
    scored = [i for i in range(3) if y[i] != -100]
    loss = sum(math.log(sum(math.exp(v) for v in z[i])) - z[i][y[i]] for i in scored) / len(scored)
    dz = [[0.0] * 4 for _ in range(3)]
    for i in scored:
        total = sum(math.exp(v) for v in z[i])
        dz[i] = [(math.exp(z[i][v]) / total - (v == y[i])) / len(scored) for v in range(4)]
    dh = [[sum(dz[i][v] * w[v][d] for v in range(4)) for d in range(2)] for i in range(3)]
    dw = [[sum(dz[i][v] * h[i][d] for i in range(3)) for d in range(2)] for v in range(4)]
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    for chunk in (1, 2, 3):
        got = losses_and_grads(t(h), t(w), torch.tensor(y), "chunked", chunk=chunk)
        torch.testing.assert_close(got[0], t(loss), rtol=1e-14, atol=0)
        torch.testing.assert_close(got[1], 1.7 * t(dh), rtol=1e-13, atol=1e-15)
        torch.testing.assert_close(got[2], 1.7 * t(dw), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk", [1, 3, 14, 100, None])
def test_chunked_matches_f_cross_entropy(dtype, tol, reduction, chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 7, 16, generator=g, dtype=dtype)
    w = torch.randn(37, 16, generator=g, dtype=dtype)
    y = torch.randint(0, 37, (2, 7), generator=g)
    y[0, 3] = y[1, 6] = -100
    want = losses_and_grads(h, w, y, "eager", reduction=reduction)
    got = losses_and_grads(h, w, y, "chunked", reduction=reduction, chunk=chunk)
    ref = F.cross_entropy((h @ w.T).flatten(0, 1), y.flatten(), reduction=reduction)  # the eager impl is F's
    torch.testing.assert_close(want[0], ref.detach(), rtol=tol, atol=tol)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_every_row_ignored_gives_what_f_cross_entropy_gives():
    h, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    y = torch.full((4,), -100)
    for reduction in ("mean", "sum"):
        want = losses_and_grads(h, w, y, "eager", reduction=reduction)
        got = losses_and_grads(h, w, y, "chunked", reduction=reduction, chunk=3)
        assert torch.equal(got[0].isnan(), want[0].isnan())  # mean: 0/0; sum: 0
        for a, b in zip(got[1:], want[1:]):
            assert torch.equal(a, b) and not a.any()


def test_only_the_inputs_that_ask_get_gradients():
    g = torch.Generator().manual_seed(1)
    h, w, y = torch.randn(6, 8, generator=g), torch.randn(11, 8, generator=g), torch.randint(0, 11, (6,), generator=g)
    hh = h.clone().requires_grad_()
    linear_cross_entropy(hh, w, y, chunk=4).backward()
    torch.testing.assert_close(1.7 * hh.grad, losses_and_grads(h, w, y, "eager")[1])
    ww = w.clone().requires_grad_()
    linear_cross_entropy(h, ww, y, chunk=4).backward()
    torch.testing.assert_close(1.7 * ww.grad, losses_and_grads(h, w, y, "eager")[2])
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(h, w, y, chunk=4), F.cross_entropy(h @ w.T, y))


def test_under_torch_func_grad_it_gives_the_eager_heads_gradient():
    """``torch.func.grad`` takes no ``forward(ctx, ...)`` autograd function: the chunked head steps aside for the
    eager one under a transform, with the same gradient."""
    g = torch.Generator().manual_seed(1)
    h, w, y = torch.randn(6, 8, generator=g), torch.randn(11, 8, generator=g), torch.randint(0, 11, (6,), generator=g)
    dh, dw = torch.func.grad(lambda a, b: linear_cross_entropy(a, b, y, chunk=4), argnums=(0, 1))(h, w)
    _, want_h, want_w = losses_and_grads(h, w, y, "eager")
    torch.testing.assert_close(1.7 * dh, want_h)
    torch.testing.assert_close(1.7 * dw, want_w)


def test_under_cpu_autocast_it_computes_as_the_eager_head():
    """bf16 logits taken to float32, the gradient's two matmuls in bf16: the loss and ∂h as eager's within bf16's
    rounding, ∂W summed over chunks (one bf16 rounding per chunk) within a few of them; gradients in float32."""
    g = torch.Generator().manual_seed(2)
    h, w, y = torch.randn(64, 32, generator=g), torch.randn(300, 32, generator=g), torch.randint(0, 300, (64,),
                                                                                                   generator=g)
    got = {}
    for impl in ("eager", "chunked"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got[impl] = losses_and_grads(h, w, y, impl, chunk=10)
    assert all(t.dtype == torch.float32 for t in got["chunked"])
    torch.testing.assert_close(got["chunked"][0], got["eager"][0], rtol=1e-6, atol=0)
    for a, b in zip(got["chunked"][1:], got["eager"][1:]):
        assert (a - b).abs().max() <= 2**-6 * b.abs().max()


def saved_bytes(fn) -> int:
    total = []

    def pack(t):
        total.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(total)


def test_chunked_keeps_the_gradients_not_the_logits():
    n, d, v = 96, 16, 500
    h, w = torch.randn(n, d, requires_grad=True), torch.randn(v, d, requires_grad=True)
    y = torch.randint(0, v, (n,))
    assert saved_bytes(lambda: linear_cross_entropy(h, w, y, "eager")) >= 4 * n * v
    assert saved_bytes(lambda: linear_cross_entropy(h, w, y, "chunked")) == 4 * (n * d + v * d)


def test_default_chunk_holds_about_as_many_logits_as_states_and_no_fewer_rows_than_the_floor():
    assert default_chunk(32768, 50304, 768) == math.ceil(32768 / 66)  # GPT-2's head, 32 x 1,024 rows
    assert default_chunk(32768, 50304, 768) * 50304 <= 32768 * 768 * 1.01
    assert default_chunk(8192, 50304, 768) == MIN_CHUNK == 256  # 8192 / 66 rows would be skinnier than the floor
    assert default_chunk(10, 5, 16) == 10 and default_chunk(100, 10**6, 1) == 100


def tiny(**fields) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=50, d_model=32, heads=2, layers=2, ffn_dim=64, context=16, **fields)).double()


NGPT = dict(connection="nGPT", mlp="swiglu", positions="rope", bias=False, dropout=0.0)


@pytest.mark.parametrize("fields", [{}, {"pad_vocab": 64}, {"mup_base_width": 16}, {"tie": False}, NGPT,
                                    {**NGPT, "pad_vocab": 64}],
                         ids=["tied", "padded", "mup", "untied", "ngpt", "ngpt-padded"])
def test_the_models_loss_through_its_readout_is_its_logits_loss(fields):
    """μP's h/m_d, nGPT's s_z and the padding rows go into the readout; loss and every parameter's gradient agree."""
    model = tiny(**fields)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randint(0, 50, (2, 16), generator=g), torch.randint(0, 50, (2, 16), generator=g)
    y[1, :4] = -100
    got = {}
    for how in ("logits", "eager", "chunked"):
        model.zero_grad()
        loss = F.cross_entropy(model(x).transpose(1, 2), y) if how == "logits" else model(x, targets=y, head_loss=how)
        loss.backward()
        got[how] = [loss.detach()] + [p.grad.clone() for p in model.parameters()]
    for how in ("eager", "chunked"):
        for a, b in zip(got[how], got["logits"]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    h, w = model.readout(model.hidden(x))
    torch.testing.assert_close(h @ w.T, model(x), rtol=1e-12, atol=1e-12)


def test_a_compiled_model_runs_the_chunked_loss_outside_its_graph():
    """Compiled whole, the model's graph ends where the chunked loss begins: the disabled call breaks the forward's
    frame and then linear_cross_entropy's (dynamo resumes in the callee), nothing inside the loss is traced, and
    the loss and gradients are the eager head's."""
    model = tiny().float()
    x, y = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    want = model(x, targets=y, head_loss="eager")
    want.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    stats = CompileStats()
    got = torch.compile(model, backend="eager")(x, targets=y, head_loss="chunked")
    got.backward()
    assert stats.report()["graph_breaks"] == 2
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw, message", [
    (dict(impl="fused"), "head loss 'fused' is not one of eager, chunked, liger"),
    (dict(reduction="none"), "reduction 'none' is not one of mean, sum"),
    (dict(chunk=0), "chunk must be a positive number of rows, got 0"),
    (dict(impl="liger"), "head loss 'liger' runs on CUDA only (h is on cpu); 'chunked' is the same computation in "
                         "PyTorch"),
])
def test_bad_arguments_are_named(kw, message):
    h, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 4])
    with pytest.raises(ValueError) as e:
        linear_cross_entropy(h, w, y, **kw)
    assert str(e.value) == message


def test_bad_shapes_and_targets_are_named():
    h, w = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"h's last dimension \(4\) must match the weight's columns"):
        linear_cross_entropy(h, torch.randn(5, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"targets of shape \(2,\) do not match h's rows \(3,\)"):
        linear_cross_entropy(h, w, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="^target 5 is out of bounds for 5 classes$"):
        linear_cross_entropy(h, w, torch.tensor([0, 5, -100]))
    with pytest.raises(ValueError, match="^target -3 is out of bounds for 5 classes$"):
        linear_cross_entropy(h, w, torch.tensor([0, -3, 1]))


def test_a_missing_liger_is_one_line(monkeypatch):
    import builtins
    real = builtins.__import__

    def refuse(name, *a, **kw):
        if name.startswith("liger_kernel"):
            raise ImportError("No module named 'triton'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", refuse)
    with pytest.raises(ValueError) as e:
        linear_ce._liger()
    assert str(e.value) == ("head loss 'liger' could not import liger-kernel's fused linear cross-entropy (pip install "
                            "liger-kernel; it needs Triton): No module named 'triton'")


def liger_forward_parameters() -> list[str]:
    """The parameter names of liger-kernel's LigerFusedLinearCrossEntropyFunction.forward, read from its installed
    source (importing it needs Triton, which a CPU machine lacks)."""
    spec = importlib.util.find_spec("liger_kernel")
    if spec is None:
        pytest.skip("could not import 'liger_kernel': not installed (make test installs it)")
    source = Path(spec.submodule_search_locations[0]) / "ops" / "fused_linear_cross_entropy.py"
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "LigerFusedLinearCrossEntropyFunction":
            forward = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
            return [a.arg for a in forward.args.args]
    raise AssertionError(f"no LigerFusedLinearCrossEntropyFunction in {source}")


def test_the_liger_call_passes_what_liger_kernels_function_names(monkeypatch):
    calls = []

    class Fake:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return (torch.tensor(1.5), None, None, None)

    monkeypatch.setattr(linear_ce, "_liger", lambda: Fake)
    h, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 4])
    assert linear_ce._liger_loss(h, w, y, -7, "sum") == 1.5
    names = liger_forward_parameters()[1:]  # less ctx
    bound = dict(zip(names, calls[0]))
    assert bound["_input"] is h and bound["weight"] is w and bound["target"] is y
    assert bound["bias"] is None and bound["ce_weight"] is None
    assert bound["ignore_index"] == -7 and bound["reduction"] == "sum"
    assert bound["lse_square_scale"] == 0.0 and bound["label_smoothing"] == 0.0
