"""The ``skiplab`` command line.

    skiplab connections [SPEC]           every design with its formula and source
    skiplab train image [...]            train a PreAct-ResNet with any connection (the CIFAR recipe)
    skiplab eval image --checkpoint RUN  test error of a trained run
    skiplab compare image [...]          connections x seeds, then a Table-1-style table and curves
    skiplab demo                         the main job: a small comparison on Fashion-MNIST
    skiplab demo gradient-flow [...]     the tutorial's gradient-flow demo (table + plot)

Every training option is a field of a typed config (``skiplab.train.image.ImageTrainConfig``); the
options here are derived from it, and the resolved config is saved beside every result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from . import config
from .analysis import gradient_flow
from .connections import available_connections, connection, parse_spec
from .train import run_dir
from .train.image import ImageTrainConfig

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


def _train_config(args: argparse.Namespace) -> ImageTrainConfig:
    """The config from the options; with --resume, the stored run's config with only the options given changed."""
    cfg = config.from_arguments(ImageTrainConfig, args)
    stored_path = f"{cfg.out}/config.json"
    if getattr(args, "resume", False):
        try:
            stored = run_dir.read_json(stored_path)["config"]
        except FileNotFoundError:
            raise run_dir.RunDirError(f"nothing to resume in {cfg.out}: no config.json there") from None
        defaults = ImageTrainConfig()
        given = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(defaults, f.name)}
        cfg = ImageTrainConfig(**{**stored, **given})
    return cfg


def cmd_train_image(args: argparse.Namespace) -> None:
    from .train.image import train

    summary = train(_train_config(args), resume=args.resume, overwrite=args.overwrite)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}, indent=2))


def cmd_eval_image(args: argparse.Namespace) -> None:
    from .train.image import evaluate_checkpoint

    print(json.dumps(evaluate_checkpoint(args.checkpoint, args.data_dir, args.device), indent=2))


def cmd_compare_image(args: argparse.Namespace) -> None:
    from .train.compare import compare_image

    compare_image(config.from_arguments(ImageTrainConfig, args), args.connections, args.seeds)


def _add_compare(sub, name: str, help: str, defaults: dict, connections: tuple[str, ...], seeds: int):
    p = sub.add_parser(name, help=help, description=help)
    config.add_arguments(p, ImageTrainConfig, skip=("connection", "seed"))
    p.add_argument("--connections", type=config.parse_list, default=connections, metavar="SPECS",
                   help=f"connection specs, comma-separated (default: {','.join(connections)})")
    p.add_argument("--seeds", type=int, default=seeds, help=f"seeds 1..N per connection (default: {seeds})")
    p.set_defaults(func=cmd_compare_image, connection="1xSkip", seed=1, **defaults)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skiplab", description="Skip connections with normalisation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("connections", help="list every design with its formula")
    p.add_argument("spec", nargs="?", help="also parse this spec and show the module it builds")
    p.add_argument("--dim", type=int, default=8, help="feature count for the module shown (default: 8)")
    p.set_defaults(func=cmd_connections)

    train = sub.add_parser("train", help="train a model").add_subparsers(dest="task", required=True, metavar="TASK")
    p = train.add_parser("image", help="image classification (PreAct-ResNet, CIFAR recipe)")
    config.add_arguments(p, ImageTrainConfig)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.set_defaults(func=cmd_train_image)

    ev = sub.add_parser("eval", help="evaluate a trained run").add_subparsers(dest="task", required=True, metavar="TASK")
    p = ev.add_parser("image", help="test loss and error of an image run")
    p.add_argument("--checkpoint", required=True, help="a run directory (its last.pt) or a .pt file")
    p.add_argument("--data-dir", default="", help="where the dataset is, if not where the run found it")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default: auto)")
    p.set_defaults(func=cmd_eval_image)

    cmp = sub.add_parser("compare", help="compare connections over seeds").add_subparsers(dest="task", required=True, metavar="TASK")
    _add_compare(cmp, "image", "image classification: every connection x seed, then a table", {"out": "runs/compare"},
                 DEMO_CONNECTIONS, 3)

    demo = sub.add_parser("demo", help="the main job (a small comparison) or a named demo")
    demo_sub = demo.add_subparsers(dest="demo", metavar="DEMO")
    demo.set_defaults(func=None)
    _add_compare(demo_sub, "image", "Fashion-MNIST: 1xSkip, 2xSkip, 2xSkip+LN, 2rSkip+LN, 2 seeds, about 5 minutes on 2 CPU cores",
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
