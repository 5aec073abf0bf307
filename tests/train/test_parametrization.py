"""``train lm --parametrization``: the optimizer's groups of width μP against the ``mup`` package's ``MuAdamW``, and of
CompleteP against the equations of EleutherAI/nanoGPT-mup branch ``completep``, ``model.py``,
``GPT.configure_optimizers`` (and ``Block.residual_scaling``), written out below by hand; each comparison proven by
a mutation that makes it fail; bad values one line and exit 2 with nothing written; a tiny run records it."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from skiplab import run_dir
from skiplab.cli import main
from skiplab.models import GPT, build_model
from skiplab.train import parametrization as P
from skiplab.train.lm import LMTrainConfig, load_run
from tests.train.test_lm import args, text  # noqa: F401  (the tiny corpus fixture)

LR, WD, EPS = 3e-3, 0.1, 1e-8


def trained_groups(cfg: LMTrainConfig) -> tuple[GPT, dict[int, tuple[float, float, float]]]:
    """The model ``cfg`` trains and, per parameter, the (lr, weight decay, ε) its AdamW gives it."""
    mcfg = cfg.model_config(64)
    torch.manual_seed(0)
    model = build_model(mcfg)
    opt = torch.optim.AdamW(P.parameter_groups(model, WD, P.resolve(mcfg, cfg.parametrization), EPS), lr=LR, eps=EPS)
    P.set_lr(opt, LR)
    return model, {id(p): (g["lr"], g["weight_decay"], g["eps"]) for g in opt.param_groups for p in g["params"]}


def completep_by_hand(name: str, m_d: float, m_L: float, alpha: float) -> tuple[float, float, float]:
    """nanoGPT-mup ``completep`` ``configure_optimizers`` (depth_alpha_enabled), its parameter names in skiplab's:
    depth_lr_scaling = m_L^(α−1); width_lr_scaling = 1/m_d; adam_eps *= (1/m_d) · m_L^(−α);
    emb_params (wte, wpe): lr_scale 1, weight_decay; hidden_ln_params (.ln_ but not ln_f): depth_lr_scaling, 0;
    hidden_weight_params (c_attn, c_fc, c_proj weights): width_lr_scaling · depth_lr_scaling, weight_decay /
    width_lr_scaling; hidden_bias_params: depth_lr_scaling, 0; final_ln_params (ln_f): 1, 0."""
    depth_lr, width_lr = m_L ** (alpha - 1), 1 / m_d
    eps = EPS * (1 / m_d) * m_L ** (-alpha)
    if name in ("embed.weight", "pos_embed.weight"):
        return LR, WD, eps
    if name.startswith("layers.") and ".conn_" in name:  # ln_1, ln_2
        return LR * depth_lr, 0.0, eps
    if name.startswith("layers.") and name.endswith(".weight"):  # c_attn, c_fc, c_proj
        return LR * width_lr * depth_lr, WD / width_lr, eps
    if name.startswith("layers.") and name.endswith(".bias"):
        return LR * depth_lr, 0.0, eps
    assert name.startswith("norm."), name  # ln_f
    return LR, 0.0, eps


def completep_matches(cfg: LMTrainConfig, m_d: float, m_L: float, alpha: float) -> bool:
    model, got = trained_groups(cfg)
    residual_scaling = 1 / m_L ** alpha  # Block.residual_scaling = 1/(depth_multiplier ** depth_alpha_exp)
    ok = all(c.multiplier == pytest.approx(residual_scaling) for layer in model.layers
             for c in (layer.conn_attn, layer.conn_mlp))
    for name, p in model.named_parameters():
        ok &= got[id(p)] == pytest.approx(completep_by_hand(name, m_d, m_L, alpha), rel=1e-12)
    return bool(ok)


MODEL = "gpt-mini(d_model=64,heads=4,layers=8,ffn_dim=256,context=16,positions=learned,tie=true)"


@pytest.mark.parametrize("model, alpha", [(MODEL, 1.0), (MODEL.replace("learned", "learned,connection=PreLN(depth_alpha=0.5)"), 0.5)])
def test_completep_groups_match_nanogpt_mups_equations(model, alpha, monkeypatch):
    cfg = LMTrainConfig(model=model.replace("tie=true", "tie=true,mup_base_width=16"), parametrization="completep",
                        depth_base=2)
    assert cfg.model_config(64).connection == f"PreLN(depth_alpha={alpha:g},depth_base=2)"
    assert completep_matches(cfg, m_d=4.0, m_L=4.0, alpha=alpha)
    resolve = P.resolve
    monkeypatch.setattr(P, "resolve", lambda mcfg, kind: dataclasses.replace(resolve(mcfg, kind), depth_alpha=0.0))
    assert not completep_matches(cfg, m_d=4.0, m_L=4.0, alpha=alpha)  # mutation: no depth correction


def mup_adamw_groups(model: GPT, base: GPT) -> dict[int, tuple[float, float]]:
    """Per parameter, (lr, weight decay) of ``mup.MuAdamW`` over the standard groups, base shapes from ``base``."""
    mup = pytest.importorskip("mup")
    # an untied output layer is a plain Linear here, not a MuReadout: its infshape (vocabulary finite, width infinite)
    # is what MuAdamW groups it by; the type check that asks for MuReadout is off
    mup.set_base_shapes(model, base, rescale_params=False, do_assert=False)
    opt = mup.MuAdamW(P.parameter_groups(model, WD), lr=LR)
    return {id(p): (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}


def mup_matches(cfg: LMTrainConfig, base_model: str) -> bool:
    model, got = trained_groups(cfg)
    base = build_model(LMTrainConfig(model=base_model).model_config(64))
    want = mup_adamw_groups(model, base)
    return all(got[id(p)][:2] == pytest.approx(want[id(p)], rel=1e-12) and got[id(p)][2] == EPS
               for p in model.parameters())


@pytest.mark.parametrize("tie", ["true", "false"])
def test_mup_groups_match_mup_packages_muadamw(tie, monkeypatch):
    wide = f"gpt-mini(d_model=128,heads=4,layers=2,ffn_dim=512,context=16,tie={tie})"
    narrow = f"gpt-mini(d_model=32,heads=4,layers=2,ffn_dim=128,context=16,tie={tie})"
    cfg = LMTrainConfig(model=wide.replace("tie=", "mup_base_width=32,tie="), parametrization="mup")
    assert mup_matches(cfg, narrow)
    monkeypatch.setattr(P, "resolve", lambda mcfg, kind: P.Parametrization("mup", 2.0))  # mutation: a wrong m_d
    assert not mup_matches(cfg, narrow)


def test_standard_keeps_the_two_groups_of_every_earlier_run():
    cfg = LMTrainConfig(model=MODEL)
    assert (cfg.parametrization, cfg.depth_base) == ("standard", 0)
    model, got = trained_groups(cfg)
    assert model.cfg.mup_base_width == 0 and model.cfg.connection == "PreLN"
    for p in model.parameters():
        assert got[id(p)] == (LR, WD if p.dim() >= 2 else 0.0, EPS)


@pytest.mark.parametrize("extra, problem", [
    (["--parametrization", "mu-p"], "unknown --parametrization 'mu-p'"),
    (["--parametrization", "completep", "--model", "gpt-mini(connection=PostLN)"], "scales pre-norm branches"),
    (["--parametrization", "completep", "--model", "gpt-mini(connection=PreLN(depth_base=3))", "--depth-base", "2"],
     "give it once"),
    (["--parametrization", "mup", "--mup-base-width", "-4"], "mup_base_width must be >= 0"),
    (["--mup-base-width", "16"], "give --parametrization mup or completep"),
    (["--parametrization", "completep", "--depth-base", "-1"], "depth"),
    (["--parametrization", "mup", "--depth-base", "4"], "--depth-base is CompleteP's base depth"),
    # α = 0 written: it was taken as unwritten and made 1 (every branch × m_L^(-1)), silently
    (["--parametrization", "completep", "--connection", "PreLN(depth_alpha=0)"],
     "writes depth_alpha=0, no depth scaling: give --parametrization mup for that"),
])
def test_bad_values_are_one_line_exit_2_nothing_written(text, tmp_path, capsys, extra, problem):  # noqa: F811
    out = tmp_path / "run"
    argv = args(text, out, *extra)
    if "--model" in extra:  # the later --model wins: drop the tiny one
        i = argv.index("--model")
        del argv[i:i + 2]
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # argparse's own refusal of a bound (--depth-base -1)
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_tiny_completep_run_records_its_parametrization(text, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    argv = args(text, out, "--parametrization", "completep", "--mup-base-width", "16", "--depth-base", "1",
                "--max-steps", "3", "--eval-every", "3")
    assert main([str(a) for a in argv]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["parametrization"] == "completep" and config["config"]["depth_base"] == 1
    # depth_base=1 is the option's default, left out of the canonical spec
    assert config["model"]["connection"] == "PreLN(depth_alpha=1)" and config["model"]["mup_base_width"] == 16
    noted = config["parametrization"]  # TINY: d 32, 2 layers: m_d = 2, m_L = 2
    assert (noted["width_multiplier"], noted["depth_multiplier"], noted["depth_alpha"]) == (2.0, 2.0, 1.0)
    assert noted["groups"]["hidden_matrices"] == {"lr_scale": 0.5, "weight_decay": 0.2, "eps": 1e-8 / 4,
                                                  "tensors": noted["groups"]["hidden_matrices"]["tensors"]}
    ckpt = run_dir.load_checkpoint(out / "last.pt", kind="lm")
    lrs = {g["name"]: g["lr"] for g in ckpt["optimizer"]["param_groups"]}
    assert lrs["hidden_matrices"] == pytest.approx(0.5 * lrs["embeddings"])  # the schedule's lr times the scale
    _, model, _ = load_run(out)  # the checkpoint rebuilds the μP, depth-scaled model
    assert model.width_multiplier == 2.0 and model.layers[0].conn_attn.multiplier == 0.5
    assert Path(out / "summary.json").is_file()


def test_a_run_written_before_the_parametrization_existed_is_the_same_run(tmp_path):
    """Its config.json lacks the fields added since (parametrization, depth_base): they count as every earlier run's
    values (``older_runs``), so comparisons and sweeps pick the run up rather than refusing it."""
    import dataclasses

    from skiplab import run_dir
    from skiplab.tasks import check_same_run
    from skiplab.train.lm import LMTrainConfig

    cfg = LMTrainConfig(corpus="", train_file="t.jsonl", valid_file="v.jsonl", out=str(tmp_path / "run"))
    old = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("parametrization", "depth_base", "log_layers")}
    (tmp_path / "run").mkdir()
    run_dir.write_json(tmp_path / "run" / "config.json", {"config": old})
    check_same_run(cfg)
    with pytest.raises(run_dir.RunDirError, match=r"other settings \(parametrization\)"):
        check_same_run(dataclasses.replace(cfg, parametrization="mup"))
