"""The ``skiplab`` command line.

    skiplab connections [SPEC]           every design with its formula and source
    skiplab train image [...]            train a PreAct-ResNet with any connection (the CIFAR recipe)
    skiplab eval image --checkpoint RUN  test error of a trained run
    skiplab compare image [...]          connections x seeds, then a Table-1-style table and curves
    skiplab train mt [...]               train a Transformer with any connection (the Transformer recipe)
    skiplab translate --checkpoint RUN   translate stdin to stdout (beam search, optional averaging)
    skiplab eval mt --checkpoint RUN     BLEU and chrF (sacrebleu) of a split, with signatures
    skiplab average --checkpoint RUN     average the last N checkpoints into one file
    skiplab bootstrap REF A B            paired bootstrap resampling between two systems' outputs
    skiplab compare mt [...]             connections x seeds, then a BLEU table
    skiplab curves RUN [RUN ...]         learning curves of runs in one figure
    skiplab demo                         the main job: a small comparison on Fashion-MNIST
    skiplab demo gradient-flow [...]     the tutorial's gradient-flow demo (table + plot)

Every training option is a field of a typed config (``ImageTrainConfig``, ``MTTrainConfig``); the
options here are derived from them, and the resolved config is saved beside every result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from . import config
from .analysis import gradient_flow
from .connections import available_connections, connection, parse_spec
from .train import run_dir
from .train.image import ImageTrainConfig
from .train.mt import MTTrainConfig

# The main job: sized to about five minutes on 2 CPU cores.
DEMO = dict(model="preact-resnet20", dataset="fashion-mnist", epochs=6, train_subset=2000, test_subset=2000,
            out="runs/demo")
DEMO_CONNECTIONS, DEMO_SEEDS = ("1xSkip", "2xSkip", "2xSkip+LN", "2rSkip+LN"), 2


def cmd_connections(args: argparse.Namespace) -> None:
    table = available_connections()
    width = max(map(len, table))
    print("Spec grammar: [number]name[+NORM][(key=value, ...)]   NORM: LN | BN | RMS   (case-sensitive)\n")
    for spec, formula in table.items():
        print(f"  {spec.ljust(width)}  {formula}")
    if args.spec:
        conn = connection(args.spec, args.dim)
        print(f"\n{args.spec} -> {conn.spec}: {parse_spec(args.spec)}\n{conn}")


def cmd_gradient_flow(args: argparse.Namespace) -> None:
    gradient_flow.run(config.from_arguments(gradient_flow.GradientFlowConfig, args))


def _train_config(cls, args: argparse.Namespace):
    """The config from the options; with --resume, the stored run's config with only the options given changed."""
    if not getattr(args, "resume", False):
        return config.from_arguments(cls, args)
    out = getattr(args, "out")
    try:
        stored = run_dir.read_json(Path(out) / "config.json")["config"]
    except FileNotFoundError:
        raise run_dir.RunDirError(f"nothing to resume in {out}: no config.json there") from None
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name) != f.default}
    stored = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
    return cls(**{**stored, **given})


def _print_summary(summary: dict) -> None:
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))


def cmd_train_image(args: argparse.Namespace) -> None:
    from .train.image import train

    _print_summary(train(_train_config(ImageTrainConfig, args), resume=args.resume, overwrite=args.overwrite))


def cmd_train_mt(args: argparse.Namespace) -> None:
    from .train.mt import train

    _print_summary(train(_train_config(MTTrainConfig, args), resume=args.resume, overwrite=args.overwrite))


def cmd_eval_image(args: argparse.Namespace) -> None:
    from .train.image import evaluate_checkpoint

    print(json.dumps(evaluate_checkpoint(args.checkpoint, args.data_dir, args.device), indent=2))


def cmd_eval_mt(args: argparse.Namespace) -> None:
    from .translate.translator import evaluate_split

    result = evaluate_split(args.checkpoint, args.split, args.average, args.beam, args.alpha, args.data_dir, args.device)
    print(json.dumps(result, indent=2))


def cmd_translate(args: argparse.Namespace) -> None:
    from .translate.translator import Translator

    tr = Translator.load(args.checkpoint, args.average, args.device)
    lines = sys.stdin.read().splitlines()
    for line in tr.translate(lines, beam=args.beam, alpha=args.alpha, max_tokens=args.max_tokens, progress=True):
        print(line)


def cmd_average(args: argparse.Namespace) -> None:
    from .translate.translator import average_checkpoints

    state, files = average_checkpoints(args.checkpoint, args.last)
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise run_dir.RunDirError(f"{out} exists; use --overwrite to replace it")
    run_dir.save_checkpoint(out, state)
    print(f"averaged {', '.join(f.name for f in files)} into {out}")


def cmd_bootstrap(args: argparse.Namespace) -> None:
    from .text import read_lines
    from .translate import paired_bootstrap

    refs, a, b = (read_lines(p) for p in (args.ref, args.a, args.b))
    print(json.dumps(paired_bootstrap(refs, a, b, args.samples, args.seed, args.metric), indent=2))


def cmd_curves(args: argparse.Namespace) -> None:
    from .analysis.curves import plot_runs

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise run_dir.RunDirError(f"{out} exists; use --overwrite to replace it")
    print(f"wrote {plot_runs(args.runs, out, args.keys, args.labels, args.title)}")


def cmd_compare(args: argparse.Namespace) -> None:
    from .train.compare import compare

    cls = ImageTrainConfig if args.task == "image" else MTTrainConfig
    compare(args.task, config.from_arguments(cls, args), args.connections, args.seeds)


def _add_compare(sub, task: str, name: str, help: str, defaults: dict, connections: tuple[str, ...], seeds: int):
    cls = ImageTrainConfig if task == "image" else MTTrainConfig
    p = sub.add_parser(name, help=help, description=help)
    config.add_arguments(p, cls, skip=("connection", "seed"))
    p.add_argument("--connections", type=config.parse_list, default=connections, metavar="SPECS",
                   help=f"connection specs, comma-separated (default: {','.join(connections)})")
    p.add_argument("--seeds", type=int, default=seeds, help=f"seeds 1..N per connection (default: {seeds})")
    p.set_defaults(func=cmd_compare, task=task, connection=connections[0], seed=1, **defaults)
    return p


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
    p.add_argument("--average", type=int, default=0, help="average the run's last N step checkpoints (default: off)")
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 is greedy search (default: 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="GNMT length penalty ((5+|y|)/6)^alpha (default: 0.6)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skiplab", description="Skip connections with normalisation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("connections", help="list every design with its formula")
    p.add_argument("spec", nargs="?", help="also parse this spec and show the module it builds")
    p.add_argument("--dim", type=int, default=8, help="feature count for the module shown (default: 8)")
    p.set_defaults(func=cmd_connections)

    train = sub.add_parser("train", help="train a model").add_subparsers(dest="task", required=True, metavar="TASK")
    for task, cls, func, help in [("image", ImageTrainConfig, cmd_train_image, "image classification (PreAct-ResNet, CIFAR recipe)"),
                                  ("mt", MTTrainConfig, cmd_train_mt, "machine translation (Transformer recipe)")]:
        p = train.add_parser(task, help=help, description=help)
        config.add_arguments(p, cls)
        p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
        p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
        p.set_defaults(func=func)

    ev = sub.add_parser("eval", help="evaluate a trained run").add_subparsers(dest="task", required=True, metavar="TASK")
    p = ev.add_parser("image", help="test loss and error of an image run")
    p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
    p.add_argument("--data-dir", default="", help="where the dataset is, if not where the run found it")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    p.set_defaults(func=cmd_eval_image)
    p = ev.add_parser("mt", help="BLEU and chrF of a translation run on a split")
    _add_decoding(p)
    p.add_argument("--split", default="test", choices=("valid", "test"), help="which split (default: test)")
    p.add_argument("--data-dir", default="", help="where the corpus is, if not where the run found it")
    p.set_defaults(func=cmd_eval_mt)

    p = sub.add_parser("translate", help="translate stdin to stdout with a trained run")
    _add_decoding(p)
    p.add_argument("--max-tokens", type=int, default=4096, help="source tokens per batch (default: 4096)")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("average", help="average the last N checkpoints of a run into one file")
    p.add_argument("--checkpoint", required=True, help="the run directory")
    p.add_argument("--last", type=int, default=5, help="how many of the latest step checkpoints (default: 5)")
    p.add_argument("--out", required=True, help="the averaged checkpoint file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("bootstrap", help="paired bootstrap resampling (Koehn 2004) of two systems' outputs")
    p.add_argument("ref", help="reference translations, one a line")
    p.add_argument("a", help="system A's translations")
    p.add_argument("b", help="system B's translations")
    p.add_argument("--samples", type=int, default=1000, help="resamples (default: 1000)")
    p.add_argument("--seed", type=int, default=12345, help="seed (default: 12345)")
    p.add_argument("--metric", default="bleu", choices=("bleu", "chrf"), help="metric (default: bleu)")
    p.set_defaults(func=cmd_bootstrap)

    p = sub.add_parser("curves", help="learning curves of runs in one figure (seeds of a connection: mean ± std)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories")
    p.add_argument("--keys", type=config.parse_list, default=(), metavar="KEYS",
                   help="metrics to plot, comma-separated (default: the task's losses and perplexity or error)")
    p.add_argument("--labels", type=config.parse_list, default=(), metavar="LABELS",
                   help="one label per run, comma-separated (default: each run's connection)")
    p.add_argument("--title", default="", help="figure title (default: the run names)")
    p.add_argument("--out", default="curves.png", help="figure file (default: curves.png)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_curves)

    cmp = sub.add_parser("compare", help="compare connections over seeds").add_subparsers(dest="task", required=True, metavar="TASK")
    _add_compare(cmp, "image", "image", "image classification: every connection x seed, then a table",
                 {"out": "runs/compare"}, DEMO_CONNECTIONS, 3)
    _add_compare(cmp, "mt", "mt", "machine translation: every connection x seed, then a BLEU table",
                 {"out": "runs/compare-mt"}, ("PostLN", "2xSkip+LN", "2rSkip+LN"), 2)

    demo = sub.add_parser("demo", help="the main job (a small comparison) or a named demo")
    demo_sub = demo.add_subparsers(dest="demo", metavar="DEMO")
    demo.set_defaults(func=None)
    _add_compare(demo_sub, "image", "image", "Fashion-MNIST: 1xSkip, 2xSkip, 2xSkip+LN, 2rSkip+LN, 2 seeds, about 5 minutes on 2 CPU cores",
                 DEMO, DEMO_CONNECTIONS, DEMO_SEEDS)
    p = demo_sub.add_parser(
        "gradient-flow",
        help="the tutorial's 50-layer tanh network, per design: input gradients table and plot",
        description=gradient_flow.__doc__.split("\n\n")[1],
    )
    config.add_arguments(p, gradient_flow.GradientFlowConfig)
    p.set_defaults(func=cmd_gradient_flow)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["demo"]:  # the main job by default
        argv = ["demo", "image"]
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as err:  # bad input, absent data, no network: one clear line, no traceback
        print(f"skiplab: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("skiplab: interrupted; a training run continues with --resume, a comparison by running it again",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
