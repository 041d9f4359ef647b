"""Rank body for the multi-rank tests (importable by spawn): what `planner run --check` runs on
each rank, for several command lines in one set of processes."""

from __future__ import annotations


def planner_run_ranks(rank, world, argvs):
    """For each `planner run ...` argv: the rank body of cmd_run with the parsed arguments."""
    from executors.tools.commands import _dim_args, _rank_body
    from planner.cli import build_parser
    from planner.lang.loader import parse_overrides
    reports = []
    for argv in argvs:
        args = build_parser().parse_args(argv)
        assert args.world_size == world
        ns = {k: v for k, v in vars(args).items() if k != "handler"}
        reports.append(_rank_body(rank, world, args.plan, parse_overrides(args.overrides), ns, args.device,
                                  args.check, _dim_args(args), args.seed))
    return reports
