"""The ``lowtide`` command. Errors print one line on stderr and exit non-zero."""

from __future__ import annotations

import argparse
import sys

from lowtide.errors import LowtideError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lowtide", description="out-of-order stream processing")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the engine over three generated, disordered links")
    demo.add_argument("--seconds", type=int, default=120, help="event time to generate (default 120)")
    demo.add_argument("--rate", type=int, default=20_000, help="packets per second per link (default 20000)")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            from lowtide.demo import run

            run(args.seconds, args.rate)
    except LowtideError as exc:
        print(f"lowtide: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
