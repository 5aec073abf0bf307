"""nGPT (Loshchilov et al. 2025) against its equations by hand: the update on the sphere, the attention in the
authors' order (rotary positions, then each head normalised, then s_qk; scores · √d_k), the MLP's scaled u and v,
the scaled logits, every hidden state and matrix of unit norm, the renormalisation after a step, cached decoding
equal to the full forward, the recipe a spec takes and the combinations refused; a tiny ``train lm`` run."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.cli import main
from skiplab.connections import iter_connections
from skiplab.models import GPT, GPTConfig, build_model, model_config
from skiplab.models import ngpt
from skiplab.models.attention import Rotary
from skiplab.train.lm import LMTrainConfig, parameter_groups
from tests.conftest import make_branch, make_input

D, HEADS, FFN, VOCAB = 64, 4, 96, 40
CFG = dict(vocab_size=VOCAB, d_model=D, heads=HEADS, layers=2, ffn_dim=FFN, mlp="swiglu", bias=False, context=24,
           connection="nGPT")


def randomised(model: torch.nn.Module, seed: int = 3) -> torch.nn.Module:
    """Every vector moved away from its start (α with both signs), so that a formula ignoring one fails."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.mul_(1 + 0.8 * torch.randn(p.shape, generator=g))
    return model


def make_model(**overrides) -> GPT:
    torch.manual_seed(0)
    return randomised(GPT(GPTConfig(**{**CFG, **overrides})))


def unit(x, dim=-1):
    return x / x.norm(dim=dim, keepdim=True)


def test_the_update_on_the_sphere_by_hand(layout):
    conn = randomised(skiplab.connection("nGPT", 6, layout))
    x, branch = make_input(layout), make_branch(layout)
    axis = -1 if layout == "seq" else 1
    x = unit(x.detach(), axis)
    alpha = (conn.alpha.p * 0.05 * math.sqrt(6)).abs()  # α_p · α_init / α_scale, α_scale = 1/√d
    alpha = alpha if axis == -1 else alpha.view(-1, 1, 1)
    expected = unit(x + alpha * (unit(branch(x), axis) - x), axis)
    torch.testing.assert_close(conn(x, branch), expected)
    assert torch.allclose(conn(x, branch).norm(dim=axis), torch.ones(()))


def test_the_updates_gradients_by_hand(layout):
    """The fused unit norm and lerp give the gradients of the written-out update, for the stream, α and the branch."""
    conn = randomised(skiplab.connection("nGPT", 6, layout)).double()
    branch = make_branch(layout).double()
    axis = -1 if layout == "seq" else 1
    x = unit(make_input(layout).detach().double(), axis).requires_grad_()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    params = [x, conn.alpha.p, *branch.parameters()]
    alpha = (conn.alpha.p * 0.05 * math.sqrt(6)).abs()
    alpha = alpha if axis == -1 else alpha.view(-1, 1, 1)
    expected = torch.autograd.grad(unit(x + alpha * (unit(branch(x), axis) - x), axis), params, g)
    got = torch.autograd.grad(conn(x, branch), params, g)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dim", [-1, 1, 0])
def test_the_fused_unit_norm_is_the_quotient(dim, monkeypatch):
    """``connections.ngpt.unit``: x / max(‖x‖, 1e-12), its backward written out (r (∂y − y⟨∂y, y⟩)); a vector shorter
    than the floor keeps the floor's gradient ∂y / 1e-12; without gradients and under torch.compile it is the plain
    quotient."""
    from skiplab.connections.ngpt import unit as fused
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    index: list = [0, 0, 0]
    index[dim] = slice(None)
    x[tuple(index)] *= 1e-14  # a vector along dim shorter than the floor, which holds there
    x.requires_grad_()
    g = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    plain = x / torch.linalg.vector_norm(x, dim=dim, keepdim=True).clamp_min(1e-12)
    y = fused(x, dim)
    torch.testing.assert_close(y, plain, rtol=0, atol=1e-15)
    got, want = torch.autograd.grad(y, x, g)[0], torch.autograd.grad(plain, x, g)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert got.abs().max() > 1e10  # the short vector's gradient is the floor's
    fresh = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fused(t, dim), (fresh,))
    with torch.no_grad():
        torch.testing.assert_close(fused(x, dim), plain.detach(), rtol=0, atol=1e-15)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    traced = fused(x, dim)
    assert traced.grad_fn is not None and "Unit" not in type(traced.grad_fn).__name__
    torch.testing.assert_close(torch.autograd.grad(traced, x, g)[0], want, rtol=1e-12, atol=0)


def test_alpha_starts_at_alpha_init_and_is_reported():
    conn = skiplab.connection("nGPT", 64)
    stats = conn.stats()
    assert stats["alpha_mean"] == pytest.approx(0.05) and stats["alpha_min"] == pytest.approx(0.05)
    assert conn.alpha.p[0].item() == pytest.approx(1 / 8)  # the parameter starts at α_scale = 1/√d
    assert "Norm(F(h))" in skiplab.available_connections()["nGPT"]


def test_attention_by_hand_in_the_authors_order():
    model = make_model()
    attn = model.layers[0].attn
    x = unit(torch.randn(2, 9, D))
    b, t, dk = 2, 9, D // HEADS
    q, k, v = (z.view(b, t, HEADS, dk).transpose(1, 2) for z in (x @ attn.qkv_proj.weight.T).chunk(3, -1))
    rope = Rotary(dk, 24)
    s = (attn.qk.s_qk.p * math.sqrt(D)).view(HEADS, 1, dk)  # s_qk: init 1, scale 1/√d
    q, k = unit(rope(q)) * s, unit(rope(k)) * s  # NVIDIA/ngpt: RoPE, then justnorm per head, then sqk
    scores = (q @ k.transpose(-1, -2)) * math.sqrt(dk)  # softmax_scale = sqrt_head_dim
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, D) @ attn.out_proj.weight.T
    torch.testing.assert_close(attn(x, causal=True), out)


def test_mlp_by_hand():
    mlp = make_model().layers[0].mlp
    x = unit(torch.randn(3, D))
    w_v, w_u = mlp.up.weight.chunk(2)
    u = (x @ w_u.T) * mlp.s_u.p  # s_u: init 1, scale 1
    v = (x @ w_v.T) * mlp.s_v.p * math.sqrt(D)  # v also scaled by √d
    torch.testing.assert_close(mlp(x), (u * F.silu(v)) @ mlp.down.weight.T)


@pytest.mark.parametrize("tie", [False, True])
def test_logits_by_hand(tie):
    model = make_model(tie=tie)
    h = unit(torch.randn(2, 5, D))
    out = model.head.weight if not tie else model.embed.weight
    expected = (h @ out.T) * (model.logit_scale.s_z.p * math.sqrt(D))  # s_z: init 1, scale 1/√d
    torch.testing.assert_close(model.logits(h), expected)


def test_every_hidden_state_has_unit_norm():
    model = make_model()
    seen = []
    hooks = [model.embed.register_forward_hook(lambda m, i, o: seen.append(o))]
    for _, conn in iter_connections(model):
        hooks.append(conn.register_forward_hook(lambda m, i, o: seen.append(o)))
    model(torch.randint(0, VOCAB, (2, 11)))
    assert len(seen) == 1 + 2 * 2
    for h in seen:
        torch.testing.assert_close(h.norm(dim=-1), torch.ones(h.shape[:-1]))
    assert isinstance(model.norm, torch.nn.Identity) and isinstance(model.embed_norm, torch.nn.Identity)


def assert_unit(model):
    for weight, dim in ngpt.unit_matrices(model):
        norms = weight.norm(dim=dim)
        torch.testing.assert_close(norms, torch.ones_like(norms))


def test_matrices_start_unit_and_are_renormalised_after_a_step():
    model = make_model()
    assert_unit(model)
    found = {id(w) for w, _ in ngpt.unit_matrices(model)}
    matrices = [p for p in model.parameters() if p.dim() == 2]
    assert {id(p) for p in matrices} == found  # every matrix of the model, none left out
    opt = torch.optim.AdamW(parameter_groups(model, 0.0), lr=0.05)
    F.cross_entropy(model(torch.randint(0, VOCAB, (2, 8))).transpose(1, 2), torch.randint(0, VOCAB, (2, 8))).backward()
    opt.step()
    assert not torch.allclose(model.layers[0].attn.out_proj.weight.norm(dim=0), torch.ones(D))  # the step left the sphere
    before = [w.detach().clone() for w, _ in ngpt.unit_matrices(model)]
    model.after_step()
    assert_unit(model)
    for (w, dim), old in zip(ngpt.unit_matrices(model), before):  # each row or column rescaled, not turned
        torch.testing.assert_close(w, old / old.norm(dim=dim, keepdim=True))


def test_after_step_does_nothing_for_other_designs():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, d_model=32, heads=2, layers=1, ffn_dim=64))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.after_step()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert model.after_step_does == "" and model.logit_scale is None and model.layers[0].attn.qk is None


def test_cached_decoding_equals_the_full_forward():
    model = make_model().eval()
    tokens = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = F.log_softmax(model(tokens), dim=-1)
        state = model.start(tokens[:, :4])
        steps = [model.step(tokens[:, i], state) for i in range(4, 12)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 4:])


def test_bf16_autocast_trains_and_decodes():
    """``train lm``'s bf16 autocast (CUDA; the CPU's autocast here): the branches in bf16 beside the fp32 stream."""
    model = make_model()
    x = torch.randint(0, VOCAB, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    F.cross_entropy(logits.float().transpose(1, 2), x).backward()
    assert torch.isfinite(model.layers[0].conn_attn.alpha.p.grad).all()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(x)
        state = model.start(x[:, :7])
        last = model.step(x[:, 7], state)
    torch.testing.assert_close(last, F.log_softmax(full[:, 7].float(), -1), atol=0.05, rtol=0.05)


def test_a_spec_takes_the_recipe_and_refuses_what_cannot_be_ngpt():
    cfg = model_config("gpt-small(connection=nGPT)")
    assert (cfg.mlp, cfg.positions, cfg.bias, cfg.dropout, cfg.tie) == ("swiglu", "rope", False, 0.0, False)
    assert model_config("gpt-small(connection=nGPT,tie=true)").tie  # the recipe's output layer, not a need
    assert model_config("gpt-small").mlp == "gelu"  # other designs keep the preset
    for spec, problem in [
        ("gpt-small(connection=nGPT,mlp=gelu)", "nGPT needs mlp=swiglu, positions=rope, bias=false, dropout=0 "
                                                "(its paper's model), got mlp=gelu"),
        ("gpt-small(connection=nGPT,positions=learned,bias=true)", "got positions=learned, bias=true"),
        ("gpt-small(connection=nGPT+ValueRes)", "+ValueRes across the layers is no part of it"),
        ("transformer-small(connection=nGPT)", "nGPT has no encoder-decoder form"),
        ("transformer-small(decoder_connection=nGPT)", "nGPT has no encoder-decoder form"),
        ("preact-resnet20(connection=nGPT)", "the GPT's alone, not the PreAct-ResNet's"),
    ]:
        with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
            model_config(spec)
    with pytest.raises(ValueError, match="nGPT needs mlp=swiglu"):
        GPTConfig(connection="nGPT")  # a config made directly takes no recipe


def test_training_takes_no_weight_decay_and_no_warmup():
    cfg = LMTrainConfig(model="gpt-mini(connection=nGPT)")
    assert (cfg.weight_decay, cfg.warmup) == (0.0, 0)
    kept = LMTrainConfig(model="gpt-mini(connection=nGPT)", weight_decay=0.05, warmup=10)  # given: kept
    assert (kept.weight_decay, kept.warmup) == (0.05, 10)
    assert (LMTrainConfig(model="gpt-mini").weight_decay, LMTrainConfig(model="gpt-mini").warmup) == (0.1, 100)


def test_compiles_without_graph_breaks():
    from skiplab.compiled import CompileStats

    torch._dynamo.reset()
    model = build_model(model_config("gpt-mini(connection=nGPT,d_model=32,ffn_dim=64,heads=2,layers=2,context=8)",
                                     vocab_size=VOCAB))
    stats = CompileStats()
    whole = torch.compile(model, backend="eager", dynamic=False)
    x = torch.randint(0, VOCAB, (2, 8))
    for _ in range(2):
        F.cross_entropy(whole(x).transpose(1, 2), x).backward()
    report = stats.report()
    torch._dynamo.reset()
    assert report["graph_breaks"] == 0 and report["frames_compiled"] == 1, report


STORY = "the cat sat on the mat. the dog sat on the log. "


def test_train_lm_with_ngpt_runs_the_papers_recipe(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(STORY * 20)
    out = tmp_path / "run"
    argv = ["train", "lm", "--corpus", "", "--train-file", tmp_path / "train.txt", "--valid-file",
            tmp_path / "valid.txt", "--model", "gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=16)",
            "--connection", "nGPT", "--batch-size", "4", "--max-steps", "3", "--eval-every", "3", "--device", "cpu",
            "--out", out]
    assert main([str(a) for a in argv]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["config"]["weight_decay"], config["config"]["warmup"]) == (0.0, 0)
    assert (config["model"]["mlp"], config["model"]["bias"], config["model"]["tie"]) == ("swiglu", False, False)
    assert config["design_recipe"] == {"weight_decay": 0.0, "warmup": 0}
    assert config["after_step"] == ngpt.AFTER_STEP and config["connections"] == ["nGPT"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["after_step"] == ngpt.AFTER_STEP and summary["steps"] == 3
    ckpt = torch.load(Path(out) / "last.pt", weights_only=True)
    model = build_model(GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    assert_unit(model)  # renormalised after the last update


@pytest.mark.parametrize("argv, problem", [
    (["train", "lm", "--model", "gpt-mini", "--connection", "nGPT", "--mlp", "gelu"], "nGPT needs mlp=swiglu"),
    (["train", "mt", "--model", "transformer-small", "--connection", "nGPT", "--max-steps", "1"],
     "nGPT has no encoder-decoder form"),
])
def test_the_cli_refuses_what_cannot_be_ngpt_in_one_line(tmp_path, capsys, argv, problem):
    out = tmp_path / "run"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err, err
    assert not out.exists()
