"""Tests for executors.cute skinny GEMMs.

CPU part: every default config of the three KDA shapes (M = 1..16) compiles for sm_90a
and its PTX has 128-bit global loads and griddepcontrol.wait. Skipped without cutlass.
GPU part (marker ``gpu``): correctness against an fp32 reference, strided in-place f_a
input, strided output, and replay from a CUDA graph captured on a side stream.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

import executors.cute as ec
from tests.cuteutil import gpu

KDA_SHAPES = {"fa_beta": (144, 7168), "fb": (1536, 128), "qkvg": (6144, 7168)}
ALL_M = list(range(1, 17))


def test_import_without_gpu_and_api_shape():
    assert isinstance(ec.importable(), bool)
    assert isinstance(ec.available(), bool)
    assert ec.supports(4, 1536, 128, "bfloat16", 144) is None
    assert ec.supports(17, 1536, 128, "bfloat16", 144) is not None
    assert ec.supports(4, 1536, 100, "bfloat16", 144) is not None
    assert ec.supports(4, 1536, 128, "bfloat16", 140) is not None
    assert ec.supports(4, 1536, 128, "float16", 128) is not None


def test_config_roundtrip_and_tables():
    for m in ALL_M:
        for n, k in KDA_SHAPES.values():
            cfg = ec.default_config(m, n, k)
            assert cfg.check(m, n, k) is None
            assert ec.Config.from_dict(cfg.to_dict()) == cfg
            assert ec.Config.from_dict(cfg.to_dict()).key() == cfg.key()
            cands = ec.configs_for(m, n, k)
            assert cands and all(c.check(m, n, k) is None for c in cands)
    assert ec.kind_for(144, 7168) == "split_n"
    assert ec.kind_for(1536, 128) == "split_k"
    assert ec.kind_for(6144, 7168) == "stream"


def _distinct_default_configs():
    seen = {}
    for name, (n, k) in KDA_SHAPES.items():
        for m in ALL_M:
            cfg = ec.default_config(m, n, k)
            seen.setdefault((cfg, n, k), (name, m))
    return seen


@pytest.fixture(scope="module")
def compiled_ptx():
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    out = {}
    for (cfg, n, k), (name, m) in _distinct_default_configs().items():
        out[(cfg, n, k)] = (name, m, ec.compile_for_arch(cfg, n, k, arch="sm_90a"))
    return out


def test_ptx_vector_loads_and_pdl(compiled_ptx):
    kinds = set()
    for (cfg, _n, _k), (name, _m, ptx) in compiled_ptx.items():
        assert ".target sm_90a" in ptx, cfg.key()
        v4 = re.findall(r"ld\.global[.\w:]*\.v4\.(?:u32|b32)", ptx)
        assert v4, f"{cfg.key()} ({name}) has no 128-bit global loads"
        assert "griddepcontrol.wait" in ptx, cfg.key()
        # weights are loaded before the PDL wait, activations after
        first_wait = ptx.index("griddepcontrol.wait")
        assert ptx.find("ld.global.nc") < first_wait, cfg.key()
        if cfg.kind != "split_n":
            assert "mma.sync.aligned.m16n8k16" in ptx, cfg.key()
        assert ".local" not in ptx, f"{cfg.key()} spills to local memory"
        kinds.add(cfg.kind)
    assert kinds == {"split_n", "split_k", "stream"}


# --------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------


def _fused_inputs(m, seed):
    """x [m, 7168], packed weight [NP, 7168], F_B weight [NFB, NFA] (bf16; weights / sqrt(K))."""
    import torch

    torch.manual_seed(seed)
    x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
    wp = torch.randn(NP, 7168, device="cuda", dtype=torch.bfloat16) / 7168**0.5
    wb = torch.randn(NFB, NFA, device="cuda", dtype=torch.bfloat16) / NFA**0.5
    return x, wp, wb


def _replay_fresh(graph, x, outs, check, times=3):
    """Replay `graph` `times` times on fresh x with NaN-poisoned (out, g1) pairs, check() each."""
    import torch

    for _ in range(times):
        for o, g in outs:
            o.fill_(float("nan"))
            g.fill_(float("nan"))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        check()


def _check(out, ref, tag):
    import torch

    o = out.float()
    assert torch.isfinite(o).all(), f"{tag}: non-finite output (unwritten?)"
    cos = torch.nn.functional.cosine_similarity(o.flatten(), ref.flatten(), dim=0).item()
    rel = ((o - ref).norm() / ref.norm()).item()
    assert cos > 0.999, f"{tag}: cosine {cos}"
    assert rel < 1e-2, f"{tag}: rel err {rel}"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", ALL_M)
@pytest.mark.parametrize("name", list(KDA_SHAPES))
def test_gpu_correct(name, m):
    import torch

    n, k = KDA_SHAPES[name]
    torch.manual_seed(1000 * m + n)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    ec.skinny_gemm(x, w, out)
    torch.cuda.synchronize()
    _check(out, x.float() @ w.float().t(), f"{name} M={m}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", ALL_M)
def test_gpu_fb_reads_fa_in_place(m):
    import torch

    torch.manual_seed(m)
    x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
    w_fab = torch.randn(144, 7168, device="cuda", dtype=torch.bfloat16) / 7168**0.5
    w_fb = torch.randn(1536, 128, device="cuda", dtype=torch.bfloat16) / 128**0.5
    fab = torch.full((m, 144), float("nan"), device="cuda", dtype=torch.bfloat16)
    ec.skinny_gemm(x, w_fab, fab)
    f_a = fab[:, :128]
    assert f_a.stride() == (144, 1)
    # strided output: a column slice of a wider buffer
    big = torch.full((m, 1536 + 64), float("nan"), device="cuda", dtype=torch.bfloat16)
    g1 = big[:, 32:32 + 1536]
    ec.skinny_gemm(f_a, w_fb, g1)
    torch.cuda.synchronize()
    _check(g1, f_a.float() @ w_fb.float().t(), f"fb M={m}")
    assert torch.isnan(big[:, :32].float()).all() and torch.isnan(big[:, 32 + 1536:].float()).all()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 4, 8, 14, 16])
def test_gpu_graph_side_stream(m):
    import torch

    torch.manual_seed(7 + m)
    x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(6144, 7168, device="cuda", dtype=torch.bfloat16) / 7168**0.5
    wa = torch.randn(144, 7168, device="cuda", dtype=torch.bfloat16) / 7168**0.5
    wb = torch.randn(1536, 128, device="cuda", dtype=torch.bfloat16) / 128**0.5
    q = torch.empty(m, 6144, device="cuda", dtype=torch.bfloat16)
    fab = torch.empty(m, 144, device="cuda", dtype=torch.bfloat16)
    g1 = torch.empty(m, 1536, device="cuda", dtype=torch.bfloat16)

    def step():
        ec.skinny_gemm(x, wq, q)
        ec.skinny_gemm(x, wa, fab)
        ec.skinny_gemm(fab[:, :128], wb, g1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up / compile outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step()
    for t in (q, fab, g1):
        t.fill_(float("nan"))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    _check(q, x.float() @ wq.float().t(), "graph qkvg")
    _check(fab, x.float() @ wa.float().t(), "graph fab")
    _check(g1, fab[:, :128].float() @ wb.float().t(), "graph fb")


# --------------------------------------------------------------------------------------
# fused whole KDA step (kda_fused_step)
# --------------------------------------------------------------------------------------
NP, NQ, NFB, NFA = 6288, 6144, 1536, 128


def test_fused_supports_and_configs():
    for m in ALL_M:
        cfg = ec.default_fused_config(m, NP, 7168, NFA, NQ)
        assert cfg.kind == "fused"
        assert ec.check_fused(cfg, m, NP, 7168, NQ, NFB, NFA) is None
        assert ec.Config.from_dict(cfg.to_dict()) == cfg
        assert ec.supports_fused(m, NP, 7168, NQ, NFB, NFA, "bfloat16", 7168, NP) is None
    assert ec.supports_fused(17, NP, 7168, NQ, NFB, NFA, "bfloat16", 7168, NP) is not None
    assert ec.supports_fused(4, NP, 7168, NQ + 4, NFB, NFA, "bfloat16", 7168, NP) is not None
    assert ec.supports_fused(4, NP, 7168, NP - 64, NFB, NFA, "bfloat16", 7168, NP) is not None
    assert ec.supports_fused(4, NP, 7168, NQ, NFB, NFA, "bfloat16", 7168, NP + 4) is not None
    from executors.cute.config import fused_grid

    t_all, t0, p, c = fused_grid(ec.default_fused_config(8, NP, 7168, NFA, NQ), NP, NQ, NFA, NFB)
    assert (t_all, t0, p, c) == (393, 384, 8, 12)
    # 12 consumer blocks of one pass at every M, 3 blocks per SM
    assert [fused_grid(ec.default_fused_config(m, NP, 7168, NFA, NQ), NP, NQ, NFA, NFB)[3]
            for m in (1, 4, 5, 8, 9, 15, 16)] == [12] * 7
    assert {ec.default_fused_config(m, NP, 7168, NFA, NQ).min_blocks_per_sm for m in (1, 8, 9, 16)} == {3}


@pytest.mark.parametrize("m", [4, 12, 16])
def test_fused_ptx(m):
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    cfg = ec.default_fused_config(m, NP, 7168, NFA, NQ)
    ptx = ec.compile_fused_for_arch(cfg, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
    assert ".target sm_90a" in ptx
    assert re.findall(r"ld\.global\.nc[.\w:]*\.v4\.u32", ptx), "no 128-bit weight loads"
    waits = [i.start() for i in re.finditer(r"griddepcontrol\.wait", ptx)]
    assert len(waits) == 2, "one PDL wait per branch (stream, consumer)"
    assert ptx.find("ld.global.nc") < waits[0]
    # the Kimi-K3 f_a columns are tile-aligned: consumers take f_a through tagged pairs
    # (test_fused_tagged_handoff_ptx); the counter handoff: test_publish_one_fence_per_block_ptx
    assert cfg.tagged_handoff == 1 and "vote.sync.all.pred" in ptx and "fence.acq_rel" not in ptx
    assert ec.default_fused_config(m, NP, 7168, NFA).tagged_handoff == 0, "f_a column unknown: counter"
    assert ec.default_fused_config(m, NP, 7168, NFA, NQ - 8).tagged_handoff == 0, "not tile-aligned: counter"
    assert "mma.sync.aligned.m16n8k16" in ptx
    assert ".local" not in ptx
    # the producers bulk-prefetch their weight rows into L2 before the wait, and the warps
    # interleave their K steps; without the tagged handoff only at m_tile 8
    assert cfg.prefetch_producer_weights == cfg.interleave_k == 1
    untagged = ec.default_fused_config(m, NP, 7168, NFA, NQ - 8)
    assert untagged.prefetch_producer_weights == untagged.interleave_k == (1 if m <= 8 else 0)
    # dispatch: the tagged kernel up to FUSED_TAG_MAX_M, the counter one up to FUSED_MAX_M, else
    # two launches
    assert ec.fused_is_default(cfg, m) == (m <= ec.FUSED_TAG_MAX_M)
    assert ec.fused_is_default(untagged, m) == (m <= ec.FUSED_MAX_M)
    if cfg.prefetch_producer_weights:
        assert "cp.async.bulk.prefetch.L2.global" in ptx
        assert ptx.find("cp.async.bulk.prefetch") < waits[0]
    else:
        assert "cp.async.bulk.prefetch" not in ptx


def test_timeline_switch():
    """timeline (the one debug switch) stamps %globaltimer/%smid from one thread per block; only
    for the fused kind, never in a default."""
    assert "timeline" in ec.Config("stream", m_tile=8, tiles=2, warps_k=8, unroll=4, timeline=True).check(8, NP, 7168)
    assert "prefetch_producer_weights" in ec.Config(
        "stream", m_tile=8, tiles=2, warps_k=8, unroll=4, prefetch_producer_weights=True).check(8, NP, 7168)
    c = ec.Config("fused", m_tile=8, tiles=2, warps_k=8, unroll=4, fb_tiles=2, prefetch_producer_weights=True,
                  timeline=True)
    assert ec.check_fused(c, 8, NP, 7168, NQ, NFB, NFA) is None and c.key().endswith("_ppf_timeline_pdl1")
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    ptx = ec.compile_fused_for_arch(c, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
    # start stamp in both branches, mid + end in producers (one per branch) and consumers
    assert ptx.count("%globaltimer") == 5 and ptx.count("%smid") == 1
    assert "%globaltimer" not in ec.compile_fused_for_arch(
        ec.default_fused_config(8, NP, 7168, NFA, NQ), NP, 7168, NQ, NFB, NFA, arch="sm_90a")


def test_config_names_and_old_keys():
    """Configs read from dicts with the field names or the short keys tuning files stored before
    the settings were named in words; unknown or removed settings are refused by name."""
    old = {"kind": "fused", "m_tile": 8, "tiles": 2, "warps_k": 8, "unroll": 4, "fb_tiles": 2, "minb": 3,
           "carve": -1, "pf": 0, "wl": 2, "swap": 1, "ki": 1, "ppf": 1, "tag": 1, "fbpf": 3, "gst": 1,
           "pwu": 0, "dx": 0, "dbg": 0}
    c = ec.Config.from_dict(old)
    assert c == ec.default_fused_config(8, NP, 7168, NFA, NQ, True)
    assert c.weights_as_a is True and c.tagged_handoff is True and c.min_blocks_per_sm == 3
    assert ec.Config.from_dict(c.to_dict()) == c and set(c.to_dict()).isdisjoint(old.keys() - {
        "kind", "m_tile", "tiles", "warps_k", "unroll", "fb_tiles"})
    with pytest.raises(ValueError, match="'dx' was removed"):
        ec.Config.from_dict({**old, "dx": 1})
    with pytest.raises(ValueError, match="unknown cute config setting 'ost'"):
        ec.Config.from_dict({**old, "ost": 1})
    with pytest.raises(ValueError, match="given twice"):
        ec.Config.from_dict({**old, "tagged_handoff": True})
    assert "switch" in ec.Config("fused", m_tile=8, fb_tiles=2, tagged_handoff=2).check(8, NP, 7168)
    import json

    from tests.planutil import ROOT

    # the tuning files in the tree (results/, or shipped with the package) still load
    loaded = 0
    for f in sorted(p for d in ("results", "executors", "planner") for p in (ROOT / d).rglob("*.json")):
        data = json.loads(f.read_text())
        backends = data.get("backends") if isinstance(data, dict) else None
        for entry in (backends or {}).values():
            if isinstance(entry, dict) and entry.get("backend") == "cute" and entry.get("config"):
                cfg = ec.Config.from_dict(entry["config"])
                assert ec.Config.from_dict(cfg.to_dict()) == cfg, f
                loaded += 1
    assert loaded > 0


def test_publish_one_fence_per_block_ptx():
    """Producers publish f_a as cooperative-groups-style grid barriers do: barrier, then ONE
    thread fences (cumulative over the block's stores) and does the release add."""
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    for m in (4, 16):
        cfg = ec.default_fused_config(m, NP, 7168, NFA)  # f_a column unknown: counter handoff
        assert cfg.tagged_handoff == 0
        ptx = ec.compile_fused_for_arch(cfg, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
        f, red = ptx.index("fence.acq_rel.gpu"), ptx.index("red.release.gpu.global.add.u32")
        bars = [i.start() for i in re.finditer(r"bar\.sync", ptx) if i.start() < red]
        assert ptx.count("fence.acq_rel.gpu") == 1 and bars[-1] < f < red
        # the consumers wait with an acquire load after their PDL wait, then read f_a
        # through L2 with 128-bit loads
        waits = [i.start() for i in re.finditer(r"griddepcontrol\.wait", ptx)]
        assert "ld.acquire.gpu.global.u32" in ptx and "atom.relaxed.gpu.global.add.u32" in ptx
        assert waits[1] < ptx.index("ld.acquire.gpu") < ptx.index("ld.global.cg.v4.u32")


def test_fused_tagged_handoff_ptx():
    """tagged_handoff=1: producers store f_a a second time as (bf16x2, epoch + 1) 64-bit pairs, one warp
    per 8 rows of each consumer spins on those pairs (128-bit relaxed loads, warp vote) and
    stages them in shared memory; no fence and no counter on the critical path; the epoch is
    the 64-bit arrival word / EPOCH_SPAN, read after the PDL wait, and every producer and
    consumer adds its share with one fire-and-forget red (no atomic round trip)."""
    from executors.cute.config import fused_tag_offset, fused_workspace_words

    c = ec.Config("fused", m_tile=8, tiles=2, warps_k=8, unroll=4, fb_tiles=2, prefetch_producer_weights=1, tagged_handoff=1)
    assert ec.check_fused(c, 8, NP, 7168, NQ, NFB, NFA) is None and c.key().endswith("_ppf_tag_pdl1")
    assert ec.Config.from_dict(c.to_dict()) == c
    # f_a need not be tile-aligned: the producer tiles overhanging it store no pairs there
    assert ec.check_fused(c, 8, NP, 7168, NQ - 8, NFB, NFA) is None
    assert ec.Config("stream", m_tile=8, tiles=2, warps_k=8, unroll=4, tagged_handoff=1).check(8, NP, 7168)
    off = fused_tag_offset(c, NP, NQ, NFA, NFB)
    assert off % 256 == 0 and off >= 16 + 32 * 405
    assert fused_workspace_words(c, NP, NQ, NFA, NFB) == off // 4 + 8 * NFA
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    for mt in (8, 16):
        cm = ec.Config("fused", m_tile=mt, tiles=2, warps_k=8, unroll=4, fb_tiles=2, tagged_handoff=1)
        ptx = ec.compile_fused_for_arch(cm, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
        waits = [i.start() for i in re.finditer(r"griddepcontrol\.wait", ptx)]
        assert len(waits) == 2 and ptx.find("ld.global.nc") < waits[0]
        epochs = [i.start() for i in re.finditer(r"ld\.relaxed\.gpu\.global\.u64", ptx)]
        assert len(epochs) == 2 and waits[0] < epochs[0] and waits[1] < epochs[1]
        arrivals = [i.start() for i in re.finditer(r"red\.relaxed\.gpu\.global\.add\.u64", ptx)]
        assert len(arrivals) == 2 and epochs[0] < arrivals[0] and epochs[1] < arrivals[1]
        # one row per polling warp: 4 x 32-wide K steps x 2 vectors
        assert ptx.count("ld.relaxed.gpu.global.v2.b64") == 8
        assert ptx.count("st.relaxed.gpu.global.b64") == 1 and "cvt.rn.bf16x2.f32" in ptx
        assert ptx.count("vote.sync.all.pred") == 1
        for absent in ("fence.acq_rel", "red.release", "ld.acquire", "atom.", "ld.global.cg.v4.u32", ".local"):
            assert absent not in ptx, absent


def test_fused_store_knobs_ptx():
    """g1_stores 1: the consumers store g1 as bf16x2 pairs (one 32-bit store per two columns); 2:
    staged in shared memory, one 16-byte store per row chunk. Their shape checks; a tagged config
    whose tiles overhang f_a (3 warps along N: 48-row tiles, f_a 128 columns) compiles with a
    guard on the pair stores."""
    base = ec.default_fused_config(16, NP, 7168, NFA, NQ, True)
    assert base.g1_stores == 1 and ec.Config.from_dict(base.to_dict()) == base and "_gs_" in base.key()
    g2 = dataclasses.replace(base, g1_stores=2)
    assert "_gs2_" in g2.key() and ec.check_fused(g2, 16, NP, 7168, NQ, NFB, NFA) is None
    assert "N_B" in ec.check_fused(base, 16, NP, 7168, NQ, NFB - 1, NFA)
    assert "N_B" in ec.check_fused(dataclasses.replace(g2, fb_passes=2), 16, NP, 7168, NQ, NFB, NFA)
    assert "N_B" in ec.check_fused(g2, 16, NP, 7168, NQ, NFB - 4, NFA)
    assert "g1_stores" in ec.Config("stream", m_tile=8, warps_k=8, unroll=4, g1_stores=1).check(8, NP, 7168)
    assert "g1_stores" in dataclasses.replace(base, g1_stores=3).check(16, NP, 7168)
    wn3 = dataclasses.replace(base, warps_n=3, min_blocks_per_sm=1)
    assert ec.check_fused(wn3, 16, NP, 7168, NQ, NFB, NFA) is None
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    plain = dataclasses.replace(base, g1_stores=0)
    counts = {}
    for c in (plain, base, g2, wn3):
        ptx = ec.compile_fused_for_arch(c, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
        assert ".local" not in ptx
        counts[c.key()] = [ptx.count(i) for i in ("st.global.b32", "st.global.v4.b32")]
    # g1 pairs: 2 n8 tiles x 2 row halves per lane; g1_stores 2: one 16-byte chunk per thread
    assert counts[plain.key()] == [0, 0]
    assert counts[base.key()] == [4, 0] and counts[g2.key()] == [0, 1]
    assert counts[wn3.key()] == [4, 0]


def test_fused_prologue_loads_ptx():
    """prologue_k_steps: only the first prologue_k_steps of iteration 0's K steps (2 weight vectors each with the swapped
    roles) are loaded before the stream part's PDL wait, the rest right after it; 0 = all 4."""
    base = ec.default_fused_config(16, NP, 7168, NFA, NQ, True)
    assert base.prologue_k_steps == 3 and base.key().endswith("_gs_pw3_pdl1")
    assert "prologue_k_steps" in dataclasses.replace(base, prologue_k_steps=5).check(16, NP, 7168)
    assert "prologue_k_steps" in ec.Config("stream", m_tile=8, warps_k=8, unroll=4, prologue_k_steps=1).check(8, NP, 7168)
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    ld = "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"
    for pw, before in ((0, 8), (3, 6), (1, 2)):
        ptx = ec.compile_fused_for_arch(dataclasses.replace(base, prologue_k_steps=pw), NP, 7168, NQ, NFB, NFA, arch="sm_90a")
        wait = ptx.index("griddepcontrol.wait")
        assert ptx[:wait].count(ld) == before, pw
        assert ptx.count(ld) == ec.compile_fused_for_arch(base, NP, 7168, NQ, NFB, NFA, arch="sm_90a").count(ld)


def test_fused_wfb_prefetch_ptx():
    """prefetch_fb_l2: the producers bulk-prefetch W_FB into L2 once, after the mma steps of stream
    iteration NIT - prefetch_fb_l2 (the m_tile-8 default: 3; an M = 16 variant: 2), inside the streaming part
    (after its PDL wait, before the consumers'); the m_tile-8 default stays at <= 80 registers
    through min_blocks_per_sm 3, without local memory in the PTX."""
    c = ec.default_fused_config(8, NP, 7168, NFA, NQ)
    assert (c.prefetch_fb_l2, c.min_blocks_per_sm, c.fb_passes) == (3, 3, 1) and c.key().endswith("_tag_wb3_pdl1")
    assert ec.Config.from_dict(c.to_dict()) == c
    assert ec.default_fused_config(16, NP, 7168, NFA, NQ).prefetch_fb_l2 == 0
    assert ec.default_fused_config(12, NP, 7168, NFA, NQ).prefetch_fb_l2 == 0
    assert ec.default_fused_config(8, NP, 7168, NFA).prefetch_fb_l2 == 0  # untagged: not measured
    assert "fused" in ec.Config("stream", m_tile=8, warps_k=8, unroll=4, prefetch_fb_l2=2).check(8, NP, 7168)
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    nit = 7168 // 32 // (8 * 4)
    m16 = dataclasses.replace(ec.default_fused_config(16, NP, 7168, NFA, NQ), prefetch_fb_l2=2, min_blocks_per_sm=3, fb_passes=1)
    for cm in (c, m16):
        ptx = ec.compile_fused_for_arch(cm, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
        waits = [i.start() for i in re.finditer(r"griddepcontrol\.wait", ptx)]
        pfs = [i.start() for i in re.finditer(r"cp\.async\.bulk\.prefetch\.L2\.global", ptx)]
        inside = [q for q in pfs if waits[0] < q < waits[1]]
        assert len(waits) == 2 and len(inside) == 1, (cm.key(), len(inside))
        # 2 mma.sync per 32-wide K step: unroll 4 x 2 tiles x 2 per iteration
        mmas = ptx.count("mma.sync.aligned", waits[0], inside[0])
        assert mmas == 16 * (nit - cm.prefetch_fb_l2 + 1), (cm.key(), mmas)
        assert ".local" not in ptx


def test_sass_weight_loads_before_pdl_wait():
    """What the PDL design relies on, checked in the SASS (ptxas may reorder the PTX): every
    default kernel issues its first group of weight loads (the non-coherent LDG.E.NA) before
    griddepcontrol.wait (ACQBULK). Before pdl_wait, ptxas hoisted the wait to the top of every
    non-fused kernel, so none of their weight loads overlapped the previous kernel."""
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    if ec.nvdisasm_path() is None:
        pytest.skip("nvdisasm not installed (dev extra nvidia-cuda-nvdisasm)")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

    def loads_before_wait(sass):
        wait = sass.index("ACQBULK")
        return sass.count("LDG.E.NA", 0, wait), sass.count("ACQBULK")

    cases = []
    for m in (1, 8, 16):
        for n, k in ((NP, 7168), (144, 7168), (NFB, NFA)):
            c = ec.default_config(m, n, k)
            first = c.rows * c.vec if c.kind == "split_n" else c.unroll * c.tiles
            cases.append((c.key(), first, ec.compile_for_arch(c, n, k, sass=True)))
    for m in (8, 12, 16):
        c = ec.default_fused_config(m, NP, 7168, NFA, NQ)
        # streaming part: unroll x tiles; consumer part: fb_tiles x K_B/32 (pass 0), after its own wait
        cases.append((c.key(), c.unroll * c.tiles, ec.compile_fused_for_arch(c, NP, 7168, NQ, NFB, NFA, sass=True)))
    for key, first, sass in cases:
        before, waits = loads_before_wait(sass)
        assert before >= first, (key, before, first)
        assert waits == (2 if key.startswith("fused") else 1), (key, waits)


def test_epoch_shares_sum_to_one_span():
    """Whatever the number of arrivals, one launch adds exactly EPOCH_SPAN to the arrival word,
    so launches of configs with different block counts can share a workspace."""
    from executors.cute.config import EPOCH_SPAN, epoch_shares

    for total in (1, 3, 14, 20, 24, 396, 65536):
        base, rem = epoch_shares(total)
        assert sum(base + (i < rem) for i in range(total)) == EPOCH_SPAN
        # a block reads before its own arrival: the word stays below the next span
        assert sum(base + (i < rem) for i in range(total - 1)) < EPOCH_SPAN


def test_variant_knobs_compile():
    """Settings measured slower on the H200, kept selectable: L2 bulk prefetch
    (l2_prefetch_distance), launch attributes (min_blocks_per_sm, smem_carveout), consumer passes."""
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from executors.cute.config import fused_grid

    c = ec.Config("fused", m_tile=16, tiles=2, warps_k=8, unroll=4, fb_tiles=2, fb_passes=4, l2_prefetch_distance=2)
    assert ec.check_fused(c, 16, NP, 7168, NQ, NFB, NFA) is None
    assert fused_grid(c, NP, NQ, NFA, NFB)[3] == 3 and c.key().endswith("_pf2_fp4_pdl1")
    ptx = ec.compile_fused_for_arch(c, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
    assert "cp.async.bulk.prefetch.L2.global" in ptx
    assert ptx.find("cp.async.bulk.prefetch") < ptx.find("griddepcontrol.wait")
    assert ".local" not in ptx
    # fused with warps along N: grid and consumer count follow warps_n
    w = ec.Config("fused", m_tile=8, tiles=1, warps_n=2, warps_k=8, unroll=4, fb_tiles=1)
    assert ec.check_fused(w, 8, NP, 7168, NQ, NFB, NFA) is None and "_t1_wn2_wk8_" in w.key()
    assert fused_grid(w, NP, NQ, NFA, NFB) == (393, 384, 8, 12)
    ptx = ec.compile_fused_for_arch(w, NP, 7168, NQ, NFB, NFA, arch="sm_90a")
    assert ".maxntid 512" in ptx or "512, 1, 1" in ptx or ".reqntid 512" in ptx
    assert ".local" not in ptx
    s = ec.Config("stream", m_tile=8, tiles=2, warps_k=8, unroll=4, min_blocks_per_sm=3, smem_carveout=0)
    ptx = ec.compile_for_arch(s, NP, 7168, arch="sm_90a")
    assert re.search(r"\.minnctapersm\s+3", ptx) and "griddepcontrol.wait" in ptx
    assert ec.Config("stream", min_blocks_per_sm=9, warps_k=8).check(8, NP, 7168) is not None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", ALL_M)
def test_gpu_fused_step(m):
    import torch

    x, wp, wb = _fused_inputs(m, 300 + m)
    big = torch.full((m, NP + 24), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, 16:16 + NP]
    g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
    # default dispatch (the tagged fused kernel up to FUSED_TAG_MAX_M for the tile-aligned f_a,
    # two launches above; at NQ - 8 the counter-handoff kernel for M <= FUSED_MAX_M, two
    # launches above), then the default
    # fused config forced; repeated launches: the counter resets itself
    ref = x.float() @ wp.float().t()
    for a0 in (NQ, NQ - 8):
        forced = ec.default_fused_config(m, NP, 7168, NFA, a0)
        for cfg in (None, None, forced, forced, forced):
            out.fill_(float("nan"))
            g1.fill_(float("nan"))
            ec.kda_fused_step(x, wp, wb, out, g1, fa_col=a0, config=cfg)
            torch.cuda.synchronize()
            _check(out, ref, f"fused out M={m} a0={a0}")
            _check(g1, ref[:, a0:a0 + NFA] @ wb.float().t(), f"fused g1 M={m} a0={a0}")
    assert torch.isnan(big[:, :16].float()).all() and torch.isnan(big[:, 16 + NP:].float()).all()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [3, 12])
def test_gpu_fused_warps_n(m):
    """fused configs with 2 warps along N (512 threads): poisoned outputs, fp32 reference."""
    import torch

    mt = 8 if m <= 8 else 16
    x, wp, wb = _fused_inputs(m, 800 + m)
    for tag in (0, 1, 1, 0):  # both f_a handoffs, sharing the stream's workspace
        cfg = ec.Config("fused", m_tile=mt, tiles=1, warps_n=2, warps_k=8, unroll=4, fb_tiles=1,
                        prefetch_producer_weights=1, tagged_handoff=tag)
        out = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
        g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
        x.copy_(torch.randn_like(x))
        for _ in range(2):
            ec.kda_fused_step(x, wp, wb, out, g1, fa_col=NQ, config=cfg)
        torch.cuda.synchronize()
        _check(out, x.float() @ wp.float().t(), f"fused wn2 tagged_handoff={tag} out M={m}")
        _check(g1, out[:, NQ:NQ + NFA].float() @ wb.float().t(), f"fused wn2 tagged_handoff={tag} g1 M={m}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 16])
def test_gpu_fused_timeline_stamps(m):
    """timeline records: one per block, start <= mid <= end, consumers see f_a only
    after every producer stamped its mid point; outputs stay correct."""
    import torch

    from executors.cute.config import fused_grid, fused_workspace_words

    mt = 8 if m <= 8 else 16
    cfg = ec.Config("fused", m_tile=mt, tiles=2, warps_k=8, unroll=4, fb_tiles=2, prefetch_producer_weights=1, timeline=True)
    t_all, _, p, c = fused_grid(cfg, NP, NQ, NFA, NFB)
    x, wp, wb = _fused_inputs(m, 700 + m)
    out = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
    g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(fused_workspace_words(cfg, NP, NQ, NFA, NFB), dtype=torch.int32, device="cuda")
    ec.kda_fused_step(x, wp, wb, out, g1, fa_col=NQ, config=cfg, workspace=ws)
    torch.cuda.synchronize()
    ref = x.float() @ wp.float().t()
    _check(out, ref, "timeline out")
    _check(g1, ref[:, NQ:NQ + NFA] @ wb.float().t(), "timeline g1")
    rec = ws[4:4 + 8 * (t_all + c)].view(torch.int64).view(t_all + c, 4).cpu()
    assert int(ws[0]) == 0, "counter must reset itself"
    assert (rec[:, 0] > 0).all() and (rec[:, 2] >= rec[:, 0]).all()
    assert (rec[:p, 1] >= rec[:p, 0]).all() and (rec[:p, 2] >= rec[:p, 1]).all()
    assert (rec[p:t_all, 1] == 0).all(), "plain stream tiles have no mid stamp"
    cons = rec[t_all:]
    assert (cons[:, 1] >= rec[:p, 1].max()).all() and (cons[:, 2] >= cons[:, 1]).all()
    assert ((rec[:, 3] >= 0) & (rec[:, 3] < torch.cuda.get_device_properties(0).multi_processor_count)).all()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 8, 9, 16])
def test_gpu_fused_graph_side_stream(m):
    import torch

    x, wp, wb = _fused_inputs(m, 900 + m)
    outs = [(torch.empty(m, NP, device="cuda", dtype=torch.bfloat16),
             torch.empty(m, NFB, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ec.kda_fused_step(x, wp, wb, *outs[0], fa_col=NQ)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for o, g in outs:
            ec.kda_fused_step(x, wp, wb, o, g, fa_col=NQ)
    def check():
        ref = x.float() @ wp.float().t()
        for o, g in outs:
            _check(o, ref, "graph fused out")
            _check(g, ref[:, NQ:NQ + NFA] @ wb.float().t(), "graph fused g1")

    _replay_fresh(graph, x, outs, check)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_gpu_fused_tagged_handoff(m):
    """tagged_handoff=1: poisoned outputs, fp32 reference, g1 against the bf16 f_a the kernel wrote;
    launches alternate with counter-handoff launches on the same workspace; then a graph of
    two steps captured on a side stream, replayed on fresh inputs."""
    import torch

    mt = 8 if m <= 8 else 16
    tagged = ec.Config("fused", m_tile=mt, tiles=2, warps_k=8, unroll=4, fb_tiles=2, tagged_handoff=1,
                       prefetch_producer_weights=1 if mt == 8 else 0)
    plain = ec.Config("fused", m_tile=mt, tiles=2, warps_k=8, unroll=4, fb_tiles=2)
    # 6 consumer blocks instead of 12: another arrival count on the same epoch word
    fewer = dataclasses.replace(tagged, fb_passes=2, prefetch_producer_weights=1, interleave_k=1)
    # producers prefetching W_FB into L2 (prefetch_fb_l2, the M <= 8 default)
    wbp = dataclasses.replace(fewer, fb_passes=1, prefetch_fb_l2=3, min_blocks_per_sm=3)
    x, wp, wb = _fused_inputs(m, 1200 + m)
    outs = [(torch.empty(m, NP, device="cuda", dtype=torch.bfloat16),
             torch.empty(m, NFB, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]

    def check(tag):
        ref = x.float() @ wp.float().t()
        for o, g in outs:
            _check(o, ref, f"{tag} out M={m}")
            _check(g, o[:, NQ:NQ + NFA].float() @ wb.float().t(), f"{tag} g1 M={m}")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for cfg in (tagged, tagged, plain, tagged, fewer, plain, wbp, fewer, wbp, tagged, plain, tagged):
            for o, g in outs:
                o.fill_(float("nan"))
                g.fill_(float("nan"))
            x.copy_(torch.randn_like(x))
            for o, g in outs:
                ec.kda_fused_step(x, wp, wb, o, g, fa_col=NQ, config=cfg)
            side.synchronize()
            check(cfg.key())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for (o, g), cfg in zip(outs, (tagged, wbp), strict=True):
            ec.kda_fused_step(x, wp, wb, o, g, fa_col=NQ, config=cfg)
    _replay_fresh(graph, x, outs, lambda: check("graph tagged + prefetch_fb_l2"))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [3, 9, 16])
def test_gpu_fused_store_knobs(m):
    """g1_stores 1 / 2 (swapped roles on the prepacked weight, and the x-as-A roles), and the
    tagged handoff with producer tiles overhanging f_a (f_a at NQ - 8; 3 warps along N), g1 in
    a row-offset view (4-byte aligned rows: g1_stores 1 runs, 2 is refused): poisoned outputs,
    fp32 reference, repeated launches on one workspace."""
    import torch

    x, wp, wb = _fused_inputs(m, 2100 + m)
    w2 = ec.tile_weights(wp, 2)
    ref = x.float() @ wp.float().t()
    sw = ec.default_fused_config(m, NP, 7168, NFA, NQ, True)
    xa = dataclasses.replace(ec.default_fused_config(m, NP, 7168, NFA, NQ), g1_stores=0)
    runs = [(dataclasses.replace(sw, g1_stores=g), w2, NQ) for g in (1, 2)]
    runs += [(dataclasses.replace(xa, g1_stores=g), wp, NQ) for g in (1, 2)]
    runs += [(dataclasses.replace(sw, warps_n=3, min_blocks_per_sm=1), w2, NQ),
             (dataclasses.replace(xa, tagged_handoff=1, g1_stores=1), wp, NQ - 8)]
    out = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
    g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
    for cfg, w, a0 in runs:
        assert ec.check_fused(cfg, m, NP, 7168, a0, NFB, NFA) is None, cfg.key()
        for _ in range(2):
            out.fill_(float("nan"))
            g1.fill_(float("nan"))
            ec.kda_fused_step(x, w, wb, out, g1, fa_col=a0, config=cfg)
            torch.cuda.synchronize()
            _check(out, ref, f"{cfg.key()} out M={m}")
            _check(g1, out[:, a0:a0 + NFA].float() @ wb.float().t(), f"{cfg.key()} g1 M={m} a0={a0}")
    big = torch.full((m, NFB + 2), float("nan"), device="cuda", dtype=torch.bfloat16)
    gv = big[:, 2:]  # rows 4-byte aligned, not 16
    ec.kda_fused_step(x, w2, wb, out, gv, fa_col=NQ, config=runs[0][0])
    torch.cuda.synchronize()
    _check(gv, out[:, NQ:NQ + NFA].float() @ wb.float().t(), f"g1_stores 1 into a view M={m}")
    assert torch.isnan(big[:, :2].float()).all()
    with pytest.raises(ValueError, match="aligned to 16 bytes"):
        ec.kda_fused_step(x, w2, wb, out, gv, fa_col=NQ, config=runs[1][0])


def test_tiled_weight_layout():
    """weight_layout=1: the weight is prepacked so each (8-row tile, 32-wide K step) is one 512-byte block
    in lane order; the kernels then load lane*16 + step*512 from the tile's base."""
    import torch

    w = torch.arange(16 * 64, dtype=torch.float32).view(16, 64)
    t = ec.tile_weights(w).view(-1, 8)  # 16-byte (8 x bf16-sized slot) vectors
    for tile, step, g, tt in ((0, 0, 0, 0), (1, 1, 2, 3), (0, 1, 7, 1)):
        lane = g * 4 + tt
        assert torch.equal(t[(tile * 2 + step) * 32 + lane], w[tile * 8 + g, step * 32 + tt * 8:][:8])
    with pytest.raises(ValueError, match="N % 8"):
        ec.tile_weights(torch.zeros(12, 64))
    assert "tiled" in ec.Config("stream", m_tile=8, warps_k=8, unroll=4, weight_layout=1, l2_prefetch_distance=1).check(8, NP, 7168)
    if not ec.importable():
        pytest.skip("nvidia-cutlass-dsl not importable")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    for c in (ec.Config("stream", m_tile=16, tiles=2, warps_k=8, unroll=4, weight_layout=1),
              ec.Config("fused", m_tile=8, tiles=2, warps_k=8, unroll=4, fb_tiles=2, weight_layout=1)):
        ptx = (ec.compile_fused_for_arch(c, NP, 7168, NQ, NFB, NFA, arch="sm_90a") if c.kind == "fused"
               else ec.compile_for_arch(c, NP, 7168, arch="sm_90a"))
        assert c.key().count("_wl1") == 1 and ".local" not in ptx
        assert "ld.global.nc.L1::no_allocate.L2::256B.v4.u32" in ptx
        assert ptx.find("ld.global.nc.L1::no_allocate") < ptx.find("griddepcontrol.wait")


def _mma_m16n8k16(afrag, bfrag):
    """Reference of one mma.sync m16n8k16 from the 32 lanes' fragments (PTX ISA layout):
    lane g*4+t holds a0..a3 = A[g][2t:2t+2], A[g+8][2t:2t+2], A[g][2t+8:2t+10], A[g+8][2t+8:2t+10],
    b0, b1 = B[2t:2t+2][g], B[2t+8:2t+10][g]; returns c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t],
    C[g+8][2t+1] per lane."""
    import torch

    A = torch.zeros(16, 16)
    B = torch.zeros(16, 8)
    for lane in range(32):
        g, t = divmod(lane, 4)
        a = afrag[lane].view(4, 2)
        A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a[0], a[1]
        A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a[2], a[3]
        b = bfrag[lane].view(2, 2)
        B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b[0], b[1]
    C = A @ B
    return [torch.stack([C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1]])
            for g, t in (divmod(lane, 4) for lane in range(32))]


def test_swap_layout_feeds_mma_fragments():
    """weights_as_a / weight_layout 2: with the weights prepacked by tile_weights(w, 2), the 16 bytes lane
    g*4+t loads at (tile * K/32 + step) * 1024 + half * 512 + lane * 16 are its A fragment of k16
    step `half`, the 16 bytes it loads from x row g (columns step*32 + t*8 ..) are its B fragments
    of both k16 steps, and _acc_entries maps the accumulators back to out[token, n] - checked by
    emulating the mma on every lane against x @ w^T (CPU, no GPU)."""
    import torch

    from executors.cute.kernels import _acc_entries

    n, k, mt = 32, 64, 16
    torch.manual_seed(0)
    w = torch.randn(n, k).bfloat16().float()
    x = torch.randn(mt, k).bfloat16().float()
    packed = ec.tile_weights(w, 2).reshape(-1)  # element offsets = byte offsets / 2
    assert ec.tile_weights(w, 2).shape == w.shape
    out = torch.zeros(mt, n)
    for tile in range(n // 16):
        acc = [[torch.zeros(4) for _ in range(32)] for _ in range(mt // 8)]
        for step in range(k // 32):
            for half in range(2):
                base = ((tile * (k // 32) + step) * 1024 + half * 512) // 2
                afrag = [packed[base + lane * 8: base + lane * 8 + 8] for lane in range(32)]
                for grp in range(mt // 8):
                    # x row g (+ 8 * grp), the lane's 8 columns: b for k16 step `half` = regs 2*half..
                    bfrag = [x[grp * 8 + lane // 4, step * 32 + (lane % 4) * 8:][:8][half * 4:half * 4 + 4]
                             for lane in range(32)]
                    c = _mma_m16n8k16(afrag, bfrag)
                    for lane in range(32):
                        acc[grp][lane] = acc[grp][lane] + c[lane]
        for lane in range(32):
            g, t = divmod(lane, 4)
            for ai, ci, r, m, c8 in _acc_entries(2, mt, 1, g, t):
                out[m, tile * 16 + r * 8 + c8] = acc[ai][lane][ci]
    torch.testing.assert_close(out, x @ w.t(), rtol=1e-4, atol=1e-4)
    # the same mapping with x as A (the default roles) covers each output once too
    seen = {(m, r * 8 + c8) for lane in range(32)
            for _, _, r, m, c8 in _acc_entries(2, mt, 0, lane // 4, lane % 4)}
    assert len(seen) == mt * 16
    with pytest.raises(ValueError, match="N % 16"):
        ec.tile_weights(torch.zeros(24, 64), 2)
    assert "weights_as_a" in ec.Config("stream", m_tile=8, tiles=1, warps_k=8, unroll=4, weights_as_a=1, weight_layout=2).check(8, NP, 7168)
    assert "weights_as_a" in ec.Config("stream", m_tile=8, tiles=2, warps_k=8, unroll=4, weight_layout=2).check(8, NP, 7168)
    assert ec.Config("stream", m_tile=8, tiles=2, warps_k=8, unroll=4, weights_as_a=1, weight_layout=2).check(8, NP, 7168) is None
    # defaults with a prepacked weight: weights as A at both m_tiles, fused at every M
    for m in (1, 8, 9, 16):
        c = ec.default_fused_config(m, NP, 7168, NFA, NQ, True)
        assert (c.weights_as_a, c.weight_layout, c.fb_passes, c.prefetch_fb_l2, c.min_blocks_per_sm, c.g1_stores, c.prologue_k_steps) == (
            1, 2, 1, 3 if m <= 8 else 0, 3, 1, 0 if m <= 8 else 3), c.key()
        assert ec.fused_is_default(c, m) and ec.check_fused(c, m, NP, 7168, NQ, NFB, NFA) is None
    assert ec.default_fused_config(8, NP, 7168, NFA, None, True).weights_as_a == 0  # untagged: no swap


def test_k_interleave_covers_every_step_once():
    """interleave_k off: warp wk owns steps [wk*JW, (wk+1)*JW); on: iteration it of warp wk is steps
    (it*WK + wk)*U .. +U, so per iteration the block's warps read one contiguous run. Both
    orders must visit every 32-wide K step exactly once (the sum over K is order-free)."""
    from executors.cute.kernels import _k_steps

    for wk_n, u, steps in ((8, 4, 224), (4, 2, 224), (8, 1, 8), (1, 4, 4)):
        jw = steps // wk_n
        for ki in (0, 1):
            seen = []
            runs = set()
            for it in range(jw // u):
                run = []
                for wk in range(wk_n):
                    s0, step = _k_steps(wk, wk_n, u, jw, ki)
                    run += [s0 + it * step + uu for uu in range(u)]
                seen += run
                runs.add(tuple(sorted(run)) == tuple(range(min(run), min(run) + wk_n * u)))
            assert sorted(seen) == list(range(steps)), (wk_n, u, ki)
            if ki:
                assert runs == {True}, "interleave_k: each iteration is one contiguous run across the warps"
    assert "tensor-core" in ec.Config("split_n", m_tile=8, interleave_k=1).check(8, 144, 7168)
    assert "l2_prefetch_distance 0" in ec.Config("stream", m_tile=8, warps_k=8, unroll=4, interleave_k=1, l2_prefetch_distance=1).check(8, NP, 7168)
    assert ec.Config("stream", m_tile=8, warps_k=8, unroll=4, interleave_k=1).key().count("_ki") == 1


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
def test_gpu_k_interleave(m):
    """interleave_k off the defaults: stream (row-major and tiled weights) and fused at both m_tiles,
    poisoned outputs, fp32 reference."""
    import torch

    x, wp, wb = _fused_inputs(m, 900 + m)
    ref = x.float() @ wp.float().t()
    mt = 8 if m <= 8 else 16
    out = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
    for wl, w in ((0, wp), (1, ec.tile_weights(wp))):
        out.fill_(float("nan"))
        ec.skinny_gemm(x, w, out, ec.Config("stream", m_tile=mt, tiles=2, warps_k=8, unroll=4, interleave_k=1, weight_layout=wl))
        torch.cuda.synchronize()
        _check(out, ref, f"stream ki wl{wl} M={m}")
    g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
    out.fill_(float("nan"))
    cfg = ec.Config("fused", m_tile=mt, tiles=2, warps_k=8, unroll=4, fb_tiles=2, interleave_k=1, tagged_handoff=1)
    ec.kda_fused_step(x, wp, wb, out, g1, fa_col=NQ, config=cfg)
    torch.cuda.synchronize()
    _check(out, ref, f"fused ki M={m}")
    _check(g1, ref[:, NQ:NQ + NFA] @ wb.float().t(), f"fused ki g1 M={m}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
def test_gpu_tiled_weights(m):
    """weight_layout=1 kernels on tile_weights(w) give x @ w^T (stream and fused), poisoned outputs."""
    import torch

    x, wp, wb = _fused_inputs(m, 700 + m)
    wt = ec.tile_weights(wp)
    ref = x.float() @ wp.float().t()
    mt = 8 if m <= 8 else 16
    out = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
    ec.skinny_gemm(x, wt, out, ec.Config("stream", m_tile=mt, tiles=2, warps_k=8, unroll=4, weight_layout=1))
    torch.cuda.synchronize()
    _check(out, ref, f"stream wl1 M={m}")
    g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
    out.fill_(float("nan"))
    cfg = ec.Config("fused", m_tile=mt, tiles=2, warps_k=8, unroll=4, fb_tiles=2, weight_layout=1)
    ec.kda_fused_step(x, wt, wb, out, g1, fa_col=NQ, config=cfg)
    torch.cuda.synchronize()
    _check(out, ref, f"fused wl1 M={m}")
    _check(g1, ref[:, NQ:NQ + NFA] @ wb.float().t(), f"fused wl1 g1 M={m}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
def test_gpu_swap_roles(m):
    """weights_as_a on tile_weights(w, 2): weights as the mma A operand, stream and fused (with the
    tagged handoff, producer prefetches and the W_FB prefetch), poisoned outputs, fp32 reference,
    repeated launches on one workspace."""
    import torch

    x, wp, wb = _fused_inputs(m, 1700 + m)
    w2 = ec.tile_weights(wp, 2)
    ref = x.float() @ wp.float().t()
    mt = 8 if m <= 8 else 16
    out = torch.full((m, NP), float("nan"), device="cuda", dtype=torch.bfloat16)
    ec.skinny_gemm(x, w2, out, ec.Config("stream", m_tile=mt, tiles=2, warps_k=8, unroll=4, interleave_k=1, weights_as_a=1, weight_layout=2))
    torch.cuda.synchronize()
    _check(out, ref, f"stream swap M={m}")
    g1 = torch.full((m, NFB), float("nan"), device="cuda", dtype=torch.bfloat16)
    # the default dispatch with the prepacked weight passed (swap at every M), then swap configs
    # forced on the prepacked weight
    base = ec.default_fused_config(m, NP, 7168, NFA, NQ)
    runs = [("w_swap", wp, {"w_swap": w2})] + [
        (c.key(), w2, {"config": c})
        for c in (dataclasses.replace(base, weights_as_a=1, weight_layout=2), dataclasses.replace(base, weights_as_a=1, weight_layout=2, fb_passes=1))]
    for tag, w, kw in runs:
        for _ in range(3):
            out.fill_(float("nan"))
            g1.fill_(float("nan"))
            ec.kda_fused_step(x, w, wb, out, g1, fa_col=NQ, **kw)
            torch.cuda.synchronize()
            _check(out, ref, f"fused {tag} M={m}")
            _check(g1, out[:, NQ:NQ + NFA].float() @ wb.float().t(), f"fused {tag} g1 M={m}")


def test_kernel_cache_key_ignores_comments(tmp_path):
    """The disk-cache key hashes the kernel sources without comments and blank lines: a comment
    edit keeps the cached kernels, a code edit (even one constant, or a '#' inside a string) does not."""
    a, b, c, d = (tmp_path / n for n in ("a.py", "b.py", "c.py", "d.py"))
    a.write_text("X = 1  # one\n\n\ndef f(y):\n    return y + X\n")
    b.write_text("# header\nX = 1\n\ndef f(y):  # why\n    return y + X   \n")
    c.write_text("X = 2\n\n\ndef f(y):\n    return y + X\n")
    d.write_text("X = 1\n\n\ndef f(y):\n    return y + X  # \nS = '# not a comment'\n")
    assert ec.code_hash([a]) == ec.code_hash([b]) != ec.code_hash([c])
    assert ec.code_hash([d]) != ec.code_hash([a])
    assert ec._source_hash() == ec.code_hash(
        Path(ec.__file__).parent / n for n in ("kernels.py", "fused.py", "ptx.py", "config.py"))
