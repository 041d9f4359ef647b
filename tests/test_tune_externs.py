"""`planner tune --externs`: model-code sites timed per bucket (CPU dry run: eager timing), their
times recorded under extern signatures that the cost model then reads in place of cost_us."""

from __future__ import annotations

import pytest
import torch

from executors.tools.externs import model_externs
from executors.tools.tune import tune_plan
from executors.tools.tune_externs import extern_sites, load_externs
from planner.cli import main
from planner.commands import tuned_config
from planner.lang.loader import load_plan
from planner.pipeline import compile_plan
from tests.planutil import PLANS

MLA = PLANS / "dsv3_mla_input_proj.yaml"
SMALL = {"hidden": 64, "q_lora_rank": 32, "kv_lora_rank": 16, "rope_dim": 8, "heads": 4, "qk_head_dim": 16,
         "tp_size": 2, "max_positions": 64}


def test_every_extern_site_is_timed_per_bucket_and_read_back():
    res = tune_plan(str(MLA), SMALL, device="cpu", buckets=[1, 16], iters=2, trials=1, nsets=2,
                    externs=model_externs(), log=lambda m: None)
    cp = compile_plan(load_plan(MLA, SMALL))
    sites = extern_sites(cp, "num_tokens", [1, 16])
    # q_cn and kv_c are rmsnorms of different widths: their own signatures; rope one more; per bucket
    assert len(sites) == 6 and set(sites) <= set(res["measured"])
    assert all(res["measured"][s] > 0 for s in sites)
    assert any(s.startswith("extern:rope:M=16,") for s in sites)
    cfg = tuned_config(load_plan(MLA, SMALL), res)
    assert set(sites) <= set(cfg.profile.measured)
    from planner.cost import CostModel
    m = CostModel(cfg.profile, {})
    sig = next(s for s in sites if s.startswith("extern:rope:M=16,"))
    assert m.op_us(cp.op("k_pe"), cp.tensors, {"num_tokens": 16}) == res["measured"][sig]


def test_sites_without_an_implementation_keep_their_cost():
    logs = []
    res = tune_plan(str(MLA), SMALL, device="cpu", buckets=[1], iters=2, trials=1, nsets=1,
                    externs={"rope": model_externs()["rope"]}, log=logs.append)
    assert [k for k in res["measured"] if k.startswith("extern:")] == [
        k for k in res["measured"] if k.startswith("extern:rope:")]
    assert any("no implementation of 'rmsnorm' given; keeps its cost_us" in m for m in logs)


def test_an_extern_that_returns_the_wrong_shape_is_reported_not_timed():
    logs = []
    bad = {"rope": lambda q, pos, cache: q[:, :1]}
    res = tune_plan(str(MLA), SMALL, device="cpu", buckets=[1], iters=2, trials=1, nsets=1, externs=bad,
                    log=logs.append)
    assert not any(k.startswith("extern:") for k in res["measured"])
    assert any("not timed (RuntimeError" in m and "keeps its cost_us" in m for m in logs)


def test_load_externs_errors():
    assert "rope" in load_externs("executors.tools.externs:model_externs")
    for spec, what in (("executors.tools.externs", "MODULE:NAME"), ("no_such_mod:x", "ModuleNotFoundError"),
                       ("executors.tools.externs:nope", "AttributeError"),
                       ("executors.tools.externs:__all__", "dict of function name -> callable")):
        with pytest.raises(ValueError, match=what):
            load_externs(spec)


def test_tune_cli_refuses_bad_externs_before_anything_runs(capsys):
    assert main(["tune", str(MLA), "--externs", "no_such_mod:x"]) == 2
    assert "--externs 'no_such_mod:x'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["tune", str(MLA), "--externs", "executors.tools.externs:model_externs"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err


def test_report_says_whose_model_code_was_timed(capsys):
    """A tuning's extern times are of the implementations that were timed: the tuning line says
    which, so a user with other model code knows to time theirs."""
    assert main(["compile", str(MLA)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("tuning:"))
    assert "model code rmsnorm, rope timed as executors.tools.externs:model_externs" in line
    assert "planner tune --externs" in line
    res = tune_plan(str(MLA), SMALL, device="cpu", buckets=[1], iters=2, trials=1, nsets=1,
                    externs=model_externs(), externs_from="mymodel:externs", log=lambda m: None)
    assert res["externs"] == "mymodel:externs"
