"""The tuning file: the one format `planner tune` writes and everything else reads.

    {"device": str, "date": ISO-8601, "torch": str,
     "cc": int (compute capability, 90 = sm_90; optional), "versions": {library: "major.minor"} (optional),
     "limits":   {tuned limit name: int},
     "backends": {op signature (planner.cost.op_signature): {"backend": str, "config": dict | null}},
     "measured": {op signature: us of the chosen backend},
     "variants": {region: {bucket: {variant: us}}},
     "candidates": {op signature: {candidate label: us}}   (optional, for the record),
     "refinements": [what the tuner tried per bucket]      (optional, for the record),
     "fusion":   {fusion_key: {"max_tokens": int, "max_bytes": int}}   (optional),
     "externs":  "MODULE:NAME" of the model code whose extern sites "measured" times (optional)}

"fusion" gates FlashInfer's fused all-reduce + residual + RMSNorm kernel per dtype, hidden
size and group size ("all_reduce_add_rmsnorm:bf16:N=7168,W=8"): calls of at most max_tokens
rows and max_bytes of input take it, larger ones the all_reduce and a separate norm
(scripts/bench_allreduce_norm.py measures it; `planner tune` runs in one process).

Validation is strict: an unknown key is an error naming the file and the key (a flat
{"limit": N} file is refused, not ignored), check_limits refuses a limit the plan does not
declare and check_variants a "variants" record of a region or variant it does not have (and a
limit of 0 a gate divides by). Backend names are the executor's registry's (extensible:
executors.backends.registry.register), so executors.tuning.check_backends checks them where a
tuning is applied (build_executor, apply_tuning, `planner run --tuning`); `planner compile`
reads no backend. `planner compile --tuning F` reads "limits" into the gates and "measured" into
the cost model; build_executor(..., tuning=F) also lowers the gemm steps with "backends".

Shipped tunings live in planner/tuned/*.json (package data, this format). With no tuning
given, match_tuning picks the one whose device name, compute capability and library
versions equal the running device's (`planner compile` has no GPU: it matches on --device,
default the H200 of the default device profile, and ignores versions) and whose limits and
gemm signatures all belong to the plan. Pure Python (no torch): planner and executors share it.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from pathlib import Path

from .cost import TUNABLE_KINDS, split_signature
from .errors import Loc, PlanError, did_you_mean, read_json

__all__ = ["FORMAT_KEYS", "ALL_KEYS", "extern_note", "fusion_key", "new_tuning", "validate_tuning", "load_tuning", "save_tuning", "parse_signature",
           "read_tuning", "check_limits", "check_variants", "packaged", "match_tuning", "gemm_shapes", "DEFAULT_DEVICE", "TUNED_DIR"]

FORMAT_KEYS = ("device", "date", "torch", "limits", "backends", "measured", "variants")
ALL_KEYS = FORMAT_KEYS + ("cc", "versions", "candidates", "refinements", "fusion", "externs")
_FUSION_KEY = re.compile(r"^all_reduce_add_rmsnorm:(bf16|fp16):N=\d+,W=\d+$")
TUNED_DIR = Path(__file__).resolve().parent / "tuned"
DEFAULT_DEVICE = "NVIDIA H200"  # the device of the default profile (planner.cost.DeviceProfile)
_SIG = re.compile(r"^gemm:(?P<dtype>\w+):M=(?P<m>\d+),N=(?P<n>\d+),K=(?P<k>\d+)$")


# ------------------------------------------------------------------ the file format

def fusion_key(dtype: str, hidden, world: int) -> str:
    """The "fusion" entry's key for an all_reduce_add_rmsnorm of this dtype, hidden size and group size."""
    return f"all_reduce_add_rmsnorm:{dtype}:N={hidden},W={world}"


def new_tuning(device: str = "cpu", torch_version: str = "", date: str | None = None) -> dict:
    return {"device": device, "date": date or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch_version, "limits": {}, "backends": {}, "measured": {}, "variants": {}}


def _bad(where: str, msg: str) -> ValueError:
    """The error of a malformed tuning: `where: msg`, or msg alone where the caller locates it
    (where == "": a located error names the file already)."""
    return ValueError(f"{where}: {msg}" if where else msg)


def validate_tuning(data, where: str = "tuning") -> dict:
    """Check the structure; returns data. Raises ValueError naming `where` (unless "") and the bad key."""
    if not isinstance(data, dict):
        raise _bad(where, "must be a JSON object")
    for k in data:
        if k not in ALL_KEYS:
            hint = " (tuned limits go under \"limits\")" if isinstance(data[k], int) else ""
            raise _bad(where, f"unknown key '{k}'{hint}; a tuning file has {', '.join(ALL_KEYS)}")
    for k in ("limits", "backends", "measured", "variants", "candidates", "versions", "fusion"):
        if k in data and not isinstance(data[k], dict):
            raise _bad(where, f"'{k}' must be an object")
    for k in ("device", "date", "torch", "externs"):
        if k in data and not isinstance(data[k], str):
            raise _bad(where, f"'{k}' must be a string")
    if "cc" in data and (isinstance(data["cc"], bool) or not isinstance(data["cc"], int)):
        raise _bad(where, f"'cc' must be an integer (90 for sm_90), got {data['cc']!r}")
    if "refinements" in data and not isinstance(data["refinements"], list):
        raise _bad(where, "'refinements' must be a list")
    for k, v in data.get("versions", {}).items():
        if not isinstance(v, str):
            raise _bad(where, f"versions.{k} must be a string like \"2.11\", got {v!r}")
    for k, v in data.get("limits", {}).items():
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
            raise _bad(where, f"limits.{k} must be a non-negative integer below 2**63, got {v!r:.40}")
    for sec in ("variants", "candidates"):  # records of what planner tune timed: {key: {label: value}}
        for k, v in data.get(sec, {}).items():
            if not isinstance(v, dict):
                raise _bad(where, f"{sec}['{k}'] must be an object, got {v!r:.40}")
    for k, v in data.get("measured", {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise _bad(where, f"measured['{k}'] must be a finite non-negative number of us, got {v!r}")
        if split_signature(k) is None:
            raise _bad(where, f"measured key '{k}' is not an op signature like"
                             f" 'gemm:bf16:M=8,N=6144,K=7168' or 'extern:rope:M=16,...'")
    for k, v in data.get("backends", {}).items():
        if not isinstance(v, dict) or not isinstance(v.get("backend"), str):
            raise _bad(where, f"backends['{k}'] must be {{\"backend\": str, \"config\": object|null}}")
        if v.get("config") is not None and not isinstance(v["config"], dict):
            raise _bad(where, f"backends['{k}'].config must be an object or null")
        bad = set(v) - {"backend", "config"}
        if bad:
            raise _bad(where, f"backends['{k}'] has unknown key '{sorted(bad)[0]}' (backend, config)")
        sig = split_signature(k)
        if sig is None or (sig[0] != "gemm" and sig[0] not in TUNABLE_KINDS) or (sig[0] == "gemm" and parse_signature(k)
                                                                                is None and ",sa=" not in sig[3]):
            raise _bad(where, f"backends key '{k}' is not an op signature like 'gemm:bf16:M=8,N=6144,K=7168'"
                             f" or 'rmsnorm:bf16:M=16,N=7168'")
    for k, v in data.get("fusion", {}).items():
        if not _FUSION_KEY.match(k):
            raise _bad(where, f"fusion key '{k}' must look like all_reduce_add_rmsnorm:bf16:N=7168,W=8")
        if not isinstance(v, dict) or set(v) - {"max_tokens", "max_bytes"} or "max_tokens" not in v:
            raise _bad(where, f"fusion['{k}'] must be {{\"max_tokens\": int, \"max_bytes\": int}}")
        for f, n in v.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise _bad(where, f"fusion['{k}'].{f} must be a non-negative integer, got {n!r}")
    return data


def extern_note(data: dict) -> str:
    """'' or the line that says whose model code the tuning's extern times are of."""
    fns = sorted({k.split(":", 2)[1] for k in data.get("measured", {}) if k.startswith("extern:")})
    if not fns:
        return ""
    who = data.get("externs") or "the implementations given to planner tune"
    return (f"; model code {', '.join(fns)} timed as {who} (time yours: planner tune --externs MODULE:NAME)")


def check_limits(data: dict, declared, where: str = "tuning", plan: str = "") -> dict:
    """Every limit of `data` must be one the plan declares (tuned: section); ValueError naming
    the file and the key otherwise. Returns data."""
    for k in data.get("limits", {}):
        if k not in declared:
            hint = did_you_mean(k, list(declared))
            raise _bad(where, f"limits.{k}: plan '{plan}' declares no tuned limit '{k}'"
                             f" (declared: {sorted(declared)}){'; ' + hint if hint else ''}")
    return data


def check_variants(data: dict, regions: dict, where: str = "tuning", plan: str = "") -> dict:
    """Every region of `data`'s "variants" record must be one of the plan's (regions: {id: Region}),
    and each variant timed one of that region's; ValueError naming the file and the key otherwise."""
    for rid, per_bucket in data.get("variants", {}).items():
        if rid not in regions:
            known = sorted(regions)
            shown = ", ".join(known[:8]) + (f", ... ({len(known)} in all)" if len(known) > 8 else "")
            hint = did_you_mean(rid, known)
            raise _bad(where, f"variants['{rid}']: plan '{plan}' has no region '{rid}'"
                       + (f" (regions: {shown})" if known else " (it has no gated regions)")
                       + (f"; {hint}" if hint else ""))
        names = [v.name for v in regions[rid].variants]
        for bucket, times in per_bucket.items():
            for name in times if isinstance(times, dict) else ():
                if name not in names:
                    raise _bad(where, f"variants['{rid}']['{bucket}']: region '{rid}' has no variant '{name}'"
                               f" (variants: {', '.join(names)})")
    _check_zero_divisors(data, regions, where)
    return data


def _check_zero_divisors(data: dict, regions: dict, where: str) -> None:
    """A tuned limit of 0 in a gate's divisor: the gate with those limits folded in, through the
    load-time check of a division by a constant zero (predicates.check_gate_values)."""
    from .expr import ExprError, free_names
    from .predicates import check_gate_values, simplify_gate
    zero = {f"tuned.{k}": 0 for k, v in data.get("limits", {}).items() if v == 0}
    for rid, region in regions.items() if zero else ():
        for v in region.variants:
            for n in sorted(free_names(v.when) & zero.keys()) if v.when is not None else ():
                try:  # one limit at a time, so the message names the divisor
                    check_gate_values(simplify_gate(v.when, {n: 0}), {}, set())
                except ExprError:
                    loc = f" at {v.loc}" if getattr(v, "loc", None) else ""
                    raise _bad(where, f"limits.{n[6:]}: 0, but the gate of variant '{v.name}' of region '{rid}'"
                               f"{loc} divides by {n} ({' '.join((v.when_src or '').split())})") from None


# ------------------------------------------------------------------ shipped tunings

def packaged() -> list:
    """[(path, data)] of the tunings shipped in planner/tuned/, validated, in name order."""
    out = []
    for p in sorted(TUNED_DIR.glob("*.json")):
        out.append((p, validate_tuning(json.loads(p.read_text()), str(p))))
    return out


def _version_ok(want: str, have: str | None) -> bool:
    if have is None:
        return True
    return have == want or have.startswith(want + ".") or have.startswith(want + "+")


def match_tuning(device: str, declared, gemm_shapes, cc: int | None = None, versions: dict | None = None):
    """The shipped tuning for this device and plan: (data, "planner/tuned/NAME.json (...)"), or
    (None, one-line note why none applies). declared: the plan's tuned limit names; gemm_shapes:
    {(dtype, N, K)} of its gemms. versions None (planner compile) skips the version check."""
    shapes = set(gemm_shapes)
    why = []
    for path, data in packaged():
        tag = path.name
        if data.get("device") != device:
            why.append(f"{tag} is for {data.get('device')}")
            continue
        if cc is not None and data.get("cc") not in (None, cc):
            why.append(f"{tag} is for sm_{data.get('cc')}")
            continue
        bad = [k for k, v in data.get("versions", {}).items() if versions is not None and not _version_ok(v, versions.get(k))]
        if bad:
            k = bad[0]
            why.append(f"{tag} is for {k} {data['versions'][k]} (here {versions.get(k)})")
            continue
        sigs = [parse_signature(k) for k in data.get("backends", {})]
        mine = [(d, n, k) in shapes for d, _, n, k in sigs]
        limits = list(data.get("limits", {}))
        if not all(mine) or any(k not in declared for k in limits) or not (sigs or limits):
            why.append(f"{tag} tunes other ops")
            continue
        cc_s = f", sm_{data['cc']}" if "cc" in data else ""
        vs = "".join(f", {k} {v}" for k, v in sorted(data.get("versions", {}).items()))
        return data, f"planner/tuned/{tag} ({device}{cc_s}{vs})"
    return None, f"no shipped tuning for {device}" + (f" ({'; '.join(why)})" if why else "") + ": plan defaults"


def gemm_shapes(plan) -> set:
    """{(dtype, N, K)} of a loaded plan's gemms (every variant) whose weight shape is static."""
    from .expr import eval_int
    out = set()
    for op in plan.ops:
        if op.op != "gemm":
            continue
        ins = op.inputs()  # a scaled gemm also reads its scales
        a, w = plan.tensors[ins[0]], plan.tensors[ins[1]]
        try:
            out.add((a.dtype, int(eval_int(w.shape[0], plan.params)), int(eval_int(w.shape[1], plan.params))))
        except Exception:  # noqa: BLE001 - a symbolic weight dim: no static signature to match
            continue
    return out
def load_tuning(src) -> dict:
    """A tuning file path or an already-loaded dict -> validated dict."""
    if isinstance(src, dict):
        return validate_tuning(src)
    return validate_tuning(read_json(src, "tuning file"), str(src))


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
    data = read_json(path, "tuning file")
    try:
        return validate_tuning(data, "")  # the error's location names the file
    except ValueError as exc:
        raise PlanError.at(Loc(str(path)), "schema", str(exc)) from None
