"""Command line: `python -m singa info [--json] [-v]`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m singa", description="SINGA command line tools.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_info = sub.add_parser(
        "info", help="installed backends, devices, versions and kernel coverage",
        description="Report singa-core's version, the installed backend plugins with their devices and kernel "
                    "coverage, plugins that failed to load, communicators, and the device SINGA_DEVICE selects.")
    p_info.add_argument("--json", action="store_true", help="print the report as JSON")
    p_info.add_argument("-v", "--verbose", action="store_true", help="include tracebacks of failed plugins")
    args = parser.parse_args(argv)
    if args.command == "info":
        from singa import info

        return info.main(as_json=args.json, verbose=args.verbose)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
