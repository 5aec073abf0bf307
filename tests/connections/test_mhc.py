"""mHC at initialisation: the paper's gating factors (Table 5) and, where the paper is silent, the biases and φ of
transformers' DeepSeek-V4 port, which make every block the pre-norm block on the stack's n equal streams."""

import pytest
import torch

import skiplab
from skiplab import Place
from skiplab.connections.hyper import PHI_STD
from skiplab.models import GPT, GPTConfig
from tests.connections.test_formulas import ln
from tests.conftest import DIM, make_branch


def fresh(spec="mHC", dim=DIM, place=None):
    torch.manual_seed(0)
    return skiplab.connection(spec, dim, place=place)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_mhc_starts_with_zero_biases_small_gates_and_phi_of_std_0_02(n):
    conn = fresh(f"mHC(n={n})", dim=64, place=Place(3, "encoder", 4, 0, 2, 2))
    assert torch.equal(conn.b_pre, torch.zeros(n)) and torch.equal(conn.b_post, torch.zeros(n))
    assert torch.equal(conn.b_res, torch.zeros(n, n))  # the same at every layer: no stream singled out
    assert conn.alpha.tolist() == pytest.approx([0.01] * 3)
    assert conn.phi.shape == (n * 64, 2 * n + n * n)
    assert conn.phi.mean().abs() < 4 * PHI_STD / conn.phi.numel() ** 0.5
    assert conn.phi.std().item() == pytest.approx(PHI_STD, rel=0.1)


@pytest.mark.parametrize("n", [1, 3, 4])
def test_mhc_maps_at_initialisation_are_half_one_and_uniform(n):
    conn = fresh(f"mHC(n={n})")
    x = torch.randn(2, 5, n, DIM) * 3
    pre, res, post = conn.weights(x)
    # with φ's small term: within α·|x̃φ| of the static values (|x̃φ| ~ 0.02·sqrt(nC), here < 0.01)
    torch.testing.assert_close(pre, torch.full_like(pre, 0.5), rtol=0, atol=1e-2)
    torch.testing.assert_close(post, torch.ones_like(post), rtol=0, atol=1e-2)
    torch.testing.assert_close(res, torch.full_like(res, 1 / n), rtol=0, atol=1e-2)
    with torch.no_grad():
        conn.phi.zero_()
    pre, res, post = conn.weights(x)
    assert torch.equal(pre, torch.full_like(pre, 0.5))  # σ(0)
    assert torch.equal(post, torch.ones_like(post))  # 2σ(0)
    torch.testing.assert_close(res, torch.full_like(res, 1 / n), rtol=0, atol=1e-7)  # Sinkhorn(exp(0)) = 11ᵀ/n
    torch.testing.assert_close(conn.stats()["H_res_static"], torch.full((n, n), 1 / n))


@pytest.mark.parametrize("n", [1, 4])
def test_mhc_block_at_initialisation_is_the_preln_block_on_equal_streams(n):
    conn, branch = fresh(f"mHC(n={n})"), make_branch("seq")
    with torch.no_grad():
        conn.phi.zero_()
    x = torch.randn(2, 5, DIM) * 2 + 0.5
    streams = skiplab.input_norm(f"mHC(n={n})", DIM)(x)
    expect = x + branch(ln(n / 2 * x, conn.norm.weight, conn.norm.bias))  # H^pre x = ½·Σ x_i = (n/2)·x
    torch.testing.assert_close(conn(streams, branch), expect.unsqueeze(-2).expand(2, 5, n, DIM))
    # LN is scale-invariant up to its ε: the pre-norm block's own x + F(LN(x))
    torch.testing.assert_close(expect, x + branch(ln(x, conn.norm.weight, conn.norm.bias)), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_an_mhc_gpt_at_initialisation_is_the_preln_gpt():
    def build(spec):
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=30, d_model=16, heads=2, layers=4, ffn_dim=32, context=10,
                             connection=spec)).eval()

    ref, mhc = build("PreLN"), build("mHC")
    state = {("norm.0." + k[5:] if k.startswith("norm.") else k): v for k, v in ref.state_dict().items()}
    missing, unexpected = mhc.load_state_dict(state, strict=False)  # the same branches and norms (final: after Σ)
    assert not unexpected and missing and all(k.endswith(("phi", "alpha", "b_pre", "b_post", "b_res")) for k in missing)
    for conn in (m for m in mhc.modules() if isinstance(m, skiplab.Connection)):
        conn.phi.zero_()
    for model in (ref, mhc):  # LN(c·h) = LN(h) exactly without ε: the streams' scale n/2 (input) and n (sum) drop out
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.eps = 0.0
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(mhc(tokens), ref(tokens), rtol=1e-4, atol=1e-5)
