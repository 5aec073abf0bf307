"""``skiplab bench --groups gpu`` at smoke size on the CPU: every row is produced (values are measured on a card,
never asserted here); the card's peak is matched by its exact name; the layers compile once for all of them; the
compiled output layer's loss is the model's."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from skiplab.bench import run
from skiplab.bench.gpu import GPU_DESIGNS, SMOKE, gpu, head_loss
from skiplab.bench.steps import build
from skiplab.bench.suite import auto_out
from skiplab.compiled import CompileStats, compile_layers
from skiplab.device import PEAK_BF16_TFLOPS, peak_note, peak_tflops


def test_gpu_group_at_smoke_size_produces_every_row(tmp_path):
    rows = run(quick=True, groups=("gpu",), out=str(tmp_path), progress=False)
    names = [r.name for r in rows]
    assert all(r.group == "gpu" for r in rows)
    for name in ("float32 matmul 64^3", "PreLN tokens/s", "PreLN model FLOP/s", "PreLN MFU",
                 "PreLN eager / compiled step", "skiplab PreLN / transformers GPT2LMHeadModel step"):
        assert name in names, name
    assert any(n.endswith("PreLN step, compiled per layer") for n in names)
    step = next(n for n in names if n.endswith("PreLN step, compiled per layer"))
    assert " (d 32, 2 layers), " in step  # the size measured, not the preset's (gpt2-small read as 124M)
    flops = rows[names.index("PreLN model FLOP/s")].note
    assert "= 0 MFLOP" not in flops and float(flops.split("= ")[1].split(" MFLOP")[0]) > 0
    chunked = rows[names.index("PreLN, chunked head loss step")]
    assert math.isfinite(chunked.value) and "0 graph breaks" in chunked.note and "loss " in chunked.note
    liger = rows[names.index("PreLN, liger head loss step")]
    assert math.isnan(liger.value) and "runs on CUDA only" in liger.note
    mfu = rows[names.index("PreLN MFU")]
    assert math.isnan(mfu.value) and mfu.note == "no known peak for this device (cpu)"
    for design in GPU_DESIGNS:
        row = rows[names.index(f"{design} step")]
        assert math.isfinite(row.value) and row.value > 0 and "graph breaks" in row.note, row
    assert "designs not reached" not in names
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert [r["name"] for r in saved["rows"]] == names
    assert saved["environment"]["torch"] == torch.__version__


def test_design_rows_stop_at_the_time_budget():
    rows = gpu(None, {"gpu_sizes": SMOKE.__class__(**{**SMOKE.__dict__, "budget_s": 0.0, "hf_reference": False})})
    last = rows[-1]
    assert last.name == "designs not reached" and last.value == len(GPU_DESIGNS)
    assert last.note.endswith(", ".join(GPU_DESIGNS))
    assert not any(r.name == f"{d} step" for r in rows for d in GPU_DESIGNS)


def test_a_design_with_its_own_model_is_priced_against_preln_built_the_same_way(monkeypatch):
    """nGPT's recipe builds SwiGLU, rotary positions, no biases and an untied output: its goal row divides by PreLN
    built with those fields (the design's own cost); a second row prices the whole model against the preset's PreLN."""
    import skiplab.bench.gpu as gpu_module
    built = []
    real = gpu_module.build
    monkeypatch.setattr(gpu_module, "build", lambda spec, **kw: built.append((spec, kw)) or real(spec, **kw))
    rows = gpu(None, {"gpu_sizes": SMOKE.__class__(**{**SMOKE.__dict__, "designs": ("nGPT", "PostLN"),
                                                      "hf_reference": False})})
    by_name = {r.name: r for r in rows}
    own = by_name["nGPT step"]
    assert "compiled PreLN with nGPT's model (mlp=swiglu, positions=rope, bias=false, tie=false), in turn" in own.note
    assert "goal 1.15x" in own.note
    whole = by_name["nGPT whole model step"]
    assert "the preset's compiled PreLN" in whole.note and math.isfinite(whole.value) and whole.value > 0
    assert "compiled PreLN, in turn; goal 1.10x" in by_name["PostLN step"].note
    assert "PostLN whole model step" not in by_name
    matched = [kw for spec, kw in built if spec.endswith("(connection=PreLN)") and "mlp" in kw]
    assert matched and matched[0] == {**SMOKE.config(), "mlp": "swiglu", "positions": "rope", "bias": False, "tie": False}


def test_rows_are_written_as_they_come(tmp_path):
    seen = []
    gpu(None, {"gpu_sizes": SMOKE.__class__(**{**SMOKE.__dict__, "designs": ("PostLN",), "hf_reference": False}),
               "emit": lambda rows: seen.append(len(rows))})
    assert seen == sorted(seen) and seen[0] == 1 and len(seen) >= 3  # the matmul row first, then each as measured


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 NVL", 835.0),
                                        ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-40GB", 312.0),
                                        ("NVIDIA RTX A1000", None), ("NVIDIA H100 80GB HBM3 (custom)", None)])
def test_peak_is_matched_by_the_exact_device_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    card = torch.device("cuda")
    assert peak_tflops(card) == peak
    assert peak_note(card) == ("" if peak else f"no known peak for this device ({name})")
    assert peak_tflops(torch.device("cpu")) is None and "A100" not in " ".join(k for k in PEAK_BF16_TFLOPS if "A1000" in k)


def test_auto_out_names_the_card_and_the_date(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    out = auto_out("docs/results/bench")
    assert out.startswith("docs/results/bench/h100-80gb-hbm3-20") and len(out.rsplit("-", 3)[-3]) == 4


def test_head_loss_is_the_models_loss_with_a_padded_vocabulary():
    model = build("gpt-mini(connection=PreLN)", d_model=32, ffn_dim=64, heads=2, layers=2, context=8,
                  vocab_size=50, pad_vocab=64, tie=False)
    x = torch.randint(0, 50, (3, 8))
    y = torch.randint(0, 50, (3, 8))
    want = F.cross_entropy(model(x).transpose(1, 2), y)
    got = head_loss(model.hidden(x), model.output_weight(), y, 50)
    assert model.output_weight().shape[0] == 64
    torch.testing.assert_close(got, want)
    wrong = head_loss(model.hidden(x), model.output_weight(), y, 64)  # the padding's logits must be cut off
    assert not torch.allclose(wrong, want)


def test_one_compiled_graph_serves_every_layer():
    torch._dynamo.reset()
    model = build("gpt-mini(connection=PreLN)", d_model=32, ffn_dim=64, heads=2, layers=4, context=8, vocab_size=50)
    compile_layers(model, backend="eager")
    stats = CompileStats()
    x = torch.randint(0, 50, (2, 8))
    eager = build("gpt-mini(connection=PreLN)", d_model=32, ffn_dim=64, heads=2, layers=4, context=8, vocab_size=50)
    torch.testing.assert_close(model(x), eager(x))
    report = stats.report()
    assert report["frames_compiled"] == 1 and report["graph_breaks"] == 0, report
