"""The `trace-jax` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _export(args: argparse.Namespace) -> int:
    from trace_jax.checkpoints import load_model
    from trace_jax.models import save_pretrained

    model = load_model(args.checkpoint, step=args.step)
    out = save_pretrained(model, args.out)
    print(f"exported {args.checkpoint} (step {args.step if args.step is not None else 'latest'}) "
          f"to {out} as an HF Qwen3 checkpoint")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-jax",
        description="TRACE: tree-structured rollout budget allocation for multi-turn agentic RL, in JAX.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    export = sub.add_parser("export", help="write an orbax policy checkpoint as an HF Qwen3 checkpoint",
                            description="Convert an orbax policy checkpoint into an HF-layout directory "
                                        "(config.json, model.safetensors, success_head.safetensors).")
    export.add_argument("--checkpoint", required=True, help="orbax checkpoint directory")
    export.add_argument("--step", type=int, default=None, help="step to export (default: latest)")
    export.add_argument("--out", required=True, help="output directory for the HF checkpoint")
    export.set_defaults(func=_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"trace-jax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
