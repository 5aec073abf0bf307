"""``+AttnRes`` (Attention Residuals) on the mechanism across a stack: the spec and the combinations refused in one
line, the uniform mix at the start, Block with S = 1 being Full, incremental decoding against the full forward
(GPT and Transformer), the Transformer's two stacks, the mixing weights of a batch, stats and rows, activation
checkpointing refused. The formulas themselves: ``tests/oracles/test_oracle_attnres.py``."""

import copy

import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.bench.steps import build
from skiplab.compiled import CompileStats, compile_layers
from skiplab.connections import parse_spec
from skiplab.connections.across import AttnRes
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig


def gpt(spec, layers=4, d=16, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=30, d_model=d, heads=2, layers=layers, ffn_dim=2 * d, context=12, norm="RMS", connection=spec)
    return GPT(GPTConfig(**{**cfg, **kw})).eval()


def tokens(b=2, t=9):
    return torch.randint(0, 30, (b, t), generator=torch.Generator().manual_seed(1))


def randomise(design, seed=3):
    """Every parameter of the mixes away from its start (queries, LoRA factors, norm gains)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in design.named_parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("text, canonical", [
    ("PreRMS+AttnRes", "PreRMS+AttnRes"),
    ("PreRMS+AttnRes(block=0,query=static)", "PreRMS+AttnRes"),
    ("PreLN+AttnRes(block=2)", "PreLN+AttnRes(block=2)"),
    ("PeriLN+AttnRes(query=lora,rank=8)+ValueRes", "PeriLN+AttnRes(query=lora,rank=8)+ValueRes"),
    ("LNS+RMS+AttnRes(block=4)", "PreRMS(scale=depth)+AttnRes(block=4)"),
])
def test_the_spec_reads_and_writes_back(text, canonical):
    assert skiplab.connection(text, 8).spec == canonical
    assert parse_spec(canonical) == parse_spec(text)


@pytest.mark.parametrize("text, problem", [
    ("PreRMS+AttnRes(block=-1)", "option block: must be an integer >= 0, got -1"),
    ("PreRMS+AttnRes(block=1.5)", "option block: must be an integer >= 0, got 1.5"),
    ("PreRMS+AttnRes(query=dynamic)", "option query: must be one of static, lora, got 'dynamic'"),
    ("PreRMS+AttnRes(query=lora,rank=0)", "option rank: must be an integer >= 1, got 0"),
    ("PreRMS+AttnRes(rank=8)", "+AttnRes(rank=...) is the LoRA query's rank; query=static has none"),
    ("PostLN+AttnRes", "+AttnRes replaces the residual sum of a connection y = x + B(x)"),
    ("HC+AttnRes", "HC is not of that form"),
    ("PreRMS+AttnRes+UNet", "+AttnRes replaces the residual sum; it cannot be combined with +UNet"),
    ("PreRMS+AttnRes(window=2)", "AttnRes has no option 'window'"),
])
def test_bad_specs_are_refused_in_one_line(text, problem):
    with pytest.raises(ValueError) as err:
        parse_spec(text)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_a_lora_rank_not_below_the_width_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^\+AttnRes\(query=lora\): rank 64 must be less than the width 16$"):
        gpt("PreRMS+AttnRes(query=lora)")


def test_at_the_start_every_mix_is_uniform():
    """w = 0: sub-layer l reads each of its n sources with weight 1/n (Full: n = l + 1; the output's mix n = 2L + 1),
    and the first sub-layer's input is the embedding itself."""
    m = gpt("PreRMS+AttnRes")
    design = m.across.designs[0]
    x = tokens()
    mean, std = design.depth_weights(lambda: m(x))
    k = 8
    expect = torch.tensor([[1.0 / (i + 1) if j <= i else float("nan") for j in range(k + 1)] for i in range(k + 1)])
    torch.testing.assert_close(mean, expect, equal_nan=True)
    torch.testing.assert_close(std, torch.where(expect.isnan(), expect, 0.0), equal_nan=True)
    seen = {}
    m.layers[0].conn_attn.norm.register_forward_hook(lambda mod, args, out: seen.setdefault("h0", args[0]))
    m.layers[0].conn_mlp.norm.register_forward_hook(lambda mod, args, out: seen.setdefault("h1", args[0]))
    with torch.no_grad():
        m(x)
        e = m.embed(x)
        v1 = m.layers[0].attn(m.layers[0].conn_attn.norm(e), causal=True)
    torch.testing.assert_close(seen["h0"], e)  # h_0 = v_0
    torch.testing.assert_close(seen["h1"], (e + v1) / 2)  # h_1 = ½ v_0 + ½ v_1


@torch.no_grad()
def test_a_layers_output_is_the_next_mix_the_next_layer_reads():
    """The stream handed on is h_{l+1}: layer 0's output is what layer 1's attention normalises, the last layer's the
    output's mix, which the final norm reads."""
    m = gpt("PreRMS+AttnRes(block=3)", layers=3)
    randomise(m.across)
    seen = {}
    for i, layer in enumerate(m.layers):
        layer.register_forward_hook(lambda mod, args, out, i=i: seen.setdefault(f"out{i}", out))
        layer.conn_attn.norm.register_forward_hook(lambda mod, args, out, i=i: seen.setdefault(f"in{i}", args[0]))
    m.norm.register_forward_hook(lambda mod, args, out: seen.setdefault("final", args[0]))
    m(tokens())
    torch.testing.assert_close(seen["out0"], seen["in1"], rtol=0, atol=0)
    torch.testing.assert_close(seen["out1"], seen["in2"], rtol=0, atol=0)
    torch.testing.assert_close(seen["out2"], seen["final"], rtol=0, atol=0)


def test_block_mixes_read_the_embedding_the_block_sums_and_the_partial_sum():
    """Block S = 3 over 8 sub-layers: blocks {0,1,2}, {3,4,5}, {6,7}; at the start each mix is uniform over its
    sources: sub-layer 0 reads b_0; 1, 2 read b_0 and block 1's partial sum; 3 reads b_0, b_1; the output b_0..b_3."""
    m = gpt("PreRMS+AttnRes(block=3)")
    mean, _ = m.across.designs[0].depth_weights(lambda: m(tokens()))
    sources = [1, 2, 2, 2, 3, 3, 3, 4, 4]
    assert mean.shape == (9, 4)
    for row, n in zip(mean, sources):
        torch.testing.assert_close(row[:n], torch.full((n,), 1.0 / n))
        assert row[n:].isnan().all()


@torch.no_grad()
def test_block_of_one_sublayer_is_full_attnres_and_the_design_changes_the_model():
    full, one, plain = gpt("PreRMS+AttnRes"), gpt("PreRMS+AttnRes(block=1)"), gpt("PreRMS")
    randomise(full.across)
    one.load_state_dict(full.state_dict())
    x = tokens()
    torch.testing.assert_close(one(x), full(x), rtol=0, atol=0)
    plain.load_state_dict({k: v for k, v in full.state_dict().items() if not k.startswith("across.")})
    assert (plain(x) - full(x)).abs().max() > 1e-2


@pytest.mark.parametrize("spec", ["PreRMS+AttnRes", "PreRMS+AttnRes(block=3)", "PeriLN+AttnRes(block=2)+ValueRes",
                                  "PreLN+AttnRes(query=lora,rank=8)"])
@torch.no_grad()
def test_cached_steps_are_the_full_forward(spec):
    m = gpt(spec, positions="rope").double()
    randomise(m.across)
    x = tokens()
    full = m(x)
    caches = m.new_caches()
    prefix = m(x[:, :4], caches)
    steps = [m(x[:, t : t + 1], caches) for t in range(4, x.shape[1])]
    torch.testing.assert_close(torch.cat([prefix, *steps], 1), full, rtol=1e-12, atol=1e-12)
    state = m.start(x[:, :5])  # the decoding interface: log-probs in float32
    torch.testing.assert_close(m.step(x[:, 5], state), full[:, 5].log_softmax(-1).float())


def transformer(spec="PreRMS+AttnRes(block=2)", **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=30, d_model=16, ffn_dim=32, heads=2, encoder_layers=2, decoder_layers=3, connection=spec)
    return Transformer(TransformerConfig(**{**cfg, **kw}))


def test_the_transformer_runs_it_in_both_stacks_forward_and_backward():
    m = transformer().train()
    enc, dec = m.encoder.across.designs[0], m.decoder.across.designs[0]
    assert (enc.query.shape, dec.query.shape) == ((5, 16), (10, 16))  # 2·2 + 1 and 3·3 + 1 mixes
    src, tgt = torch.randint(3, 30, (2, 7)), torch.randint(3, 30, (2, 5))
    loss = F.cross_entropy(m(src, tgt).transpose(1, 2), tgt)
    loss.backward()
    for name, p in m.named_parameters():
        if name.endswith("query"):
            assert p.grad is not None and p.grad.abs().sum() > 0, name  # every pseudo-query learns (the output's too)
    m.eval()
    mean, _ = dec.depth_weights(lambda: m(src, tgt))
    assert mean.shape == (10, 6)  # 9 sub-layers in blocks of 2: b_0 and 5 block sums


@torch.no_grad()
def test_the_transformer_decoder_decodes_incrementally_as_it_runs_whole():
    m = transformer("PreRMS+AttnRes(block=2)", decoder_connection="PreRMS+AttnRes(query=lora,rank=4)").double().eval()
    for stack in (m.encoder, m.decoder):
        randomise(stack.across)
    src, tgt = torch.randint(3, 30, (2, 7)), torch.randint(3, 30, (2, 5))
    full = m(src, tgt).log_softmax(-1).float()  # the decoding interface's log-probs are float32
    state = m.start(m.encode(src))
    steps = torch.stack([m.step(tgt[:, t], state) for t in range(tgt.shape[1])], 1)
    torch.testing.assert_close(steps, full, rtol=1e-6, atol=1e-6)


def test_stats_and_rows_give_each_mix_at_its_layer_and_role():
    m = gpt("PreRMS+AttnRes", layers=2)
    design = m.across.designs[0]
    with torch.no_grad():
        design.query.copy_(torch.arange(5.0)[:, None] * torch.ones(16) / 4)  # ‖w_l‖ = l
    torch.testing.assert_close(design.stats()["query_norm"], torch.arange(5.0))
    assert design.rows() == [(0, "query_norm_attn", 0.0), (0, "query_norm_ffn", 1.0), (1, "query_norm_attn", 2.0),
                             (1, "query_norm_ffn", 3.0), (2, "query_norm_out", 4.0)]
    lora = gpt("PreRMS+AttnRes(query=lora,rank=4)", layers=2).across.designs[0]
    assert lora.stats()["lora_norm"].tolist() == [0.0] * 5  # U starts at zero
    randomise(lora)
    expect = torch.stack([torch.linalg.matrix_norm(lora.up[i] @ lora.down[i]) for i in range(5)]).detach()
    torch.testing.assert_close(lora.stats()["lora_norm"], expect)


def test_depth_weights_are_the_mean_and_std_over_the_batchs_positions():
    """Each mix's softmax weights by hand from the sources it was given (α_i = softmax_i(wᵀ RMSNorm(s_i))),
    averaged over the batch's 2 × 9 positions."""
    m = gpt("PreRMS+AttnRes(block=2)", layers=2)
    design = m.across.designs[0]
    randomise(design)
    given = {}
    original = design.mix

    def spy(i, sources, squares=None):
        given[i] = [s.detach() for s in sources]
        return original(i, sources, squares)

    design.mix = spy
    mean, std = design.depth_weights(lambda: m(tokens()))
    assert design.mix_log is None and mean.shape == (5, 3)
    with pytest.raises(ValueError, match="forward\\(\\) ran no pass through this stack"):
        design.depth_weights(lambda: None)
    for i, sources in given.items():
        keys = torch.stack([F.rms_norm(s, (16,), design.key_norms[i].weight.detach(), 1e-5) for s in sources], -2)
        alpha = (keys @ design.query[i].detach()).softmax(-1).reshape(-1, len(sources))  # (B·T, n)
        torch.testing.assert_close(mean[i, : len(sources)], alpha.mean(0))
        torch.testing.assert_close(std[i, : len(sources)], alpha.std(0, unbiased=False))
        assert len(sources) == 1 or std[i, : len(sources)].min() > 0  # the weights differ between positions
    torch.testing.assert_close(mean.nan_to_num().sum(1), torch.ones(5))


def test_activation_checkpointing_is_refused():
    m = gpt("PreRMS+AttnRes(block=2)").train()
    m.checkpointing = True
    with pytest.raises(ValueError, match=r"activation checkpointing runs a layer twice, which \+AttnRes cannot"):
        m(tokens())
    assert not AttnRes.recomputable


def test_it_is_listed_with_its_formula():
    assert "softmax" in skiplab.available_connections()["+AttnRes(block=0|S,query=static|lora)"]


def test_a_deep_copy_and_a_state_dict_round_trip_keep_the_mix():
    m = gpt("PreRMS+AttnRes(block=3,query=lora,rank=4)")
    randomise(m.across)
    again = gpt("PreRMS+AttnRes(block=3,query=lora,rank=4)")
    again.load_state_dict(copy.deepcopy(m).state_dict())
    with torch.no_grad():
        torch.testing.assert_close(again(tokens()), m(tokens()), rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["PreLN+AttnRes", "PreLN+AttnRes(block=2,query=lora,rank=8)"])
def test_it_compiles_without_graph_breaks(spec):
    """dynamo alone (the ``eager`` backend), as ``tests/test_compile_breaks.py`` counts it: the whole model one frame,
    compiled once over two steps; per layer no break, one compilation a layer (each mixes its own number of sources)."""
    def steps(forward):
        x = torch.randint(0, 40, (2, 8))
        for _ in range(2):
            F.cross_entropy(forward(x).transpose(1, 2), x).backward()

    torch._dynamo.reset()
    try:
        model = build(f"gpt-mini(connection={spec})", d_model=32, ffn_dim=64, heads=2, layers=2, context=8,
                      vocab_size=40)
        stats = CompileStats()
        steps(torch.compile(model, backend="eager", dynamic=False))
        report = stats.report()
        assert report["graph_breaks"] == 0 and report["frames_compiled"] == 1, report
        torch._dynamo.reset()
        compile_layers(model, backend="eager")
        stats = CompileStats()
        steps(model)
        report = stats.report()
        assert report["graph_breaks"] == 0 and report["frames_compiled"] == 2, report
    finally:
        torch._dynamo.reset()
