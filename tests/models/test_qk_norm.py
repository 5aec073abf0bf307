"""QK-norm (``qk_norm=head|all``) in the GPT and the Transformer: the attention against its formula computed by hand,
the model's norm kind and eps reaching it, cached decoding against full recomputation, a Transformer training step,
older configs and run keys unchanged, one-line refusals (the CLI's exit 2, nothing written; Hugging Face export) and
no graph breaks under torch.compile. The comparison with transformers' Qwen 3 and OLMo 2 attention is in
tests/oracles/test_oracle_qk_norm.py."""

import copy
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from skiplab.bench.steps import build
from skiplab.compiled import CompileStats, compile_layers
from skiplab.connections.norms import EPS, RMSNorm
from skiplab.interop import hf
from skiplab.models import GPT, GPTConfig, build_model, model_config, model_from_checkpoint
from skiplab.models.attention import CrossAttention, Rotary, SelfAttention
from skiplab.reproduce import runs
from tests.models.test_transformer import V, batch, full_and_incremental
from tests.noise import assert_within_noise, noise
from tests.test_compile_breaks import SHAPE, fresh_dynamo, steps  # noqa: F401 - fresh_dynamo: a fixture
from tests.train.test_distributed import one_thread
from tests.train.test_lm import args, run, text  # noqa: F401 - text: a fixture

D, H = 32, 4


def randomise(module: nn.Module, seed: int = 1) -> nn.Module:
    """Weights of unit-scale products and norm gains and biases off 1 and 0, in float64."""
    g = torch.Generator().manual_seed(seed)
    module.double()
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = 0.5 if "norm" in name else 1 / math.sqrt(D)
            shift = 1 if name.endswith("norm.weight") else 0
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale + shift)
    return module


def by_hand_norm(x: torch.Tensor, kind: str, groups: int, gain: torch.Tensor, bias: torch.Tensor | None,
                 eps: float) -> torch.Tensor:
    """LN: (x − mean)/sqrt(var + eps)·g + b; RMS: x/sqrt(mean(x²) + eps)·g, over each of ``groups`` slices of the
    last axis (the heads: Qwen 3; one group: OLMo 2)."""
    b, t, d = x.shape
    h = x.view(b, t, groups, d // groups)
    if kind == "LN":
        h = h - h.mean(-1, keepdim=True)
    h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps) * gain
    return (h if bias is None else h + bias).view(b, t, d)


def by_hand_rotary(x: torch.Tensor, base: float) -> torch.Tensor:
    """(B, H, T, d): RoPE(x)_p = x cos(pθ) + rotate_half(x) sin(pθ), θ_i = base^(−2i/d); the angles' cos and sin
    in float32, as the model's (and transformers') rotary tables hold them."""
    t, d = x.shape[2], x.shape[3]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = torch.arange(t, dtype=torch.float32)[:, None] * torch.cat([theta, theta])
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * angle.cos().to(x.dtype) + torch.cat([-x2, x1], -1) * angle.sin().to(x.dtype)


def heads(x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, D/H)
    b, t, d = x.shape
    return x.view(b, t, H, d // H).transpose(1, 2)


def by_hand_attention(q, k, v, out: nn.Linear, causal: bool) -> torch.Tensor:
    """softmax(q kᵀ/√d_k + mask) v, heads concatenated, then W_O (Vaswani et al. 2017, Eqs. 1-2)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), float("-inf"))
    o = scores.softmax(-1) @ v
    b, _, t, _ = o.shape
    return out(o.transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("qk_norm, kind", [("head", "LN"), ("head", "RMS"), ("all", "LN"), ("all", "RMS")])
@pytest.mark.parametrize("rope", [False, True])
def test_self_attention_normalises_queries_and_keys_before_the_rotary_positions(qk_norm, kind, rope):
    eps, base, t = 1e-3, 100.0, 6
    attn = randomise(SelfAttention(D, H, rope=Rotary(D // H, t, base) if rope else None, qk_norm=qk_norm, norm=kind,
                                   eps=eps))
    x = torch.randn(2, t, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    groups = H if qk_norm == "head" else 1
    q, k, v = attn.qkv_proj(x).chunk(3, -1)
    q, k = (by_hand_norm(z, kind, groups, n.norm.weight, getattr(n.norm, "bias", None), eps)
            for z, n in ((q, attn.q_norm), (k, attn.k_norm)))
    q, k, v = heads(q), heads(k), heads(v)
    if rope:
        q, k = by_hand_rotary(q, base), by_hand_rotary(k, base)
    torch.testing.assert_close(attn(x, causal=True), by_hand_attention(q, k, v, attn.out_proj, causal=True),
                               rtol=1e-12, atol=1e-12)
    # the gains: one of d/H features shared by the heads (Qwen 3), or one of d features (OLMo 2)
    assert attn.q_norm.norm.weight.shape == attn.k_norm.norm.weight.shape == (D // groups,)
    assert isinstance(attn.q_norm.norm, RMSNorm if kind == "RMS" else nn.LayerNorm)


@pytest.mark.parametrize("qk_norm", ["head", "all"])
def test_cross_attention_normalises_decoder_queries_and_encoder_keys(qk_norm):
    attn = randomise(CrossAttention(D, H, qk_norm=qk_norm, norm="LN"))
    g = torch.Generator().manual_seed(3)
    query = torch.randn(2, 5, D, generator=g, dtype=torch.float64)
    memory = torch.randn(2, 7, D, generator=g, dtype=torch.float64)
    groups = H if qk_norm == "head" else 1
    q = by_hand_norm(attn.q_proj(query), "LN", groups, attn.q_norm.norm.weight, attn.q_norm.norm.bias, EPS)
    k, v = attn.kv_proj(memory).chunk(2, -1)
    k = by_hand_norm(k, "LN", groups, attn.k_norm.norm.weight, attn.k_norm.norm.bias, EPS)
    want = by_hand_attention(heads(q), heads(k), heads(v), attn.out_proj, causal=False)
    torch.testing.assert_close(attn(query, attn.project_kv(memory)), want, rtol=1e-12, atol=1e-12)


def test_separate_key_and_value_inputs_are_normalised_too():
    """MUDD's ``kv`` path (keys and values from their own streams) goes through the same QK-norm: with the streams
    equal to x it is the plain attention, and keys from another stream change the output."""
    attn = randomise(SelfAttention(D, H, qk_norm="head", norm="RMS"))
    g = torch.Generator().manual_seed(4)
    x, other = (torch.randn(2, 6, D, generator=g, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(attn(x, causal=True, kv=(x, x)), attn(x, causal=True), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(attn(x, causal=True, kv=(other, x)), attn(x, causal=True))


def test_the_models_norm_kind_and_eps_reach_the_qk_norms():
    gpt = GPT(GPTConfig(vocab_size=50, d_model=D, heads=H, layers=2, ffn_dim=64, context=8, norm="RMS",
                        connection="PreRMS", norm_eps=1e-6, qk_norm="all"))
    for layer in gpt.layers:
        for n in (layer.attn.q_norm.norm, layer.attn.k_norm.norm):
            assert isinstance(n, RMSNorm) and n.eps == 1e-6 and n.weight.shape == (D,)
    mt = build_model(model_config("transformer-small(qk_norm=head,d_model=32,heads=4,ffn_dim=64,encoder_layers=1,"
                                  "decoder_layers=1)"))
    norms = [m for name, m in mt.named_modules() if name.endswith(("q_norm.norm", "k_norm.norm"))]
    assert len(norms) == 6  # encoder self-, decoder self- and cross-attention, queries and keys
    assert all(isinstance(n, nn.LayerNorm) and n.eps == EPS and n.weight.shape == (D // H,) for n in norms)


def test_none_is_the_model_of_older_runs():
    """The default builds no QK-norm (the state dict of every earlier run); a stored config without the field loads
    as none, and the run key leaves it out there."""
    for spec in ("gpt-mini", "transformer-small", "llama-71m"):
        cfg = model_config(spec)
        assert cfg.qk_norm == "none" and "qk_norm" not in runs.keyed_model(cfg)
    assert not any("_norm." in k and "attn" in k for k in build_model(model_config("gpt-mini(layers=1)")).state_dict())
    assert runs.keyed_model(model_config("gpt-mini(qk_norm=head)"))["qk_norm"] == "head"
    assert runs.keyed_model(model_config("transformer-small(qk_norm=all)"))["qk_norm"] == "all"
    for spec in ("gpt-mini(layers=1)", "transformer-small(encoder_layers=1,decoder_layers=1)"):
        model = build_model(model_config(spec))
        older = {k: v for k, v in dataclasses.asdict(model.cfg).items() if k != "qk_norm"}  # written before the field
        ckpt = {"config": {"model": spec}, "model_config": older, "model": model.state_dict()}
        assert model_from_checkpoint(ckpt, "older.pt").cfg.qk_norm == "none"


def tiny_gpt(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=50, d_model=D, heads=H, layers=3, ffn_dim=64, context=16)
    model = GPT(GPTConfig(**{**cfg, **kw})).eval()
    with torch.no_grad():  # gains off 1: a cached position normalised with another's gain would show
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.add_(0.3 * torch.randn(p.shape))
    return model


@pytest.mark.parametrize("qk_norm", ["head", "all"])
@pytest.mark.parametrize("norm, connection, positions", [("LN", "PreLN", "rope"), ("RMS", "PreRMS", "rope"),
                                                         ("LN", "PostLN", "learned")])
@torch.no_grad()
def test_cached_steps_give_the_logits_of_full_recomputation(qk_norm, norm, connection, positions):
    model = tiny_gpt(qk_norm=qk_norm, norm=norm, connection=connection, positions=positions)
    x = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))

    def both(m):
        caches = m.new_caches()
        prefix = m(x[:, :5], caches)
        return m(x), torch.cat([prefix, *(m(x[:, t : t + 1], caches) for t in range(5, x.shape[1]))], 1)

    full, cached = both(model)
    full64, cached64 = both(copy.deepcopy(model).double())
    assert_within_noise(cached, full, noise((full, full64), (cached, cached64)))
    assert not torch.allclose(full, tiny_gpt(norm=norm, connection=connection, positions=positions)(x))


@pytest.mark.parametrize("qk_norm", ["head", "all"])
def test_transformer_decodes_incrementally_and_trains_a_step(qk_norm):
    torch.manual_seed(0)
    model = build_model(model_config(f"transformer-small(qk_norm={qk_norm},norm=RMS,connection=PreLN,d_model=32,"
                                     f"heads=4,ffn_dim=64,encoder_layers=2,decoder_layers=2,vocab_size={V})")).eval()
    src, tgt = batch()
    full, cached, _ = full_and_incremental(model, src, tgt)
    full64, cached64, _ = full_and_incremental(copy.deepcopy(model).double(), src, tgt)
    assert_within_noise(cached, full, noise((full, full64), (cached, cached64)))

    model.train()
    gains = {n: p for n, p in model.named_parameters() if "q_norm" in n or "k_norm" in n}
    assert len(gains) == 12  # 2 encoder + 2 decoder layers; self-attention's and cross-attention's, q and k
    before = {n: p.detach().clone() for n, p in gains.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = F.cross_entropy(model(src, tgt).transpose(1, 2), tgt)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in gains.values())
    opt.step()
    assert all(not torch.equal(p, before[n]) for n, p in gains.items())


def test_bad_values_and_meaningless_combinations_are_one_line():
    for spec, match in (("gpt-mini(qk_norm=heads)", "qk_norm must be one of none, head, all, qkv, got 'heads'"),
                        ("transformer-small(qk_norm=yes)", "qk_norm must be one of none, head, all, qkv"),
                        ("gpt-mini(connection=nGPT,qk_norm=head)", "qk_norm=head means nothing with nGPT")):
        with pytest.raises(ValueError, match=match) as err:
            model_config(spec)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="qk_norm=all has no Hugging Face counterpart") as err:
        hf.config_to_hf(model_config("llama-71m(qk_norm=all,layers=1)"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="qk_norm=head has no Hugging Face counterpart"):
        hf.to_hf(GPT(model_config("gpt2-small(qk_norm=head,layers=1,d_model=32,heads=4,ffn_dim=64,context=8)")))


def one_line(capsys, pattern: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.startswith("skiplab: error:") and "\n" not in err and pattern in err, err


def test_the_command_line_trains_with_qk_norm_refuses_bad_values_and_hf_export(text, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out, "--qk-norm", "head", "--positions", "learned", "--max-steps", "1",
                        "--eval-every", "1")) == 0  # GPT-2 but for the QK-norm
        recorded = json.loads((out / "config.json").read_text())
        assert recorded["model"]["qk_norm"] == "head" and "qk_norm=head" in recorded["config"]["model"]
        capsys.readouterr()
        assert run(["export", "hf", out, "--out", tmp_path / "hf"]) == 2
        one_line(capsys, "qk_norm=head has no Hugging Face counterpart")
        for extra, pattern in ((["--qk-norm", "rms"], "qk_norm must be one of none, head, all, qkv, got 'rms'"),
                               (["--connection", "nGPT", "--qk-norm", "all"], "qk_norm=all means nothing with nGPT")):
            assert run(args(text, tmp_path / "bad", *extra)) == 2
            one_line(capsys, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("qk_norm", ["head", "all"])
def test_compiles_without_graph_breaks(qk_norm, fresh_dynamo):  # noqa: F811
    """Whole (one frame, compiled once over two steps) and per layer, as tests/test_compile_breaks.py."""
    model = build(f"gpt-mini(qk_norm={qk_norm})", **SHAPE)
    stats = CompileStats()
    steps(model, torch.compile(model, backend="eager", dynamic=False), n=2)
    report = stats.report()
    assert report["graph_breaks"] == 0 and report["frames_compiled"] == 1, report
    torch._dynamo.reset()
    compile_layers(model, backend="eager")
    stats = CompileStats()
    steps(model, model, n=2)
    report = stats.report()
    assert report["graph_breaks"] == 0 and report["frames_compiled"] <= 1, report
