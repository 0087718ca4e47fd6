"""The ``tl-geometry`` command line.

``tl-geometry analyze`` loads a model and streams its attention layer by layer. Errors are one
clear line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import time

__all__ = ["main"]

DEFAULT_TEXT = (
    "Attention heads select tokens. Some retrieve the current token, some mix through the sink, "
    "and some reset to a neighbour. Geometry in value space tells them apart."
)


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _analyze(args: argparse.Namespace) -> None:
    from .adapters import stream_layers
    from .models import BUNDLED_MODELS, load_model

    if args.model not in BUNDLED_MODELS and "/" not in args.model:
        raise CliError(
            f"unknown model {args.model!r}: use one of {', '.join(BUNDLED_MODELS)} or a Hugging Face name"
        )
    start = time.perf_counter()
    model = load_model(args.model)
    tokens = model.to_tokens([DEFAULT_TEXT])
    if not args.quiet:
        print(f"loaded {args.model} in {time.perf_counter() - start:.1f}s; tokens {tuple(tokens.shape)}")

    def show(layer, att):
        if not args.quiet:
            print(
                f"layer {layer:2d}: pattern {tuple(att.pattern.shape)} v {tuple(att.v.shape)} "
                f"(kv heads {att.n_kv_heads})"
            )

    info = stream_layers(model, tokens, show)
    if not args.quiet:
        print(f"{info.model_class} · TransformerLens {info.transformer_lens_version} · {info.processing}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tl-geometry", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    analyze = sub.add_parser("analyze", help="analyse a model's attention geometry")
    analyze.add_argument("--model", default="smollm2-135m")
    analyze.add_argument("--quiet", action="store_true", help="print nothing but errors")
    analyze.set_defaults(run=_analyze)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (CliError, ValueError, ModuleNotFoundError, OSError) as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tl-geometry: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
