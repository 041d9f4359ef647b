"""`planner` command line: validate, compile, and the commands other modules register.

Exit codes: 0 ok, 2 invalid input (a PlanError or bad arguments), 1 failure.
Every subcommand module exposes register(subparsers); its handler returns an int.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from .errors import PlanError

__all__ = ["main"]

# modules that add subcommands; missing optional ones are skipped
COMMAND_MODULES = [
    "planner.commands",       # validate, compile
    "planner.viz.cli",        # viz
    "executors.cli",          # run, tune, bench
    "executors.perf_cli",
]


def _color() -> bool:
    return sys.stderr.isatty() and os.environ.get("NO_COLOR") is None


def print_plan_error(err: PlanError, emit: str = "text") -> None:
    if emit == "json":
        print(json.dumps({"ok": False, "errors": [d.to_json() for d in err.diagnostics]}, indent=2))
        return
    for d in err.diagnostics:
        text = d.format()
        if _color():
            text = text.replace("error[", "\033[1;31merror\033[0m[", 1)
        print(text, file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 on bad usage, which matches our contract
        self.print_usage(sys.stderr)
        print(f"planner: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="planner", description="Declarative multi-stream collective/GEMM plans for NVIDIA GPUs.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in COMMAND_MODULES:
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and mod.startswith(exc.name):
                continue
            raise
        m.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except PlanError as err:
        print_plan_error(err, getattr(args, "emit", "text"))
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
