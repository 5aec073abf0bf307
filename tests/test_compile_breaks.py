"""Graph breaks and recompiles of every design, counted on the CPU: a tiny decoder-only model compiled whole
(``train lm --compile``) and per layer (``skiplab bench --groups gpu``), dynamo alone (the ``eager`` backend: the
same tracing a card's compile does, without generating kernels). The goal is 0 breaks for every design, so that
a card's minutes are not spent finding them; a second step must not compile again."""

import pytest
import torch
import torch.nn.functional as F

from skiplab.bench.gpu import GPU_DESIGNS
from skiplab.bench.steps import build
from skiplab.bench.shapes import DEPTH_DESIGNS, LM_DESIGNS
from skiplab.compiled import CompileStats, compile_layers, set_recompile_limit

NEW_DESIGNS = {"LAuReL", "LAuReL(form=lr,norm=rms)", "PreLN+Scalars(per=sublayer)", "PreLN+Backout"}  # beside the bench's
DESIGNS = sorted(set(LM_DESIGNS) | set(GPU_DESIGNS) | set(DEPTH_DESIGNS) | NEW_DESIGNS | {"PreLN"})
SHAPE = dict(d_model=32, ffn_dim=64, heads=2, layers=2, context=8, vocab_size=40)


def steps(model, forward, n=2):
    x = torch.randint(0, 40, (2, 8))
    for _ in range(n):
        loss = F.cross_entropy(forward(x).transpose(1, 2), x)
        loss.backward()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    set_recompile_limit(64)
    yield
    torch._dynamo.reset()
    set_recompile_limit(8)


# designs whose layers differ in a constant the layer's code reads: one compilation per distinct layer (the value
# residual's first layer keeps its values, LNS scales layer l by 1/sqrt(l), Mix-LN's first layers are post-norm,
# Keel's first layer has no α and its first sub-layer no second norm)
# Keel's first layer differs; Attention Residuals mixes more sources each layer, MUDD's layer 0 is plain, the
# per-sub-layer scalars read each sub-layer's own index: one compilation a layer; LAuReL-PA's first layers have fewer
# earlier inputs to mix than k − 1 (one compilation for each count, then one for every later layer)
PER_LAYER = {"LAuReL(form=pa)": 2, "PreLN+ValueRes": 2, "LNS": 2, "MixLN": 2, "Keel": 2, "PreLN+AttnRes": 2, "PreLN+AttnRes(block=2)": 2,
             "PreLN+MUDD": 2, "PreLN+Scalars(per=sublayer)": 2}


@pytest.mark.parametrize("design", DESIGNS)
def test_compiles_without_graph_breaks(design):
    """Whole (one frame, compiled once over two steps) and per layer (one compilation serves every layer)."""
    model = build(f"gpt-mini(connection={design})", **SHAPE)
    stats = CompileStats()
    whole = torch.compile(model, backend="eager", dynamic=False)
    steps(model, whole, n=2)
    report = stats.report()
    assert report["graph_breaks"] == 0 and report["frames_compiled"] == 1, f"{design}, whole: {report}"

    torch._dynamo.reset()
    compile_layers(model, backend="eager")
    stats = CompileStats()
    steps(model, model, n=2)
    report = stats.report()
    assert report["graph_breaks"] == 0, f"{design}, per layer: {report}"
    assert report["frames_compiled"] <= PER_LAYER.get(design, 1), f"{design}, per layer: {report}"
