"""The ``skiplab`` command line.

    skiplab connections                  every design with its formula and source
    skiplab demo gradient-flow [...]     the tutorial's gradient-flow demo (table + plot)
"""

from __future__ import annotations

import argparse
import sys

from . import config
from .analysis import gradient_flow
from .connections import available_connections, connection, parse_spec


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="skiplab", description="Skip connections with normalisation.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("connections", help="list every design with its formula")
    p.add_argument("spec", nargs="?", help="also parse this spec and show the module it builds")
    p.add_argument("--dim", type=int, default=8, help="feature count for the module shown (default: 8)")
    p.set_defaults(func=cmd_connections)

    demo = sub.add_parser("demo", help="run a demo").add_subparsers(dest="demo", required=True, metavar="DEMO")
    p = demo.add_parser(
        "gradient-flow",
        help="the tutorial's 50-layer tanh network, per design: input gradients table and plot",
        description=gradient_flow.__doc__.split("\n\n")[1],
    )
    config.add_arguments(p, gradient_flow.GradientFlowConfig)
    p.set_defaults(func=cmd_gradient_flow)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as err:  # bad input: one clear line, no traceback
        print(f"skiplab: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
