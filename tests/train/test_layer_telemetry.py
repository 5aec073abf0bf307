"""Per-layer telemetry (train lm --log-layers): the figures against a hand computation on a tiny model, training to
the bit with and without it on four designs, an exact resume of layers.jsonl, one-line refusals, the heatmaps, the
loggers' scalars, the sub-layers named before a spike, and one median a sub-layer."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from skiplab.analysis.layer_heatmap import plot_layers
from skiplab.analysis.report import pyplot
from skiplab.bench.steps import build
from skiplab.connections.base import _check_branch as check_branch, _check_input as check_input
from skiplab.models import GPT, GPTConfig
from skiplab.train import layer_telemetry, run as run_module, telemetry
from skiplab.train.layer_telemetry import QUANTITIES, LayerWatch, read_lines, spike_sources
from tests.train.test_distributed import one_thread
from tests.train.test_lm import args, run, text  # noqa: F401  (the fixture)
from tests.train.test_mt import interrupt_after_step

DESIGNS = ("PreLN", "PostLN", "HC(n=2)", "PreLN+AttnRes(block=2)", "PreDyT")
SUBS = ["0.attn", "0.mlp", "1.attn", "1.mlp"]


def tiny(design: str) -> str:
    return f"gpt-mini(d_model=32,heads=2,layers=2,ffn_dim=64,context=32,connection={design})"


def rms(t):
    return float(t.detach().double().pow(2).mean().sqrt())


def max_over_median(t):
    a = t.detach().double().abs().flatten()
    return float(a.max() / a.median())


def norm(ts):
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in ts))


def watched_update(model, x, y):
    """One update of ``model`` (AdamW, lr 1e-2) watched: its line and the watch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    watch = LayerWatch(model, every=1)
    with watch.watching():
        F.cross_entropy(model(x).transpose(1, 2), y).backward()
    watch.gradients()
    watch.snapshot()
    opt.step()
    return watch.update(1), watch


def test_the_figures_of_one_update_by_hand(monkeypatch):
    torch.manual_seed(0)
    original = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8))
    hand = copy.deepcopy(original)
    x = torch.randint(0, 20, (3, 8))
    y = torch.randint(0, 20, (3, 8))
    opt_hand = torch.optim.AdamW(hand.parameters(), lr=1e-2)
    line, watch = watched_update(copy.deepcopy(original), x, y)

    # by hand: the PreLN stack written out, x <- x + F(LN(x)) per sub-layer
    expect, h = {}, hand.embed(x)
    for i, layer in enumerate(hand.layers):
        for role, conn, branch in (("attn", layer.conn_attn, lambda u, l=layer: l.attn(u, causal=True)),
                                   ("mlp", layer.conn_mlp, lambda u, l=layer: l.mlp(u))):
            f = branch(conn.norm(h))
            out = h + f
            expect[f"{i}.{role}"] = {"stream_rms": rms(h), "branch_rms": rms(f), "branch_ratio": rms(f) / rms(h),
                                     "max_over_median": max_over_median(out)}
            h = out
    final_rms = rms(h)
    F.cross_entropy(hand.logits(hand.norm(h)).transpose(1, 2), y).backward()
    before = {n: p.detach().clone() for n, p in hand.named_parameters()}
    for i, layer in enumerate(hand.layers):
        for role, conn, branch in (("attn", layer.conn_attn, layer.attn), ("mlp", layer.conn_mlp, layer.mlp)):
            expect[f"{i}.{role}"]["grad_norm"] = norm([p.grad for p in [*branch.parameters(), *conn.parameters()]])
    opt_hand.step()
    params = dict(hand.named_parameters())
    for i in range(2):
        for role, names in (("attn", ("attn.", "conn_attn.")), ("mlp", ("mlp.", "conn_mlp."))):
            keys = [k for k in params if k.startswith(tuple(f"layers.{i}.{n}" for n in names))]
            expect[f"{i}.{role}"]["update_ratio"] = (norm([params[k] - before[k] for k in keys])
                                                     / norm([before[k] for k in keys]))

    check(line, expect, final_rms)
    with monkeypatch.context() as m:  # the check catches a wrong figure: the mean |x| taken for the RMS
        m.setattr(layer_telemetry, "_rms", lambda t: t.detach().float().abs().mean())
        with pytest.raises(AssertionError):
            check(watched_update(copy.deepcopy(original), x, y)[0], expect, final_rms)
    # the hooks are gone and the class's branch_input is back: nothing watches the next update
    # (a connection's own pre-hooks, its input and branch checks, stay as the model built them)
    assert all(not c._forward_hooks and list(c._forward_pre_hooks.values()) == [check_input, check_branch]
               and "branch_input" not in vars(c) for _, c, _, _ in watch.subs)


def check(line, expect, final_rms):
    for name in SUBS:
        assert set(line["layers"][name]) == set(QUANTITIES)
        for q, v in expect[name].items():
            assert line["layers"][name][q] == pytest.approx(v, rel=1e-4), (name, q)
    assert line["step"] == 1 and list(line["layers"]) == [*SUBS, "final_norm"]
    assert line["layers"]["final_norm"]["input_rms"] == pytest.approx(final_rms, rel=1e-4)


@pytest.mark.parametrize("design", DESIGNS)
def test_training_is_the_same_to_the_bit_with_and_without(text, tmp_path, design):  # noqa: F811
    plain, watched = tmp_path / "plain", tmp_path / "watched"
    with one_thread():
        assert run(args(text, plain, "--model", tiny(design))) == 0
        assert run(args(text, watched, "--model", tiny(design), "--log-layers", "2")) == 0
    a = torch.load(plain / "last.pt", weights_only=True)["model"]
    b = torch.load(watched / "last.pt", weights_only=True)["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key
    steps = [[(x["loss"], x["grad_norm"]) for x in map(json.loads, (d / "steps.jsonl").read_text().splitlines())]
             for d in (plain, watched)]
    assert steps[0] == steps[1]
    assert not (plain / "layers.jsonl").exists()
    lines = read_lines(watched)
    assert [x["step"] for x in lines] == [2, 4, 6]
    for x in lines:
        assert list(x["layers"]) == [*SUBS, "final_norm"]
        assert all(math.isfinite(v) and (v > 0 or q == "dyt_saturated") for name in SUBS
                   for q, v in x["layers"][name].items())
        assert ("dyt_saturated" in x["layers"]["0.attn"]) == (design == "PreDyT")
    summary = json.loads((watched / "summary.json").read_text())
    assert summary["spike_sources"] == [] and summary["config"]["log_layers"] == 2


@pytest.mark.parametrize("design", DESIGNS)
def test_the_largest_entries_are_taken_once_a_sub_layer(design, monkeypatch):
    """max |y| / median |y| (a median: a pass over the stream) is taken once a sub-layer, from the connection's
    output or, where a design across the stack runs the sub-layers (no output seen), from the next one's input;
    the line is the one the earlier rule made, which took every sub-layer's input as well."""
    model = build(tiny(design), vocab_size=20)
    x, y = torch.randint(0, 20, (2, 32)), torch.randint(0, 20, (2, 32))
    real, calls = layer_telemetry._max_over_median, []
    monkeypatch.setattr(layer_telemetry, "_max_over_median", lambda t: calls.append(1) or real(t))

    def every_input(self, name, x):  # the earlier rule
        self._keep(name, "x", lambda: layer_telemetry._rms(layer_telemetry._streams(x)))
        self._keep(name, "in", lambda: layer_telemetry._max_over_median(layer_telemetry._streams(x)))

    lines = []
    for rule in (None, every_input):
        if rule is not None:
            monkeypatch.setattr(LayerWatch, "_enter", rule)
        calls.clear()
        torch.manual_seed(1)
        lines.append(watched_update(copy.deepcopy(model), x, y)[0])
        if rule is None:
            assert len(calls) == len(SUBS), design
    assert len(calls) > len(SUBS)  # the check catches the earlier rule's extra medians
    assert lines[0] == lines[1]


def test_the_dyt_saturated_share_by_hand(monkeypatch):
    """PreDyT with every α at 100 (|α·x| > 2 where |x| > 0.02: a part of each input): the share per sub-layer's DyT
    and the final one's, against the inputs of the DyT layers taken by hand."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, d_model=16, heads=2, layers=2, ffn_dim=32, context=8, connection="PreDyT"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.fill_(100.0)
    hand = copy.deepcopy(model)
    x, y = torch.randint(0, 20, (3, 8)), torch.randint(0, 20, (3, 8))
    seen = {}
    owners = {f"{i}.{role}": getattr(layer, f"conn_{role}").norm for i, layer in enumerate(hand.layers)
              for role in ("attn", "mlp")}
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: seen.setdefault(n, a[0].detach().clone()))
             for n, m in {**owners, "final_norm": hand.norm}.items()]
    with torch.no_grad():
        hand(x)
    for h in hooks:
        h.remove()
    expect = {n: float(((100.0 * v).abs() > 2).double().mean()) for n, v in seen.items()}
    assert all(0 < v < 1 for v in expect.values())  # the threshold cuts inside every input
    got = watched_update(copy.deepcopy(model), x, y)[0]["layers"]
    for n, v in expect.items():
        assert got[n]["dyt_saturated"] == pytest.approx(v, abs=1e-7), n
    with monkeypatch.context() as m:  # the check catches a share taken of |x| without α
        m.setattr(layer_telemetry, "_saturated", lambda dyt, t: torch.stack(
            [(t.abs() > 2).sum().float(), torch.tensor(float(t.numel()))]))
        got = watched_update(copy.deepcopy(model), x, y)[0]["layers"]
        assert any(got[n]["dyt_saturated"] != pytest.approx(v, abs=1e-7) for n, v in expect.items())


def test_a_stopped_and_resumed_run_writes_the_same_layers(text, tmp_path, monkeypatch):  # noqa: F811
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    extra = ("--log-layers", "1", "--dropout", "0.1")
    with one_thread():
        assert run(args(text, straight, *extra)) == 0
        undo = interrupt_after_step(monkeypatch, 3)
        assert run(args(text, stopped, *extra)) == 130  # interrupted after step 3's checkpoint
        undo()
        with open(stopped / "layers.jsonl", "a") as f:  # what a killed run wrote past its checkpoint
            f.write(json.dumps({"step": 4, "layers": {}}) + "\n")
        assert run(["train", "lm", "--resume", "--out", stopped]) == 0
    assert (stopped / "layers.jsonl").read_text() == (straight / "layers.jsonl").read_text()
    assert [x["step"] for x in read_lines(stopped)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("extra, message", [
    (("--log-layers", "-1"), "skiplab train lm: error: argument --log-layers: must be >= 0, got -1"),
    (("--log-layers", "2", "--compile", "yes"),
     "skiplab: error: --log-layers watches the sub-layers with hooks, which --compile does not allow; give one"),
])
def test_bad_values_are_one_line_and_write_nothing(text, tmp_path, capsys, extra, message):  # noqa: F811
    out = tmp_path / "run"
    try:
        code = run(args(text, out, *extra))
    except SystemExit as stop:  # argparse's own check of the bound
        code = stop.code
    assert code == 2
    assert capsys.readouterr().err.strip() == message
    assert not out.exists()


def test_heatmaps_of_a_run(text, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out, "--log-layers", "1")) == 0
    figure = tmp_path / "layers.png"
    assert run(["curves", "--layers", out, "--out", figure]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run(["curves", "--layers", out, "--out", tmp_path / "two.png", "--keys", "grad_norm,stream_rms"]) == 0
    capsys.readouterr()
    assert run(["curves", "--layers", out, "--out", tmp_path / "bad.png", "--keys", "nope"]) == 2
    assert capsys.readouterr().err.strip() == (f"skiplab: error: --keys: {out} has no per-layer 'nope'; it has: "
                                               f"{', '.join(QUANTITIES)}")
    plain = tmp_path / "plain"
    with one_thread():
        assert run(args(text, plain)) == 0
    assert run(["curves", "--layers", plain, "--out", tmp_path / "none.png"]) == 2
    assert capsys.readouterr().err.strip().endswith("has no per-layer lines (layers.jsonl); `train lm --log-layers "
                                                    "N` writes them (the language models' telemetry)")
    assert not (tmp_path / "bad.png").exists() and not (tmp_path / "none.png").exists()
    dyt = tmp_path / "dyt"  # a share on a linear scale, and the final DyT's beside the final norm's input
    with one_thread():
        assert run(args(text, dyt, "--log-layers", "2", "--model", tiny("PreDyT"))) == 0
    assert run(["curves", "--layers", dyt, "--out", tmp_path / "dyt.png", "--keys", "dyt_saturated,stream_rms"]) == 0
    assert (tmp_path / "dyt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakeLoggers:
    def __init__(self):
        self.lines, self.values = [], {}

    def log(self, line):
        self.lines.append(line)

    def scalars(self, values, step):
        self.values[step] = values

    def close(self):
        pass


def test_the_loggers_get_every_figure(text, tmp_path, monkeypatch):  # noqa: F811
    fake = FakeLoggers()
    monkeypatch.setattr(run_module, "open_loggers", lambda *a, **k: fake)
    out = tmp_path / "run"
    with one_thread():
        assert run(args(text, out, "--log-layers", "3", "--logger", "tensorboard")) == 0
    lines = read_lines(out)
    assert sorted(fake.values) == [x["step"] for x in lines] == [3, 6]
    for x in lines:
        expect = {f"layers/{n}/{q}": v for n, qs in x["layers"].items() for q, v in qs.items()}
        assert fake.values[x["step"]] == expect
    assert "layers/1.mlp/update_ratio" in fake.values[3] and "layers/final_norm/input_rms" in fake.values[3]


def line(step, **grads):
    return {"step": step, "layers": {n: {"grad_norm": g} for n, g in grads.items()}}


def test_the_sub_layers_whose_gradients_rose_first_are_named():
    lines = [line(10, a=1.0, b=1.0, c=1.0), line(20, a=1.0, b=1.2, c=1.0), line(30, a=1.1, b=2.0, c=3.0),
             line(40, a=5.0, b=5.0, c=5.0), line(50, a=9.0, b=9.0, c=9.0), line(60, a=1.0, b=1.0, c=1.0)]
    # the spike at 55 looks at 20, 30, 40, 50: b and c rose by 30 (c the more), a only by 40
    report = spike_sources(lines, [55, 12])
    assert report[0] == {"step": 55, "first_rose": ["c", "b"], "at": 30, "watched": [20, 30, 40, 50]}
    assert report[1] == {"step": 12, "first_rose": [], "at": None, "watched": [10]}  # too few updates before it
    assert spike_sources(lines[:2], [25]) == [{"step": 25, "first_rose": [], "at": None, "watched": [10, 20]}]


def test_the_spikes_of_a_run_are_named_in_its_summary_and_survive_a_resume(text, tmp_path, monkeypatch):  # noqa: F811
    """A spike rule that flags every update after the second (a window of 2, a factor of 0): the summary holds one
    entry a spike, each what :func:`spike_sources` makes of layers.jsonl, the same after a stop at step 3."""
    monkeypatch.setattr(telemetry, "WINDOW", 2)
    monkeypatch.setattr(telemetry, "FACTOR", 0.0)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    with one_thread():
        assert run(args(text, straight, "--log-layers", "1")) == 0
        undo = interrupt_after_step(monkeypatch, 3)
        assert run(args(text, stopped, "--log-layers", "1")) == 130
        undo()
        assert run(["train", "lm", "--resume", "--out", stopped]) == 0
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["loss_spikes"] == 4
    assert summary["spike_sources"] == spike_sources(read_lines(straight), [3, 4, 5, 6])
    assert [s["watched"] for s in summary["spike_sources"]] == [[1, 2], [1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5]]
    assert json.loads((stopped / "summary.json").read_text())["spike_sources"] == summary["spike_sources"]


def test_a_heatmaps_columns_sit_at_their_updates_when_unevenly_spaced(tmp_path, monkeypatch):
    """Updates 1-4 watched every update, then every 4th (a run resumed with another --log-layers): each column is
    drawn around its own update (the columns were spread evenly from 1 to 12, update 2 drawn at 3.2)."""
    plt = pyplot()
    steps = [1, 2, 3, 4, 8, 12]
    (tmp_path / "layers.jsonl").write_text("".join(
        json.dumps({"step": s, "layers": {"0.attn": {"grad_norm": s}, "0.ffn": {"grad_norm": 2 * s},
                                          "final_norm": {"input_rms": 1.0}}}) + "\n" for s in steps))
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    plot_layers(tmp_path, tmp_path / "a.png", keys=("grad_norm", "grad_norm"))
    fig = drawn[-1]
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title() == "grad_norm"]
    assert len(panels) == 1  # a key given twice: one panel
    edges = panels[0].collections[0].get_coordinates()[0, :, 0]
    assert edges.tolist() == [0.5, 1.5, 2.5, 3.5, 6.0, 10.0, 14.0]
    assert all(a < s < b for a, s, b in zip(edges, steps, edges[1:]))
    with pytest.raises(FileNotFoundError, match="nowhere: no such run directory"):
        plot_layers(tmp_path / "nowhere", tmp_path / "b.png")
