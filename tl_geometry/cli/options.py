"""Command-line values and shared flags: ``--n``, ``--repeats`` and ``--fractions`` parsed, the
protocols' settings, positive counts, the model and ``--threads`` flags (threads set for the
command and restored after it)."""

from __future__ import annotations

import argparse
import contextlib

from ..errors import TLGeometryError


def parse_n(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise TLGeometryError(f"--n must be comma-separated integers, e.g. 1,2,4,8; got {text!r}") from None
    if not values or min(values) < 1:
        raise TLGeometryError(f"--n values must be integers ≥ 1; got {text!r}")
    return values


def parse_repeats(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise TLGeometryError(f"--repeats must be 'auto' or an integer ≥ 0; got {text!r}") from None


# Window length, query protocol, N ladder and random rankings of each protocol; explicit flags win.
PROTOCOLS = {
    "default": {"seq_len": 256, "queries": "last", "n": "1,2,4,8,16,32", "repeats": "auto"},
    "paper": {"seq_len": 1024, "queries": "last", "n": "1,2,4,8,16,32", "repeats": "16"},
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: …)`` except for options whose default comes from ``--protocol``."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def apply_protocol(args: argparse.Namespace) -> None:
    for name, value in PROTOCOLS[args.protocol].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def check_positive(flag: str, value: int) -> None:
    if value < 1:
        raise TLGeometryError(f"{flag} must be ≥ 1; got {value}")


def parse_fractions(text: str) -> tuple[float, ...]:
    try:
        fractions = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise TLGeometryError(f"--fractions must be numbers in (0, 1] separated by commas; got {text!r}") from None
    if not all(0 < f <= 1 for f in fractions):
        raise TLGeometryError(f"--fractions must lie in (0, 1] (the share of kv heads that stream); got {text!r}")
    return fractions


def model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: TransformerLens's choice)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                        help="model weights (default %(default)s); geometry is always computed in float32 or wider")
    parser.add_argument("--device-map", default=None, help="hub models: e.g. auto, to spread layers over GPUs")
    parser.add_argument("--n-devices", type=int, default=None, help="hub models: number of GPUs to split layers over")


def threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for this command (default: torch's; 1 can be far faster on a "
                             "small machine others share: docs/performance.md)")


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """The command's torch thread count, restored after it (``main`` also runs inside notebooks
    and tests, whose threads are theirs)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise TLGeometryError(f"--threads must be at least 1; got {threads}.")
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
