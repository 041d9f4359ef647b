"""Sweeps of the fp8 skinny GEMM's configurations (pure Python): the candidate lists that
scripts/bench_fp8_gemm.py's `--sweep` modes time around the shipped default (default_fp8_config)
and that the GPU tests sample. Each is ordered default first; the measured winners go into
fp8_defaults.py through scripts/fp8_defaults_from_sweep.py."""

from __future__ import annotations

import dataclasses

from .fp8_config import (
    BLOCK,
    SMS,
    Fp8Config,
    _cdiv,
    blocks_per_sm,
    default_fp8_config,
    resident_per_sm,
    wk_choices,
)


def _fits(cfg: Fp8Config, m: int, n: int, k: int) -> bool:
    return cfg.check(m, n, k) is None


def _carry_prefetch(c: Fp8Config, base: Fp8Config, k: int) -> Fp8Config:
    """A neighbour c of `base` (another K split, unroll, depth or ring) with base's L2 prefetch
    fitted to its own iterations: all of them where base prefetched all, else the same count
    where that is still past what c loads before the wait, else none."""
    if not base.l2pre:
        return c
    nit, first = c.iterations(k), c.loaded_first(k)
    p = nit if base.l2pre >= base.iterations(k) else min(base.l2pre, nit)
    return dataclasses.replace(c, l2pre=p if p > first else 0)


def fp8_configs_for(m: int, n: int, k: int, limit: int = 12, sms: int = SMS,
                    kinds: tuple[str, str] | None = None) -> list[Fp8Config]:
    """The default (for these scale kinds) and its neighbours (for a sweep): conversion split,
    launch bound, K split, unroll, tiles per warp, K order, warps along N."""
    base = default_fp8_config(m, n, k, kinds=kinds)
    kb = k // BLOCK
    rep = dataclasses.replace
    cands = [base] + [rep(base, hw=h) for h in (4, 2, 0) if h != base.hw]
    per_sm = _cdiv(base.grid(n), sms)
    if per_sm * base.threads() <= 512:  # a launch bound that still leaves >= 128 registers
        cands.append(rep(base, minb=per_sm))
    for wk in (base.warps_k // 2, base.warps_k * 2):
        if wk >= 1 and kb % wk == 0:
            cands.append(rep(base, warps_k=wk))
    if kb % (base.warps_k * 2) == 0:
        cands.append(rep(base, unroll=2))
    elif base.warps_k % 2 == 0:
        cands.append(rep(base, warps_k=base.warps_k // 2, unroll=2))
    for t in (1, 2, 4):
        if t != base.tiles and (t < 4 or base.threads() <= 256):  # 4 tiles spilled at 896 threads
            cands.append(rep(base, tiles=t))
    cands.append(rep(base, ki=0))
    for d in (2, 3):  # more weight bytes in flight (the kernels wait on global loads: Nsight Compute)
        if d <= base.iterations(k):
            cands.append(rep(base, depth=d))
            if base.minb:
                cands.append(rep(base, depth=d, minb=0))
    if base.threads() <= 512:
        cands.append(rep(base, warps_n=2))
    out: list[Fp8Config] = []
    for c in cands:
        c = _carry_prefetch(c, base, k)
        if c not in out and _fits(c, m, n, k):
            out.append(c)
    return out[:limit]


def fp8_config_grid(m: int, n: int, k: int, sms: int = SMS) -> list[Fp8Config]:
    """A wider search than fp8_configs_for (which varies one setting at a time): every
    combination of the conversion split (hw 2 or 4), tiles per warp, K split (the default's,
    half, double), unroll and launch bound that fits, default first (`--sweep grid` of
    bench_fp8_gemm.py)."""
    base = default_fp8_config(m, n, k, sms)
    kb = k // BLOCK
    wks = sorted({w for w in (base.warps_k // 2, base.warps_k, base.warps_k * 2) if w >= 1 and kb % w == 0})
    out = [base]
    for tiles in (1, 2, 4):
        for wk in wks:
            for unroll in (1, 2):
                for hw in (2, 4):  # all-integer conversion (hw 0) never won the one-setting sweep
                    c = dataclasses.replace(base, tiles=tiles, warps_k=wk, unroll=unroll, hw=hw)
                    per_sm = _cdiv(c.grid(n), sms)
                    for minb in {0, per_sm if per_sm * c.threads() <= 512 else 0}:
                        cc = _carry_prefetch(dataclasses.replace(c, minb=minb), base, k)
                        if cc not in out and _fits(cc, m, n, k) and not (tiles == 4 and cc.threads() > 256):
                            out.append(cc)
    return out


def fp8_ahead_grid(m: int, n: int, k: int, sms: int = SMS,
                   base: list[Fp8Config] | None = None) -> list[Fp8Config]:
    """`base` (default: fp8_configs_for's candidates), each with x and the scales loaded 1, 2
    and 3 iterations ahead (`--sweep ahead` of bench_fp8_gemm.py; `bulk-ahead` passes
    fp8_bulk_grid's rings)."""
    out: list[Fp8Config] = []
    for c in fp8_configs_for(m, n, k, sms=sms) if base is None else base:
        for a in (1, 2, 3):
            cc = dataclasses.replace(c, xahead=a)
            if cc not in out and _fits(cc, m, n, k) and a <= max(1, cc.iterations(k)):
                out.append(cc)
    return out


def fp8_pre_grid(m: int, n: int, k: int, sms: int = SMS,
                 base: list[Fp8Config] | None = None) -> list[Fp8Config]:
    """`base` (default: fp8_configs_for's candidates), each as it is, with the next kernel
    launched at its start (`early`), and with the L2 prefetch before the PDL wait of all its
    iterations (with and without `early`) and of half of those past the ones it loads then (with
    `early`); each prefetching one also with a launch bound of twice its resident blocks per SM
    where threads and shared memory allow that, so the next kernel's blocks can be resident
    beside this one's and stream their weights during it (`--sweep pre` of bench_fp8_gemm.py)."""
    out: list[Fp8Config] = []

    def add(c: Fp8Config) -> None:
        if c not in out and _fits(c, m, n, k):
            out.append(c)

    for c in fp8_configs_for(m, n, k, sms=sms) if base is None else base:
        add(c)
        add(dataclasses.replace(c, early=True))
        nit, first = c.iterations(k), c.loaded_first(k)
        if nit <= first:
            continue
        per = blocks_per_sm(c)
        two = 2 * resident_per_sm(c, n, sms)
        minbs = [c.minb]
        # room for a second kernel's blocks by registers too: ptxas caps them at the launch
        # bound (kept at >= 80 per thread, below which it spilled)
        if per >= two and 65536 // (two * c.threads()) >= 80 and two != c.minb:
            minbs.append(two)
        for p in sorted({nit, first + _cdiv(nit - first, 2)}):
            for mb in minbs:
                for early in (True, False) if p == nit else (True,):
                    add(dataclasses.replace(c, l2pre=p, minb=mb, early=early))
    return out


def fp8_bulk_grid(m: int, n: int, k: int, sms: int = SMS, min_inflight: int = 48 * 1024) -> list[Fp8Config]:
    """The default, then the bulk-copy ring over stages (2, 3, 4, 6), unroll (K blocks per
    copy: 1, 2, 4), tiles per warp and K split (the default's, half, a quarter, double), all
    conversions by the hardware cvt, no launch bound (`--sweep bulk` of bench_fp8_gemm.py).
    Kept: what fits the shape, whose whole grid is resident at once by shared memory and
    threads, and which keeps at least `min_inflight` weight bytes in flight per SM (S - 1
    stages per warp; 48 KiB is about what 4 TB/s needs at 1.5 us of loaded latency)."""
    base = default_fp8_config(m, n, k, sms)
    kb = k // BLOCK
    wks = sorted({w for w in (base.warps_k * 2, base.warps_k, base.warps_k // 2, base.warps_k // 4)
                  if 1 <= w <= 16 and kb % w == 0})
    out = [base]
    for tiles in (1, 2, 4):
        for wk in wks:
            for unroll in (1, 2, 4):
                for st in (2, 3, 4, 6):
                    c = _carry_prefetch(dataclasses.replace(base, tiles=tiles, warps_k=wk, unroll=unroll,
                                                            bulk=st, depth=1, minb=0, hw=4, warps_n=1,
                                                            xahead=1), base, k)
                    if (c in out or not _fits(c, m, n, k) or st > c.iterations(k)
                            or (tiles == 4 and c.threads() > 256)):
                        continue
                    inflight = (st - 1) * c.bulk_stage_bytes() * c.warps_k * resident_per_sm(c, n, sms)
                    if c.grid(n) <= sms * blocks_per_sm(c) and inflight >= min_inflight:
                        out.append(c)
    return out


HOLD_READ_BPUS = 4.0e6  # bytes per us the H200 reads (about; fp8_hold_grid's ranking only)
HOLD_EXPOSED_US = 1.7  # PDL release + first-load latency after the wait (fp8_timeline.py, qkv_a)


def fp8_hold_grid(m: int, n: int, k: int, sms: int = SMS, limit: int = 24) -> list[Fp8Config]:
    """The default, then rings that hold weights on chip before the PDL wait while the next
    kernel's blocks fit beside them (`--sweep hold` of bench_fp8_gemm.py): the next kernel
    launches at this one's start (`early`), its blocks become resident on the SM this one
    shares and fill their S stages during this kernel, so after its release only the
    iterations past S stream from DRAM. Kept: rings whose SM holds twice the grid's resident
    blocks by shared memory and threads with >= 64 registers a thread (the launch bound asks
    ptxas for that), S <= iterations; ranked by a model of the period (the busiest SM's bytes at
    the read bandwidth, or the exposed release and first latency plus the bytes past the held
    ones, whichever is longer), the best `limit`."""
    base = default_fp8_config(m, n, k, sms)
    kb = k // BLOCK
    floor_us = n * k / sms / HOLD_READ_BPUS  # one SM's even share of the weights
    scored: list[tuple] = []
    for tiles in (1, 2, 4):
        for wn in (1, 2):
            for unroll in (1, 2, 4):
                for wk in wk_choices(kb, unroll, 32):
                    for st in range(1, 9):
                        for ki in (0, 1):
                            c = Fp8Config(m_tile=base.m_tile, tiles=tiles, warps_n=wn, warps_k=wk,
                                          unroll=unroll, ki=ki, hw=4, bulk=st, early=True)
                            nit = c.iterations(k)
                            if st > nit or (tiles == 4 and c.threads() > 256):
                                continue
                            two = 2 * resident_per_sm(c, n, sms)
                            if not two or blocks_per_sm(c) < two or 65536 // (two * c.threads()) < 64:
                                continue
                            c = dataclasses.replace(c, minb=two)
                            if not _fits(c, m, n, k):
                                continue
                            busiest = two // 2 * c.rows_per_block() * sms / n  # x an even share
                            stream = busiest * floor_us
                            est = max(stream, HOLD_EXPOSED_US + (1 - st / nit) * stream)
                            warps_sm = two // 2 * c.warps_n * c.warps_k
                            scored.append((round(est / floor_us, 2), -warps_sm, st, c))
    # the model knows neither the per-iteration latency nor the conversion work: among equal
    # estimates more warps per SM come first, and at most two rings per block shape are kept
    scored.sort(key=lambda e: e[:3])
    out, per_shape = [base], {}
    for *_, c in scored:
        shape = (c.tiles, c.warps_n, c.warps_k, c.unroll)
        if len(out) > limit:
            break
        if c not in out and per_shape.get(shape, 0) < 2:
            per_shape[shape] = per_shape.get(shape, 0) + 1
            out.append(c)
    return out


def fp8_wg_grid(m: int, n: int, k: int, sms: int = SMS, limit: int = 24) -> list[Fp8Config]:
    """The default, then warpgroup (wgmma) configs (`--sweep wg` of bench_fp8_gemm.py): weight
    rows per warpgroup (tiles 1..8), warpgroups along K (up to 8), unroll, ring stages, K order
    and the early launch, each with the launch bound that keeps its whole grid resident. Kept:
    what fits (shared memory, threads, the estimated registers under that bound),
    ranked by the busiest SM's share of the weight rows, then by at least 48 KiB of weights in
    flight per SM, then by more warpgroups per SM; the best `limit` // 4 of each tiles value, at
    most three per block shape."""
    base = default_fp8_config(m, n, k, sms)
    kb = k // BLOCK
    scored: list[tuple] = []
    for tiles in (1, 2, 4, 8):
        for unroll in (1, 2, 4):
            for wk in wk_choices(kb, unroll, 8):
                for st in (2, 3, 4, 6):
                    for ki in (1, 0):
                        for early in (False, True):
                            c = Fp8Config(m_tile=base.m_tile, tiles=tiles, warps_k=wk, unroll=unroll,
                                          ki=ki, hw=4, bulk=st, early=early, wg=True)
                            per = _cdiv(c.grid(n), sms)  # a launch bound for one wave: the
                            # registers of every block fit (fp8_config checks them against it)
                            c = dataclasses.replace(c, minb=per if per > 1 else 0)
                            if (st > c.iterations(k) or not _fits(c, m, n, k)
                                    or blocks_per_sm(c) < per):
                                continue
                            busiest = per * c.rows_per_block() * sms / n
                            inflight = st * 8 * tiles * unroll * BLOCK * wk * per
                            scored.append((round(busiest, 2), inflight < 48 * 1024, -wk * per, ki == 0,
                                           st, early, c))
    scored.sort(key=lambda e: e[:6])
    out, per_shape, per_tiles = [base], {}, {}
    for *_, c in scored:  # the best of each wgmma N alike, at most three per block shape
        shape = (c.tiles, c.warps_k, c.unroll)
        if per_shape.get(shape, 0) < 3 and per_tiles.get(c.tiles, 0) < limit // 4:
            per_shape[shape] = per_shape.get(shape, 0) + 1
            per_tiles[c.tiles] = per_tiles.get(c.tiles, 0) + 1
            out.append(c)
    return out


def fp8_wgr_grid(m: int, n: int, k: int, sms: int = SMS) -> list[Fp8Config]:
    """The default, then register-weights warpgroup configs (`--sweep wgr` of bench_fp8_gemm.py):
    per cluster size along K (ks 1, 2, 4, 8, where the grid of 64-row tiles x ks is between half
    and three times the SMs, or the smallest above half) and count of warpgroups along K (a divisor,
    up to 4), the most K blocks of weights in flight that fit the registers, without and with a
    launch bound of two blocks per SM (room for the next kernel's blocks), each with the trigger
    after the wait and at the start (early)."""
    base = default_fp8_config(m, n, k, sms)
    kb = k // BLOCK
    mt = 8 if m <= 8 else 16
    tiles = _cdiv(n, 64)
    splits = [ks for ks in (1, 2, 4, 8) if kb % ks == 0]
    wanted = [ks for ks in splits if sms // 2 <= tiles * ks <= 3 * sms]
    wanted = wanted or [next((ks for ks in splits if tiles * ks >= sms // 2), splits[-1])]
    out = [base]
    for ks in wanted:
        for wk in [w for w in range(1, 5) if (kb // ks) % w == 0]:
            unroll = kb // (ks * wk)
            for minb in (0, 2):
                fit = [d for d in range(min(2, unroll), unroll + 1)
                       if _fits(Fp8Config(m_tile=mt, tiles=1, warps_k=wk, unroll=unroll, depth=d, minb=minb,
                                          ks=ks, wgr=True), m, n, k)]
                for early in ((False, True) if fit else ()):
                    c = Fp8Config(m_tile=mt, tiles=1, warps_k=wk, unroll=unroll, depth=fit[-1], minb=minb,
                                  ks=ks, early=early, wgr=True)
                    if c not in out:
                        out.append(c)
    return out
