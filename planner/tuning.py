"""The tuning file: the one format `planner tune` writes and everything else reads.

    {"device": str, "date": ISO-8601, "torch": str,
     "limits":   {tuned limit name: int},
     "backends": {op signature (planner.cost.op_signature): {"backend": str, "config": dict | null}},
     "measured": {op signature: us of the chosen backend},
     "variants": {region: {bucket: {variant: us}}},
     "candidates": {op signature: {candidate label: us}}   (optional, for the record)}

`planner compile --tuning F` reads "limits" into the gates and "measured" into the cost
model; build_executor(..., tuning=F) also applies "backends" to the lowered gemm steps.
Pure Python (no torch): the planner and the executors share it.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path

from .errors import PlanError

__all__ = ["FORMAT_KEYS", "new_tuning", "validate_tuning", "load_tuning", "save_tuning", "parse_signature",
           "read_tuning"]

FORMAT_KEYS = ("device", "date", "torch", "limits", "backends", "measured", "variants")
_SIG = re.compile(r"^gemm:(?P<dtype>\w+):M=(?P<m>\d+),N=(?P<n>\d+),K=(?P<k>\d+)$")


# ------------------------------------------------------------------ the file format

def new_tuning(device: str = "cpu", torch_version: str = "", date: str | None = None) -> dict:
    return {"device": device, "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch_version, "limits": {}, "backends": {}, "measured": {}, "variants": {}}


def validate_tuning(data, where: str = "tuning") -> dict:
    """Check the structure; returns data. Raises ValueError naming the bad key."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a JSON object")
    for k in ("limits", "backends", "measured", "variants"):
        if k in data and not isinstance(data[k], dict):
            raise ValueError(f"{where}: '{k}' must be an object")
    for k, v in data.get("limits", {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{where}: limits.{k} must be a non-negative integer, got {v!r}")
    for k, v in data.get("measured", {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"{where}: measured['{k}'] must be a non-negative number, got {v!r}")
    for k, v in data.get("backends", {}).items():
        if not isinstance(v, dict) or not isinstance(v.get("backend"), str):
            raise ValueError(f"{where}: backends['{k}'] must be {{\"backend\": str, \"config\": object|null}}")
        if v.get("config") is not None and not isinstance(v["config"], dict):
            raise ValueError(f"{where}: backends['{k}'].config must be an object or null")
    return data


def load_tuning(src) -> dict:
    """A tuning file path or an already-loaded dict -> validated dict."""
    if isinstance(src, dict):
        return validate_tuning(src)
    data = json.loads(Path(src).read_text())
    return validate_tuning(data, str(src))


def save_tuning(data: dict, path) -> Path:
    validate_tuning(data)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = {k: data[k] for k in FORMAT_KEYS if k in data}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    path.write_text(json.dumps(ordered, indent=1, sort_keys=False) + "\n")
    return path


def parse_signature(sig: str):
    """'gemm:bf16:M=8,N=6144,K=7168' -> ('bf16', 8, 6144, 7168), or None for other ops."""
    m = _SIG.match(sig)
    if not m:
        return None
    return m["dtype"], int(m["m"]), int(m["n"]), int(m["k"])


def read_tuning(path: str | None) -> dict:
    """A tuning file for the command line: {} for None; a located PlanError (exit 2) when the
    file cannot be read or is malformed."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError.at(None, "io", f"cannot read tuning file {path}: {exc}") from None
    try:
        return validate_tuning(data, str(path))
    except ValueError as exc:
        raise PlanError.at(None, "schema", str(exc)) from None
