"""Helpers for planner tests: plans as text in, compiled plans out."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from planner.config import CompileConfig
from planner.errors import PlanError
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "plans"
SHIPPED = sorted(p for p in PLANS.glob("*.yaml"))

HEADER = """
plan: t
params:
  hidden: 64
  tp_size: 2
dims:
  num_tokens: 1..16
groups:
  tp: tp_size
inputs:
  x: bf16[num_tokens, hidden]
weights:
  w: bf16[32, hidden]
  w2: bf16[16, hidden]
"""


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def load(tmp_path: Path, body: str, header: str = HEADER, **overrides):
    return load_plan(write(tmp_path, textwrap.dedent(header).lstrip("\n") + textwrap.dedent(body)), overrides)


def compiled(tmp_path: Path, body: str, header: str = HEADER, cfg: CompileConfig | None = None, **overrides):
    cfg = cfg or CompileConfig(verify_each=True)
    return compile_plan(load(tmp_path, body, header, **overrides), cfg)


def error(tmp_path: Path, body: str, header: str = HEADER, **overrides) -> PlanError:
    with pytest.raises(PlanError) as ei:
        load(tmp_path, body, header, **overrides)
    return ei.value


def diagnostic(tmp_path: Path, body: str, header: str = HEADER, **overrides):
    """The one diagnostic (code, message, loc, hint) a plan that must not load gets."""
    return error(tmp_path, body, header, **overrides).diagnostics[0]


def gated(when: str, a_op: str = "y: copy(x)", b_op: str = "y: copy(x)") -> str:
    """A plan body with one region r exporting y: variant a under `when`, the fallback b."""
    return f"""
outputs: [y]
ops:
  - region: r
    outputs: [y]
    variants:
      - name: a
        when: {when}
        ops:
          - {a_op}
      - name: b
        ops:
          - {b_op}
"""


def ops_by_kind(cp) -> dict:
    out: dict = {}
    for v in cp.schedule or cp.graph.nodes:
        out.setdefault(cp.graph.nodes[v]["op"].op, []).append(v)
    return out
