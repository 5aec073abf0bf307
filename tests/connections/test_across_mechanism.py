"""The mechanism of the designs across a stack (skiplab.connections.across.base): the order in which a stack calls
the hooks, the sub-layer indices and roles it hands them, the additive connections' B(x), the combinations it
refuses, and the attention's separate key/value inputs."""

import pytest
import torch

from skiplab.connections import ACROSS, connection, parse_spec
from skiplab.connections.across import AcrossDesign, Stack
from skiplab.models import GPT, GPTConfig, Transformer, TransformerConfig
from skiplab.models.attention import SelfAttention


class Probe(AcrossDesign):
    """Logs every hook; runs each sub-layer as the connection would (owns_sublayers), or only looks."""

    name, patterns, owns_sublayers = "Probe", {}, True
    log: list = []

    def begin(self, x, state):
        self.log.append(("begin", tuple(x.shape)))

    def enter(self, i, x, state):
        self.log.append(("enter", i))
        return x

    def leave(self, i, x, state):
        self.log.append(("leave", i))

    def sublayer(self, k, x, conn, branch, state):
        self.log.append(("sublayer", k, self.stack_roles[k % len(self.stack_roles)]))
        return conn(x, branch)

    def finish(self, x, state):
        self.log.append(("finish",))
        return x

    def __init__(self, spec, stack):
        super().__init__(spec, stack)
        self.stack_roles = stack.roles


class Summing(AcrossDesign):
    name, patterns, owns_sublayers, replaces_sum = "Summing", {}, True, True


@pytest.fixture
def probes(monkeypatch):
    monkeypatch.setitem(ACROSS, "Probe", Probe)
    monkeypatch.setitem(ACROSS, "Summing", Summing)
    Probe.log = []
    yield Probe.log


def test_a_stack_calls_the_hooks_in_order_with_each_sublayer_index_and_role(probes):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8, connection="PreLN+Probe")
    plain = GPT(GPTConfig(**{**cfg.__dict__, "connection": "PreLN"})).eval()
    model = GPT(cfg).eval()
    model.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 20, (2, 5))
    torch.testing.assert_close(model(tokens), plain(tokens), rtol=0, atol=0)  # the default hooks change nothing
    assert probes == [("begin", (2, 5, 16)), ("enter", 0), ("sublayer", 0, "attn"), ("sublayer", 1, "ffn"),
                      ("leave", 0), ("enter", 1), ("sublayer", 2, "attn"), ("sublayer", 3, "ffn"), ("leave", 1),
                      ("finish",)]


def test_the_transformer_decoder_hands_three_roles_a_layer(probes):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=20, d_model=16, heads=2, encoder_layers=1, decoder_layers=2,
                            ffn_dim=32, decoder_connection="PreLN+Probe", connection="PreLN")
    model = Transformer(cfg).eval()
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 4))
    model(src, tgt)
    subs = [e[1:] for e in probes if e[0] == "sublayer"]
    assert subs == [(0, "attn"), (1, "cross"), (2, "ffn"), (3, "attn"), (4, "cross"), (5, "ffn")]


@pytest.mark.parametrize("spec, problem", [
    ("PostLN+Summing", "Summing replaces the residual sum of a connection y = x + B(x)"),
    ("2rSkip+LN+Summing", "2rSkip+LN is not of that form"),
    ("PreLN+UNet+Summing", "it cannot be combined with +UNet"),
    ("PreLN+Probe+Summing", "+Probe and +Summing both run every sub-layer; give one"),
])
def test_combinations_that_mean_nothing_are_refused_in_one_line(probes, spec, problem):
    with pytest.raises(ValueError, match="bad connection spec .*" + problem.replace("+", r"\+").replace("(", r"\(")
                       .replace(")", r"\)")) as err:
        parse_spec(spec)
    assert "\n" not in str(err.value)


def test_a_design_that_replaces_the_sum_may_join_the_value_residual(probes):
    assert [s.name for s in parse_spec("PreRMS+Summing+ValueRes").stack] == ["Summing", "ValueRes"]
    assert [s.name for s in parse_spec("PeriLN+Summing").stack] == ["Summing"]


@pytest.mark.parametrize("spec", ["PreLN", "PreRMS", "LNS", "PreDyT", "PeriLN", "SandwichLN"])
def test_an_additive_connection_is_x_plus_its_B(spec):
    torch.manual_seed(1)
    conn = connection(spec, 8).eval()
    for p in conn.parameters():  # norms away from their identity start, so G and G_out are seen
        p.data.uniform_(0.5, 1.5)
    branch = torch.nn.Linear(8, 8)
    x = torch.randn(3, 8)
    assert conn.additive
    torch.testing.assert_close(conn(x, branch), x + conn.branch_output(branch(conn.branch_input(x))))


def test_a_non_additive_connection_says_so():
    conn = connection("PostLN", 8)
    assert not conn.additive
    with pytest.raises(NotImplementedError, match="is not additive"):
        conn.branch_input(torch.zeros(1, 8))


def test_separate_key_and_value_inputs_use_the_same_weights():
    torch.manual_seed(2)
    attn = SelfAttention(16, 2).eval()
    x, xk, xv = torch.randn(3, 2, 5, 16).unbind(0)
    torch.testing.assert_close(attn(x, causal=True, kv=(x, x)), attn(x, causal=True))
    wq, wk, wv = attn.qkv_proj.weight.chunk(3)
    bq, bk, bv = attn.qkv_proj.bias.chunk(3)
    q, k, v = (attn.split(t @ w.T + b) for t, w, b in ((x, wq, bq), (xk, wk, bk), (xv, wv, bv)))
    scores = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(torch.ones(5, 5).triu(1).bool(), float("-inf"))
    heads = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(attn(x, causal=True, kv=(xk, xv)), attn.out_proj(heads))


def test_activation_checkpointing_is_refused_where_a_layer_must_not_run_twice(probes, monkeypatch):
    monkeypatch.setattr(Probe, "recomputable", False)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8,
                          connection="PreLN+Probe")).train()
    model.checkpointing = True
    with pytest.raises(ValueError, match=r"activation checkpointing runs a layer twice, which \+Probe cannot"):
        model(torch.randint(0, 20, (2, 5)))


def test_a_stack_names_its_sublayers():
    stack = Stack(3, 16, ("attn", "cross", "ffn"), "decoder")
    assert stack.sublayers == 9 and [stack.role(k) for k in (0, 4, 8)] == ["attn", "cross", "ffn"]


@pytest.mark.parametrize("shape", [(2, 5, 16), (2, 1, 16)])  # (2, 1, 16): one new position, as decoding passes
@pytest.mark.parametrize("per_position", [False, True])
def test_depth_sum_is_the_weighted_sum_over_depth(shape, per_position):
    """``across.base.depth_sum``: Σ_j a_j X_j with scalar or per-position weights, values and every gradient as the
    written-out sum's; the weights take the outputs' dtype."""
    from skiplab.connections.across.base import depth_sum
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    wshape = (*shape[:-1], 1) if per_position else ()
    ws = [torch.randn(wshape, generator=gen, dtype=torch.float32).double().requires_grad_() for _ in range(4)]
    got = depth_sum(ws, xs)
    want = sum(w * x for w, x in zip(ws, xs))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    for a, e in zip(torch.autograd.grad(got, ws + xs, g), torch.autograd.grad(want, ws + xs, g)):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *t: depth_sum(list(t[:4]), list(t[4:])), (*ws, *xs))
    half = depth_sum([w.detach().float() for w in ws], [x.detach().bfloat16() for x in xs])
    assert half.dtype == torch.bfloat16
