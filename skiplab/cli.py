"""The ``skiplab`` command line.

    skiplab connections [SPEC]           every design with its formula and source
    skiplab train image [...]            train a PreAct-ResNet with any connection (the CIFAR recipe)
    skiplab eval image --checkpoint RUN  test error of a trained run
    skiplab compare image [...]          connections x seeds, then a Table-1-style table and curves
    skiplab train mt [...]               train a translation model (any family, any connection; Transformer recipe)
    skiplab translate --checkpoint RUN   translate stdin to stdout (beam search, optional averaging)
    skiplab eval mt --checkpoint RUN     BLEU and chrF (sacrebleu) of a split, with signatures
    skiplab average --checkpoint RUN     average the last N checkpoints into one file
    skiplab bootstrap REF A B            paired bootstrap resampling between two systems' outputs
    skiplab compare mt [...]             models x connections x seeds, then a BLEU table
    skiplab train lm [...]               train a decoder-only language model (any connection)
    skiplab eval lm --checkpoint RUN     bits per byte, token and word perplexity of a split
    skiplab generate --checkpoint RUN    continue a prompt (key/value cache, temperature, top-k, top-p)
    skiplab compare lm [...]             models x connections x seeds, then a bits-per-byte table
    skiplab train caption [...]          train a Transformer captioner (any connection on either stack)
    skiplab eval caption --checkpoint RUN  BLEU-1..4, METEOR, ROUGE-L, CIDEr of a split; --figure draws captions
    skiplab compare caption [...]        connections x seeds, then a CIDEr table
    skiplab prepare lm --out DIR [...]   tokenise an LM corpus once into shards (train lm --data-dir DIR)
    skiplab corpus debdocs --out DIR     build the debdocs corpus from the installed Debian documentation
    skiplab import hf DIR --out RUN      a Hugging Face GPT-2 or LLaMA folder as a language-model run
    skiplab export hf RUN --out DIR      a PreLN or PreRMS language-model run as a Hugging Face folder
    skiplab curves RUN [RUN ...]         learning curves of runs in one figure (--layers RUN: per-layer heatmaps)
    skiplab analyze NAME RUN [...]       gradients, gates, ratios, activations of trained runs
    skiplab analyze coord-check CASE ... activation and update sizes across width and depth, per parametrisation
    skiplab analyze lr-depth SWEEP ...  the best lr per depth per design (interval, slope across depth)
    skiplab bench [--quick]              what the designs and the engine cost here, as side-by-side ratios
    skiplab reproduce TABLE --scale S    a table of the papers at smoke, cpu or paper scale, paper numbers beside ours
    skiplab sweep lm --connections ... --depths ...   designs x depths x lrs x seeds, a table and figures by depth
    skiplab demo                         the main job: a small comparison on Fashion-MNIST
    skiplab demo caption                 PostLN against SAS captioning fashion-mnist-scenes
    skiplab demo gradient-flow [...]     the tutorial's gradient-flow demo (table + plot)

Every training option is a field of a typed config (``ImageTrainConfig``, ``MTTrainConfig``) and every
model option of MT a field of a family's config (``TransformerConfig``, ``DepthWiseLSTMConfig``); the
options here are derived from them. Model options given on the command line add to the model spec
(``--model dwlstm-small --share all`` is ``dwlstm-small(share=all)``); one the family lacks is an error.
The resolved config is saved beside every result.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

from . import bench, config, distributed, host, reproduce, run_dir, tasks
from .analysis import gradient_flow
from .analysis import options as analysis_options
from .analysis.analyze import analyze
from .analysis.curves import plot_runs
from .analysis.layer_heatmap import plot_layers
from .connections import available_connections, connection, parse_spec
from .models import family_of, options_of
from .reproduce import lr_depth
from .reproduce.sweep import sweep
from .tasks import hf_run
from .tasks import arguments, budget, coord_check
from .tasks.compare import compare
from .tasks.lm import add_generate_arguments, sample_text
from .tasks.mt import add_decoding_arguments
from .corpora import decode_lines, read_lines
from .corpora.debdocs import DebdocsConfig, build
from .corpora.prepare import PrepareConfig, prepare
from .translate import paired_bootstrap
from .translate.translator import Translator

# The main job: sized to about five minutes on 2 CPU cores.
DEMO = dict(model="preact-resnet20", dataset="fashion-mnist", epochs=6, train_subset=2000, test_subset=2000,
            out="runs/demo")
DEMO_CONNECTIONS, DEMO_SEEDS = ("1xSkip", "2xSkip", "2xSkip+LN", "2rSkip+LN"), 2
# Captioning on fashion-mnist-scenes: PostLN against SAS, one seed, about five minutes on 2 CPU cores.
CAPTION_DEMO = dict(model="captioner-small", train_scenes=3000, valid_scenes=200, test_scenes=200, max_steps=400,
                    warmup=100, lr=1e-3, save_every=100, max_caption_len=30, out="runs/demo-caption")


def cmd_corpus(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    m = build(config.from_arguments(DebdocsConfig, args))
    print(f"{args.out}: " + ", ".join(f"{s} {v['documents']:,} documents, {v['bytes']:,} bytes"
                                      for s, v in m["splits"].items())
          + f"; build_sha256 {m['build_sha256']} ({time.perf_counter() - t0:.0f} s)")


def cmd_connections(args: argparse.Namespace) -> None:
    if args.spec is not None:  # what one spec builds (a bad one, an empty one too: one line, nothing else)
        conn = connection(args.spec, args.dim)
        print(f"{args.spec} -> {conn.spec}: {parse_spec(args.spec)}\n{conn}")
        return
    table = available_connections()
    width = max(map(len, table))
    print("Spec grammar: [number]name[+NORM][(key=value, ...)]   NORM: LN | BN | RMS | DyT   (case-sensitive)\n")
    for spec, formula in table.items():
        print(f"  {spec.ljust(width)}  {formula}")


def cmd_gradient_flow(args: argparse.Namespace) -> None:
    gradient_flow.run(config.from_arguments(gradient_flow.GradientFlowConfig, args), overwrite=args.overwrite)


def _print_summary(summary: dict) -> None:
    if distributed.rank() == 0:  # under torchrun every rank holds the summary; one prints it
        print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))


def cmd_train(args: argparse.Namespace) -> None:
    task = tasks.get(args.task)
    task.before_train(args)
    _print_summary(task.train(arguments.train_config(task.config, args), resume=args.resume, overwrite=args.overwrite))


def cmd_eval(args: argparse.Namespace) -> None:
    """The task's scores of a checkpoint, with the machine and code version that computed them."""
    print(json.dumps({**tasks.get(args.task).evaluate(args), "environment": host.environment()}, indent=2))


def cmd_translate(args: argparse.Namespace) -> None:
    tr = Translator.load(args.checkpoint, args.average, args.device)
    lines = decode_lines(sys.stdin.buffer.read(), "standard input")
    for line in tr.translate(lines, beam=args.beam, alpha=args.alpha, max_tokens=args.max_tokens, progress=True):
        print(line)


def cmd_generate(args: argparse.Namespace) -> None:
    print(args.prompt + sample_text(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                                    args.top_p, args.seed, args.average))


def cmd_average(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if out.is_dir():
        raise run_dir.RunDirError(f"{out} is a folder; --out names the averaged checkpoint's file")
    run = Path(args.checkpoint)
    if out.parent.resolve() == run.resolve() and (out.name in ("last.pt", "best.pt")
                                                   or run_dir.is_step_checkpoint(out)):
        raise run_dir.RunDirError(f"{out} is the run's own checkpoint's name (resumed from, or averaged as a step); "
                                  f"give the average another, e.g. {run / f'avg{args.last}.pt'}")
    if out.exists() and not args.overwrite:
        raise run_dir.RunDirError(f"{out} exists; use --overwrite to replace it")
    state, files = run_dir.average_checkpoints(args.checkpoint, args.last, kind=None)  # the run's own task
    out.parent.mkdir(parents=True, exist_ok=True)
    run_dir.save_checkpoint(out, state)
    print(f"averaged {', '.join(f.name for f in files)} into {out}")


def cmd_import_hf(args: argparse.Namespace) -> None:
    options = config.absolute({f.name: getattr(args, f.name) for f in dataclasses.fields(tasks.get("lm").config)
                               if f.name not in hf_run.FROM_FOLDER})  # as train lm records them: from any folder
    print(f"wrote {hf_run.import_hf(args.source, args.out, args.overwrite, **options)}")


def cmd_export_hf(args: argparse.Namespace) -> None:
    print(f"wrote {hf_run.export_hf(args.run, args.out, args.average, args.overwrite)}")


def cmd_bootstrap(args: argparse.Namespace) -> None:
    refs, a, b = (read_lines(p) for p in (args.ref, args.a, args.b))
    result = paired_bootstrap(refs, a, b, args.samples, args.seed, args.metric)
    print(json.dumps({**result, "seed": args.seed, "samples": args.samples}, indent=2))


def cmd_curves(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the figure's file, e.g. {out / 'curves.png'}")
    if not out.suffix:  # the file matplotlib writes: its default format's suffix added
        out = out.with_name(out.name + ".png")
    if out.exists() and not args.overwrite:
        raise run_dir.RunDirError(f"{out} exists; use --overwrite to replace it")
    if args.layers:  # one run's layers.jsonl as heatmaps
        if len(args.runs) != 1 or args.labels:
            raise ValueError("curves --layers draws one run; give one RUN and no --labels")
        print(f"wrote {plot_layers(args.runs[0], out, args.keys, args.title)}")
        return
    print(f"wrote {plot_runs(args.runs, out, args.keys, args.labels, args.title)}")


def cmd_analyze(args: argparse.Namespace) -> None:
    trained = [tasks.load_trained(r) for r in [args.run, *args.compare]]
    analyze(args.analysis, trained, overwrite=args.overwrite, **analysis_options.given(args))


def cmd_compare(args: argparse.Namespace) -> None:
    task = tasks.get(args.task)
    base = config.from_arguments(task.config, args)
    if args.models and "model" in config.given(args, task.config):
        raise ValueError(f"--model {base.model} and --models {','.join(args.models)} both name the models compared: "
                         "list every model in --models")
    base = dataclasses.replace(base, model=arguments.with_model_options(base.model, args))
    if args.connections is not None:
        connections = args.connections
    else:  # the default connections, for a single model that takes connections
        takes = "connection" in options_of(family_of(base.model))
        connections = () if args.models or not takes else args.default_connections
    variants = task.variants(base.model, args.models, connections, arguments.given_model_options(args))
    compare(task.name, base, variants, args.seeds, jobs=args.jobs,
            budget=args.budget, mixed_blocks=args.mixed_blocks, baseline_updates=args.baseline_updates,
            overwrite=args.overwrite)


def _add_compare(sub, task: str, help: str, defaults: dict, connections: tuple[str, ...], seeds: int):
    p = sub.add_parser(task, help=help.replace("%", "%%"), description=help)  # help is %-formatted: "error %"
    config.add_arguments(p, tasks.get(task).config, skip=("seed",), defaults=defaults)
    arguments.add_model_options(p, task, skip=("connection",))
    p.add_argument("--models", type=config.parse_list, default=(), metavar="SPECS",
                   help="model specs to compare, comma-separated, e.g. transformer-small,dwlstm-small(share=all) "
                        "(default: --model alone)")
    p.add_argument("--connections", type=config.parse_list, default=None, metavar="SPECS",
                   help=f"connection specs to compare, comma-separated (default: {','.join(connections)} without "
                        "--models; with --models, each model's own)")
    p.add_argument("--seeds", type=config.seed_list, default=seeds,
                   help=f"seeds 1..N per variant, or A-B (seeds A..B) or A,B,...; seed k of every variant is block "
                        f"k (default: {seeds})")
    p.add_argument("--jobs", type=config.count(1), default=1,
                   help="runs of a block trained side by side, each with cores/N threads (default: 1)")
    p.add_argument("--budget", choices=budget.BUDGETS, default="updates",
                   help="what every variant gets alike: updates (--max-steps each, or --epochs where a task counts "
                        "epochs), flops (the first variant's "
                        "training FLOPs, counted) or time (its wall-clock here, step times measured in turns); "
                        "default: updates")
    p.add_argument("--baseline-updates", type=config.parse_float_list, default=(), metavar="FACTORS",
                   help="also train the baseline (the first variant) at these multiples of --max-steps in every block, "
                        "e.g. 1.25,1.5, and read each design's effective compute off them (effective.md); tasks that "
                        "count updates (not image's epochs)")
    p.add_argument("--mixed-blocks", action="store_true",
                   help="train into a block begun on another machine (its rows then lack a same-machine baseline, "
                        "which the table names); refused by default")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the table in --out where it holds designs or seeds this comparison lacks (the runs "
                        "stay); refused by default")
    p.set_defaults(func=cmd_compare, task=task, seed=1, default_connections=connections, **defaults)
    return p


def cmd_sweep(args: argparse.Namespace) -> None:
    task = tasks.get(args.task)
    base = config.from_arguments(task.config, args)
    base = dataclasses.replace(base, model=arguments.with_model_options(base.model, args))
    sweep(task.name, base, args.connections, args.depths, args.lrs, seeds=args.seeds, jobs=args.jobs,
          argv=args.argv[1:], runs_dir=args.runs, overwrite=args.overwrite)


def _add_sweep(sub, task: tasks.Task):
    """``skiplab sweep <task>``: the task's training options (but the seed and the lr, which are axes), its model
    options (but the connection and the depth, likewise), and the axes."""
    help = (f"{task.help}: every design x depth x lr x seed one run, then a table of {task.metric_label} and "
            "figures against depth")
    lr = next(f.default for f in dataclasses.fields(task.config) if f.name == "lr")
    p = sub.add_parser(task.name, help=help.replace("%", "%%"), description=help)  # help is %-formatted
    config.add_arguments(p, task.config, skip=("seed", "lr"))
    arguments.add_model_options(p, task.name, skip=("connection", *task.depth_options))
    p.add_argument("--connections", type=config.parse_list, required=True, metavar="SPECS",
                   help="connection specs to sweep, comma-separated, e.g. PreLN,PostLN,DeepNorm")
    p.add_argument("--depths", type=config.parse_list, required=True, metavar="DEPTHS",
                   help=f"depths, comma-separated, e.g. 4,8,16,32 (the model's {' and '.join(task.depth_options)})")
    p.add_argument("--lrs", type=config.parse_list, default=(), metavar="LRS",
                   help=f"peak learning rates, comma-separated, e.g. 1e-3,3e-3,1e-2 (default: the config's lr alone, "
                        f"{lr:g})")
    p.add_argument("--seeds", type=config.count(1), default=task.compare_seeds,
                   help=f"seeds 1..N per design x depth x lr (default: {task.compare_seeds})")
    p.add_argument("--jobs", type=config.count(1), default=1,
                   help="runs trained side by side, each with cores/jobs threads (default: 1)")
    p.add_argument("--runs", default="", metavar="DIR",
                   help="where the runs live (default: OUT/runs); sweeps given one DIR share the runs they both need")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the table in --out where it holds designs, depths, lrs or seeds this sweep lacks "
                        "(the runs stay); refused by default")
    p.set_defaults(func=cmd_sweep, task=task.name, seed=1, lr=lr, out=f"runs/sweep-{task.name}")
    return p


class Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors on one line (``skiplab train image: error: argument --epochs: ...``)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="skiplab", description="Skip connections with normalisation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("connections", help="list every design with its formula")
    p.add_argument("spec", nargs="?", help="parse this spec and show the module it builds (instead of the list)")
    p.add_argument("--dim", type=config.count(1), default=8, help="feature count for the module shown (default: 8)")
    p.set_defaults(func=cmd_connections)

    train = sub.add_parser("train", help="train a model").add_subparsers(dest="task", required=True, metavar="TASK")
    ev = sub.add_parser("eval", help="evaluate a trained run").add_subparsers(dest="task", required=True, metavar="TASK")
    for task in tasks.TASKS.values():
        p = train.add_parser(task.name, help=task.help, description=task.help)
        config.add_arguments(p, task.config)
        arguments.add_model_options(p, task.name)
        p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
        p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
        task.add_train_arguments(p)
        p.set_defaults(func=cmd_train)
        doc = (task.evaluate.__doc__ or "").strip().split("\n")[0] or f"evaluate a {task.name} run"
        p = ev.add_parser(task.name, help=doc, description=doc)
        task.add_eval_arguments(p)
        p.set_defaults(func=cmd_eval)

    # `skiplab prepare lm`: tokenise once into shards
    prep = sub.add_parser("prepare", help="tokenise a corpus once into shards").add_subparsers(
        dest="task", required=True, metavar="TASK")
    p = prep.add_parser("lm", help="a language-model corpus into token shards per split and a sidecar",
                        description="a language-model corpus into token shards per split and a sidecar")
    config.add_arguments(p, PrepareConfig)
    p.set_defaults(func=lambda a: print(f"{a.out}: " + ", ".join(
        f"{s} {v['tokens']:,} tokens in {len(v['shards'])} shard(s)"
        for s, v in prepare(config.from_arguments(PrepareConfig, a)).get("splits", {}).items())))

    # `skiplab corpus debdocs`: a corpus from the installed docs
    corp = sub.add_parser("corpus", help="build a corpus from what is installed here").add_subparsers(
        dest="corpus", required=True, metavar="CORPUS")
    p = corp.add_parser("debdocs", help="English technical prose from Debian's documentation packages",
                        description="English technical prose from Debian's documentation packages: train, valid "
                                    "and test JSON Lines and a manifest (docs/language-models.md)")
    config.add_arguments(p, DebdocsConfig)
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("translate", help="translate stdin to stdout with a trained run")
    add_decoding_arguments(p)
    p.add_argument("--max-tokens", type=config.count(1), default=4096, help="source tokens per batch (default: 4096)")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("generate", help="continue a prompt with a trained language model")
    add_generate_arguments(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("average", help="average the last N checkpoints of a run into one file")
    p.add_argument("--checkpoint", required=True, help="the run directory")
    p.add_argument("--last", type=config.count(1), default=5, help="how many of the latest step checkpoints (default: 5)")
    p.add_argument("--out", required=True, help="the averaged checkpoint file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_average)

    imp = sub.add_parser("import", help="bring an outside model in as a run directory")
    p = imp.add_subparsers(dest="format", required=True, metavar="FORMAT").add_parser(
        "hf", help="a GPT2LMHeadModel or LlamaForCausalLM folder (save_pretrained's) as a language-model run",
        description="a GPT2LMHeadModel or LlamaForCausalLM folder (save_pretrained's) as a language-model run")
    p.add_argument("source", metavar="DIR", help="the Hugging Face folder: config.json, model.safetensors (or shards)")
    p.add_argument("--out", required=True, help="the run directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    config.add_arguments(p, tasks.get("lm").config, skip=hf_run.FROM_FOLDER)
    p.set_defaults(func=cmd_import_hf)

    exp = sub.add_parser("export", help="write a run in an outside format")
    p = exp.add_subparsers(dest="format", required=True, metavar="FORMAT").add_parser(
        "hf", help="a PreLN or PreRMS language-model run as a GPT2LMHeadModel or LlamaForCausalLM folder",
        description="a PreLN or PreRMS language-model run as a GPT2LMHeadModel or LlamaForCausalLM folder")
    p.add_argument("run", metavar="RUN", help="a run directory (its last.pt) or a .pt file")
    p.add_argument("--out", required=True, help="the folder to write (from_pretrained loads it)")
    p.add_argument("--average", type=config.count(0), default=0,
                   help="average the run's last N step checkpoints (default: 0, off)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it holds a run or a model folder")
    p.set_defaults(func=cmd_export_hf)

    p = sub.add_parser("bootstrap", help="paired bootstrap resampling (Koehn 2004) of two systems' outputs")
    p.add_argument("ref", help="reference translations, one a line")
    p.add_argument("a", help="system A's translations")
    p.add_argument("b", help="system B's translations")
    p.add_argument("--samples", type=config.count(1), default=1000, help="resamples (default: 1000)")
    p.add_argument("--seed", type=config.seed_value, default=12345, help="seed (default: 12345)")
    p.add_argument("--metric", default="bleu", choices=("bleu", "bleu_tok", "chrf"),
                   help="bleu (sacrebleu 13a), bleu_tok (tokenised text as given, multi-bleu style) or chrf "
                        "(default: bleu)")
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("curves", help="learning curves of runs in one figure (seeds of a connection: mean ± std)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--keys", type=config.parse_list, default=(), metavar="KEYS",
                   help="metrics to plot, comma-separated (default: the task's losses and perplexity or error)")
    p.add_argument("--labels", type=config.parse_list, default=(), metavar="LABELS",
                   help="one label per run, comma-separated (default: each run's connection)")
    p.add_argument("--title", default="", help="figure title (default: the run names)")
    p.add_argument("--out", default="curves.png",
                   help="figure file; its suffix names the format, .png where it has none (default: curves.png)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--layers", action="store_true",
                   help="one run's per-layer telemetry (train lm --log-layers): a heatmap (sub-layer x update) per "
                        "quantity; --keys picks the quantities")
    p.set_defaults(func=cmd_curves)

    ana = sub.add_parser("analyze", help="look into trained runs").add_subparsers(dest="analysis", required=True,
                                                                               metavar="ANALYSIS")
    analysis_options.add_parsers(ana, cmd_analyze)
    coord_check.add_arguments(ana.add_parser(
        "coord-check", help="the coordinate check: activation and update sizes after a few steps, across width and "
                            "depth, for designs under their parametrisation", description=coord_check.__doc__))
    lr_depth.add_arguments(ana.add_parser(
        "lr-depth", help="the best learning rate per depth per design from sweeps, its interval and its slope "
                         "across depth", description=lr_depth.__doc__.split("\n\n")[0]))

    cmp = sub.add_parser("compare", help="compare connections over seeds").add_subparsers(dest="task", required=True, metavar="TASK")
    for task in tasks.TASKS.values():
        _add_compare(cmp, task.name, f"{task.help}: every model x connection x seed, then a table of "
                                                f"{task.metric_label}",
                     {"out": task.compare_out}, task.compare_connections, task.compare_seeds)

    p = sub.add_parser("bench", help="what each design and the engine cost on this machine (ratios, side by side)",
                       description=bench.__doc__.split("\n\n")[0] if bench.__doc__ else None)
    bench.add_arguments(p)

    p = sub.add_parser("reproduce", help="a table of the papers, run at a scale, with the paper's numbers beside ours",
                       description=reproduce.command.__doc__.split("\n\n")[0])
    reproduce.add_arguments(p)

    swp = sub.add_parser("sweep", help="designs x depths x learning rates over seeds: stability, the metric by depth")
    swp = swp.add_subparsers(dest="task", required=True, metavar="TASK")
    for task in tasks.TASKS.values():
        if task.depth_options:  # a task sweeps once it names its depth
            _add_sweep(swp, task)

    demo = sub.add_parser("demo", help="the main job (a small comparison) or a named demo")
    demo_sub = demo.add_subparsers(dest="demo", metavar="DEMO")
    demo.set_defaults(func=None)
    _add_compare(demo_sub, "image", "Fashion-MNIST: 1xSkip, 2xSkip, 2xSkip+LN, 2rSkip+LN, 2 seeds, about 5 minutes on 2 CPU cores",
                 DEMO, DEMO_CONNECTIONS, DEMO_SEEDS)
    _add_compare(demo_sub, "caption", "fashion-mnist-scenes: a Transformer captioner with PostLN and with SAS, beam "
                 "search, BLEU-4 / METEOR / ROUGE-L / CIDEr; 1 seed, about 5 minutes on 2 CPU cores",
                 CAPTION_DEMO, ("PostLN", "SAS"), 1)
    p = demo_sub.add_parser(
        "gradient-flow",
        help="the tutorial's 50-layer tanh network, per design: input gradients table and plot",
        description=gradient_flow.__doc__.split("\n\n")[1],
    )
    config.add_arguments(p, gradient_flow.GradientFlowConfig)
    p.add_argument("--overwrite", action="store_true", help="replace the files already in --out")
    p.set_defaults(func=cmd_gradient_flow)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"skiplab: warning: {message}", file=sys.stderr)


IMPORT = "SKIPLAB_IMPORT"  # modules (comma-separated) imported first: a user's own designs, registered on import


def import_user_modules() -> None:
    """Import the modules ``$SKIPLAB_IMPORT`` names (found on the Python path or in the current folder), so that
    the designs they register are known to every command, as they would be to a script that imported them; one
    that cannot be imported is one ``ImportError`` line."""
    names = config.parse_list(os.environ.get(IMPORT, ""))
    if names and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ImportError(f"${IMPORT}: cannot import {name!r} ({err})") from None


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch system's stop, ``kill``, torchrun stopping the other ranks): raised in the main thread, so
    that a run stops as Ctrl-C stops it (its lock removed, a run that ``--overwrite`` was replacing put back)."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def _on_sigterm():
    """Turn SIGTERM into :class:`Terminated` while a command runs, where it has Python's default (death with no
    clean-up) and this is the main thread; the handler to put back, or None where none was set."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def main(argv: list[str] | None = None) -> int:
    try:
        import_user_modules()
    except (ImportError, ValueError) as err:  # not found; or its registration refused
        print(f"skiplab: error: {err}", file=sys.stderr)
        return 2
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"] and (len(argv) == 1 or argv[1].startswith("-") and argv[1] not in ("-h", "--help")):
        argv = ["demo", "image", *argv[1:]]  # the main job by default, its options given to it
    args = parser.parse_args(argv)
    args.argv = [str(a) for a in argv]  # the command as given, for the reports that restate it
    previous = _on_sigterm()
    try:
        with warnings.catch_warnings():  # restores the default display when done
            warnings.showwarning = _one_line_warning
            args.func(args)
    except (ValueError, OSError, ImportError) as err:  # bad input, absent data, no network, an optional package
        # not installed (its error names the extra to install): one clear line, no traceback
        if not getattr(err, "raised_on_main", False):  # under torchrun, rank 0's error is printed by rank 0
            print(f"skiplab: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        if distributed.rank() == 0:
            how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
            print(f"skiplab: {how}; a training run continues with --resume, a comparison by running it again",
                  file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
    finally:
        run_dir.let_go()  # a run that failed or was interrupted: its lock removed, an empty start's folder too
        distributed.shutdown()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
