import pytest
import torch
import torch.nn.functional as F

import skiplab
from skiplab.connections import REGISTRY, parse_spec
from skiplab.models import PRESETS, PreActBlock, build_model, model_config
from tests.connections.test_registry import EXAMPLES


def hand_count(n: int, classes: int = 10, c_in: int = 3) -> int:
    """Parameters of the standard CIFAR PreAct-ResNet with projection shortcuts, counted by hand."""
    total, prev = 9 * c_in * 16, 16
    for stage, c in enumerate((16, 32, 64)):
        for i in range(n):
            total += 2 * prev + 9 * prev * c + 2 * c + 9 * c * c + (prev * c if prev != c else 0)
            prev = c
    return total + 2 * 64 + 64 * classes + classes


def test_preact_resnet110_has_the_published_1_7m_parameters():
    model = build_model(model_config("preact-resnet110"))
    count = sum(p.numel() for p in model.parameters())
    assert count == hand_count(18)
    assert round(count / 1e6, 1) == 1.7


@pytest.mark.parametrize("name,n", [("preact-resnet20", 3), ("preact-resnet32", 5), ("preact-resnet44", 7), ("preact-resnet56", 9)])
def test_preset_depths(name, n):
    model = build_model(model_config(name))
    assert sum(p.numel() for p in model.parameters()) == hand_count(n)
    assert len(list(skiplab.iter_connections(model))) == 3 * n


@pytest.mark.parametrize("spec", EXAMPLES)
def test_every_connection_builds_into_every_preset(spec):
    if skiplab.connection(spec, 4).needs_stack:  # n residual streams through blocks that change width: refused
        with pytest.raises(ValueError, match="needs a stack that holds its residual streams"):
            model_config("preact-resnet20", connection=spec)
        return
    if skiplab.connection(spec, 4).model_side:  # a design whose model is the GPT's (nGPT): refused
        with pytest.raises(ValueError, match="the GPT's alone, not the PreAct-ResNet's"):
            model_config("preact-resnet20", connection=spec)
        return
    if skiplab.connection(spec, 4).model_requires:  # a design partly inside the attention (HybridNorm): refused
        with pytest.raises(ValueError, match="the PreAct-ResNet has no attention"):
            model_config("preact-resnet20", connection=spec)
        return
    if REGISTRY[parse_spec(spec).name].previous_inputs(parse_spec(spec)):  # LAuReL-PA reads earlier blocks: refused
        with pytest.raises(ValueError, match=r"LAuReL\(form=pa\) mixes the inputs of earlier blocks"):
            model_config("preact-resnet20", connection=spec)
        return
    if "norm=rms" in spec and spec.startswith("LAuReL"):  # Gemma 3n's term reads G(x): no place beside a projection
        with pytest.raises(ValueError, match=r"LAuReL\(norm=rms\)"):
            build_model(model_config("preact-resnet20", connection=spec))
        return
    for name in [p for p in PRESETS if p.startswith("preact-resnet")]:
        model = build_model(model_config(name, connection=spec))
        conns = [c for _, c in skiplab.iter_connections(model)]
        assert len(conns) == 3 * model.cfg.blocks_per_stage
        assert {c.spec for c in conns} == {skiplab.connection(spec, 4).spec}
    model = build_model(model_config("preact-resnet20", connection=spec, in_channels=1))
    logits = model(torch.randn(2, 1, 32, 32))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    logits.sum().backward()


def test_projection_shortcut_shapes():
    model = build_model(model_config("preact-resnet20", width=2))
    down = [b for b in model.blocks if b.shortcut is not None]
    assert [tuple(b.shortcut.weight.shape) for b in down] == [(64, 32, 1, 1), (128, 64, 1, 1)]
    assert all(b.shortcut.stride == (2, 2) for b in down)
    h = model.stem(torch.randn(2, 3, 32, 32))
    shapes = []
    for block in model.blocks:
        h = block(h)
        shapes.append(tuple(h.shape[1:]))
    assert shapes[0] == (32, 32, 32) and shapes[3] == (64, 16, 16) and shapes[-1] == (128, 8, 8)


def test_1xskip_block_is_the_standard_preact_unit():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 8, 8)
    for c_out, stride in [(16, 1), (32, 2)]:
        block = PreActBlock(16, c_out, stride, "1xSkip").eval()
        with torch.no_grad():
            for bn in (block.bn1, block.bn2):
                bn.running_mean.normal_()
                bn.running_var.uniform_(0.5, 2)
        pre = F.relu(block.bn1(x))
        skip = x if block.shortcut is None else block.shortcut(pre)
        expect = skip + block.conv2(F.relu(block.bn2(block.conv1(pre))))
        torch.testing.assert_close(block(x), expect)


def test_block_with_a_projection_runs_the_preactivation_once():
    block = PreActBlock(16, 32, 2, "2rSkip+LN")
    calls = []
    block.bn1.register_forward_hook(lambda *a: calls.append(1))
    block(torch.randn(2, 16, 8, 8))
    assert len(calls) == 1


def test_bad_model_settings():
    with pytest.raises(ValueError, match="6n \\+ 2"):
        model_config("preact-resnet20", depth=21)
    with pytest.raises(ValueError, match="unknown model 'resnet50'"):
        model_config("resnet50")
    with pytest.raises(ValueError, match="bad connection spec"):
        model_config("preact-resnet20", connection="3rskip")
