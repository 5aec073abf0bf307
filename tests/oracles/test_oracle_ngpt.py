"""skiplab's nGPT against ai2-olmo-core 3.0.0's normalised Transformer: one layer of skiplab's GPT with the ``nGPT``
connection against OLMo-core's ``NormalizedTransformerBlock`` (its ``NormalizedAttention`` and
``NormalizedFeedForward``) with the same random weights, at width 64 in float32 (OLMo-core computes its norms in float32), outputs and the gradients of the
input and of every weight and scaling vector; the output layer against its ``NormalizedLMHead``; the renormalisation
against its ``normalize_matrices``.

Mapping: skiplab's stacked ``qkv_proj`` is OLMo-core's ``w_q``, ``w_k``, ``w_v``; the MLP's ``up`` stacks ``w1``
(SiLU's input, skiplab's W_v) over ``w3`` (W_u); ``down`` is ``w2``; every learned vector is stored in the same
reparametrisation (the parameter, scaled by init/scale when used): α_p is ``attn_alpha`` / ``mlp_alpha``, s_qk is
both ``sq`` and ``sk`` (skiplab has one vector for both, as the paper), s_v is ``sw1``, s_u is ``sw3``, s_z is ``sz``.

Where they differ (skiplab follows the paper and the authors' NVIDIA/ngpt code): OLMo-core normalises q and k over all
heads at once (its ``L2Norm`` on n_heads·d_k features) and scales them before the rotary positions; skiplab normalises
each head and scales after the positions. The test gives OLMo-core's attention per-head norms (its own
``l2_normalize`` on each head) and draws s_qk equal on the feature pairs that RoPE rotates together, where scaling
before and after the rotation agree; the order itself is checked against the authors' code by hand
(tests/models/test_ngpt.py).

OLMo-core is installed without its dependencies (the Makefile); the modules it imports for files and data loading
(``cached_path``, ``bettermap``, ``importlib_resources``), none of which the blocks use, are stubbed here while it is
imported. Each comparison is shown to fail under a mutation of skiplab's nGPT (the last test).
"""

import importlib.metadata
import importlib.util
import math
import sys
import types

import pytest
import torch

from skiplab.connections import ngpt as ngpt_conn
from skiplab.models import GPTConfig, build_model
from skiplab.models import ngpt

OLMO_CORE_VERSION = "3.0.0"  # the version these mappings were checked against
D, HEADS, FFN, VOCAB, T = 64, 4, 96, 50, 7


def _stubs() -> dict[str, types.ModuleType]:
    """Modules OLMo-core imports at the top of its file and data code, standing in where they are not installed."""
    class SchemeClient:
        recoverable_errors = ()

    schemes = types.ModuleType("cached_path.schemes")
    schemes.SchemeClient, schemes.S3Client, schemes.add_scheme_client = SchemeClient, SchemeClient, lambda *a: None
    cached = types.ModuleType("cached_path")
    cached.cached_path, cached.schemes = (lambda *a, **k: None), schemes
    bettermap = types.ModuleType("bettermap")
    bettermap.ordered_map_per_thread = None
    return {"cached_path": cached, "cached_path.schemes": schemes, "bettermap": bettermap,
            "importlib_resources": types.ModuleType("importlib_resources")}


@pytest.fixture(scope="module")
def olmo():
    with pytest.MonkeyPatch.context() as mp:
        stubs = _stubs()
        missing = {name.split(".")[0] for name in stubs if name.split(".")[0] not in sys.modules
                   and importlib.util.find_spec(name.split(".")[0]) is None}
        for name, module in stubs.items():
            if name.split(".")[0] in missing:
                mp.setitem(sys.modules, name, module)
        block = pytest.importorskip("olmo_core.nn.transformer.block")
        attention = pytest.importorskip("olmo_core.nn.attention")
        yield types.SimpleNamespace(
            block=block, attention=attention,
            ff=pytest.importorskip("olmo_core.nn.feed_forward"), lm_head=pytest.importorskip("olmo_core.nn.lm_head"),
            rope=pytest.importorskip("olmo_core.nn.rope"), functional=pytest.importorskip("olmo_core.nn.functional"),
            layer_norm=pytest.importorskip("olmo_core.nn.layer_norm"))


def test_checked_against_the_installed_version(olmo):
    assert importlib.metadata.version("ai2-olmo-core") == OLMO_CORE_VERSION, (
        "ai2-olmo-core changed: check the mappings in this module and update OLMO_CORE_VERSION")


def skiplab_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, d_model=D, heads=HEADS, layers=1, ffn_dim=FFN, mlp="swiglu", bias=False,
                    tie=False, connection="nGPT", context=16)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # every weight and vector random, α with both signs (its |.| matters)
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.2 if p.dim() > 1 else 1.0) * p.abs().mean())
        dk = D // HEADS
        s = model.layers[0].attn.qk.s_qk.p.view(HEADS, 2, dk // 2)
        s[:, 1] = s[:, 0]  # equal on RoPE's pairs (i, i + d_k/2): OLMo-core scales before the rotation
    return model


class PerHeadL2(torch.nn.Module):
    """OLMo-core's own l2_normalize, on each head's d_k features (the paper's and the authors' per-head norm)."""

    def __init__(self, normalize):
        super().__init__()
        self.normalize = normalize

    def forward(self, x):
        return self.normalize(x.unflatten(-1, (HEADS, D // HEADS))).flatten(-2)


def olmo_block(olmo, model) -> torch.nn.Module:
    """OLMo-core's normalised block with ``model``'s first layer's weights."""
    att = olmo.attention.AttentionConfig(
        name=olmo.attention.AttentionType.normalized, n_heads=HEADS,
        qk_norm=olmo.layer_norm.LayerNormConfig(name=olmo.layer_norm.LayerNormType.l2_norm),
        rope=olmo.rope.RoPEConfig(name=olmo.rope.RoPEType.default, theta=int(model.cfg.rope_base)))
    ff = olmo.ff.FeedForwardConfig(name=olmo.ff.FeedForwardType.normalized, hidden_size=FFN)
    block = olmo.block.NormalizedTransformerBlock(d_model=D, block_idx=0, n_layers=1, sequence_mixer=att,
                                                  feed_forward=ff)
    block.attention.q_norm = PerHeadL2(olmo.functional.l2_normalize)
    block.attention.k_norm = PerHeadL2(olmo.functional.l2_normalize)
    layer = model.layers[0]
    q, k, v = layer.attn.qkv_proj.weight.chunk(3)
    w1, w3 = layer.mlp.up.weight.chunk(2)
    pairs = [(block.attention.w_q.weight, q), (block.attention.w_k.weight, k), (block.attention.w_v.weight, v),
             (block.attention.w_out.weight, layer.attn.out_proj.weight),
             (block.attention.sq, layer.attn.qk.s_qk.p), (block.attention.sk, layer.attn.qk.s_qk.p),
             (block.feed_forward.w1.weight, w1), (block.feed_forward.w3.weight, w3),
             (block.feed_forward.w2.weight, layer.mlp.down.weight),
             (block.feed_forward.sw1, layer.mlp.s_v.p), (block.feed_forward.sw3, layer.mlp.s_u.p),
             (block.attn_alpha, layer.conn_attn.alpha.p), (block.mlp_alpha, layer.conn_mlp.alpha.p)]
    with torch.no_grad():
        for theirs, ours in pairs:
            theirs.copy_(ours)
    return block


def unit_input() -> torch.Tensor:
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(5))
    return (x / x.norm(dim=-1, keepdim=True)).requires_grad_()


def grads_of_layer(layer) -> dict[str, torch.Tensor]:
    """skiplab's gradients, named as OLMo-core's parameters (s_qk's: the sum of sq's and sk's)."""
    q, k, v = layer.attn.qkv_proj.weight.grad.chunk(3)
    w1, w3 = layer.mlp.up.weight.grad.chunk(2)
    return {"attention.w_q.weight": q, "attention.w_k.weight": k, "attention.w_v.weight": v,
            "attention.w_out.weight": layer.attn.out_proj.weight.grad, "s_qk": layer.attn.qk.s_qk.p.grad,
            "feed_forward.w1.weight": w1, "feed_forward.w3.weight": w3, "feed_forward.w2.weight": layer.mlp.down.weight.grad,
            "feed_forward.sw1": layer.mlp.s_v.p.grad, "feed_forward.sw3": layer.mlp.s_u.p.grad,
            "attn_alpha": layer.conn_attn.alpha.p.grad, "mlp_alpha": layer.conn_mlp.alpha.p.grad}


def pair_sums(grad: torch.Tensor) -> torch.Tensor:
    """s_qk's gradient summed over RoPE's feature pairs: the gradient of the value the pair shares. Scaling before or
    after the rotation computes the same function of it, but splits its gradient between the two entries otherwise."""
    g = grad.view(HEADS, 2, D // HEADS // 2)
    return g[:, 0] + g[:, 1]


def compare_block(olmo) -> None:
    model = skiplab_model()
    block = olmo_block(olmo, model)
    r = torch.randn(2, T, D, generator=torch.Generator().manual_seed(6))
    x_ours, x_theirs = unit_input(), unit_input()
    ours, theirs = model.layers[0](x_ours), block(x_theirs)
    torch.testing.assert_close(ours, theirs)
    (ours * r).sum().backward()
    (theirs * r).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_theirs.grad)
    named = dict(block.named_parameters())
    expected = {n: p.grad for n, p in named.items()}
    expected["s_qk"] = pair_sums(named["attention.sq"].grad + named["attention.sk"].grad)
    ours = grads_of_layer(model.layers[0])
    ours["s_qk"] = pair_sums(ours["s_qk"])
    for name, grad in ours.items():
        torch.testing.assert_close(grad, expected[name], msg=lambda m, n=name: f"{n}: {m}")


def test_one_layer_equals_olmo_cores_normalized_block(olmo):
    compare_block(olmo)


def compare_head(olmo) -> None:
    model = skiplab_model()
    head = olmo.lm_head.NormalizedLMHead(d_model=D, vocab_size=VOCAB)
    with torch.no_grad():
        head.w_out.weight.copy_(model.head.weight)
        head.sz.copy_(model.logit_scale.s_z.p)
    h = unit_input()
    ours, theirs = model.logits(h), head(h)
    torch.testing.assert_close(ours, theirs)
    ours.sum().backward(), theirs.sum().backward()
    torch.testing.assert_close(model.logit_scale.s_z.p.grad, head.sz.grad)
    torch.testing.assert_close(model.head.weight.grad, head.w_out.weight.grad)


def test_the_output_layer_equals_olmo_cores_normalized_lm_head(olmo):
    compare_head(olmo)


def compare_renormalisation(olmo) -> None:
    """After a step every matrix back on the sphere as OLMo-core's ``NormalizedTransformer.normalize_matrices`` puts
    it: the block's (its own method), the output layer's (``NormalizedLMHead.normalize_matrices``) and the embedding's
    (the model's method normalises ``embeddings.weight`` along its last dimension with ``l2_normalize``; the whole
    model is not built here). The weights start off the sphere (random), so each comparison has work to check."""
    model = skiplab_model()
    block = olmo_block(olmo, model)
    head = olmo.lm_head.NormalizedLMHead(d_model=D, vocab_size=VOCAB)
    embed = model.embed.weight.detach().clone()
    with torch.no_grad():
        head.w_out.weight.copy_(model.head.weight)
    assert (model.head.weight.norm(dim=-1) - 1).abs().max() > 0.1 and (embed.norm(dim=-1) - 1).abs().max() > 0.1
    model.after_step()
    block.normalize_matrices()
    head.normalize_matrices()
    embed = olmo.functional.l2_normalize(embed, dim=-1)
    torch.testing.assert_close(model.head.weight, head.w_out.weight)
    torch.testing.assert_close(model.embed.weight, embed)
    layer = model.layers[0]
    torch.testing.assert_close(layer.attn.qkv_proj.weight, torch.cat([block.attention.w_q.weight,
                                                                      block.attention.w_k.weight,
                                                                      block.attention.w_v.weight]))
    torch.testing.assert_close(layer.attn.out_proj.weight, block.attention.w_out.weight)
    torch.testing.assert_close(layer.mlp.up.weight, torch.cat([block.feed_forward.w1.weight, block.feed_forward.w3.weight]))
    torch.testing.assert_close(layer.mlp.down.weight, block.feed_forward.w2.weight)


def test_the_renormalisation_equals_olmo_cores_normalize_matrices(olmo):
    compare_renormalisation(olmo)


MUTATIONS = {
    # α without its absolute value (the paper's and both codes' |α|)
    "alpha sign": (ngpt_conn.NGPT, "rate", lambda self, dims=4: self.alpha()),
    # the update without the outer Norm: h + α (Norm(F(h)) − h)
    "no outer norm": (ngpt_conn.NGPT, "forward",
                      lambda self, x, branch, skip=None: torch.lerp(x, ngpt_conn.unit(branch(x)), self.rate())),
    # the scores scaled by 1/√d_k, a plain attention's, instead of √d_k
    "softmax scale": (ngpt.QKNorm, "__init__", None),
    # v scaled by s_v alone, without √d
    "v without sqrt(d)": (ngpt.NormalizedMLP, "forward",
                          lambda self, x: self.down(torch.nn.functional.silu(x @ self.up.weight[:FFN].T * self.s_v())
                                                    * (x @ self.up.weight[FFN:].T * self.s_u()))),
    # the columns of W_O normalised as rows
    "W_O rows": (ngpt, "unit_matrices", None),
    # the embedding normalised along its columns
    "embedding columns": (ngpt, "unit_matrices", None),
}


def _mutate(monkeypatch, which: str) -> None:
    owner, name, value = MUTATIONS[which]
    if which == "softmax scale":
        init = ngpt.QKNorm.__init__

        def plain(self, d_model, heads):
            init(self, d_model, heads)
            self.softmax_scale = 1 / math.sqrt(d_model // heads)
        value = plain
    if which == "W_O rows":
        found = ngpt.unit_matrices

        def rows(model):
            return [(w, -1) for w, _ in found(model)]
        value = rows
    if which == "embedding columns":
        found = ngpt.unit_matrices

        def columns(model):
            return [(w, 0 if w is model.embed.weight else dim) for w, dim in found(model)]
        value = columns
    monkeypatch.setattr(owner, name, value)


@pytest.mark.parametrize("which", list(MUTATIONS))
def test_a_mutation_of_skiplabs_ngpt_fails_the_comparison(olmo, monkeypatch, which):
    _mutate(monkeypatch, which)
    compare = compare_renormalisation if which in ("W_O rows", "embedding columns") else compare_block
    with pytest.raises(AssertionError):
        compare(olmo)


def test_a_mutation_of_the_logit_scale_fails_the_head_comparison(olmo, monkeypatch):
    monkeypatch.setattr(ngpt.LogitScale, "forward", lambda self, logits: logits * self.s_z.p)  # s_z without 1/s_scale
    with pytest.raises(AssertionError):
        compare_head(olmo)
