"""CuTe DSL skinny-GEMM kernels (imports cutlass: load lazily, see __init__.py).

out[M, N] = x[M, K] @ w[N, K]^T with bf16 operands, fp32 accumulation, bf16 output.
Shapes: x (M, K) with row stride sx (stride(1) == 1, sx % 8 == 0, 16-byte aligned base),
w (N, K) contiguous, out (M, N) with row stride so (stride(1) == 1). M is a runtime
value (<= m_tile); N and K are compile-time constants.

PDL: weight vectors of the first K group are loaded before ``griddepcontrol.wait``;
everything that reads x (written by the previous kernel) comes after it. The wait is emitted
by pdl_wait so that ptxas keeps that order in the SASS (tests check it with nvdisasm).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .config import EPOCH_SPAN, Config, epoch_shares

try:  # 4.8 spelling
    from cutlass.memory import SmemAllocator as _SmemAllocator
except Exception:  # pragma: no cover - 4.3 spelling
    from cutlass.utils import SmemAllocator as _SmemAllocator


# --------------------------------------------------------------------------------------
# PTX helpers
# --------------------------------------------------------------------------------------
def _ld_v4(instr: str, addr, loc, ip):
    """One 128-bit global load `instr` (e.g. ld.global.v4.u32) as four i32 values."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int64(addr).ir_value(loc=loc, ip=ip)],
        instr + " {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,l",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(4)]


@dsl_user_op
def ld_weights_v4(addr: Int64, *, loc=None, ip=None):
    """128-bit streaming load of read-only data (never written during the kernel)."""
    return _ld_v4("ld.global.nc.L1::no_allocate.L2::256B.v4.u32", addr, loc, ip)


@dsl_user_op
def ld_act_v4(addr: Int64, *, loc=None, ip=None):
    """128-bit coherent load of activations (written by the previous kernel)."""
    return _ld_v4("ld.global.v4.u32", addr, loc, ip)


@dsl_user_op
def ld_l2_v4(addr: Int64, *, loc=None, ip=None):
    """128-bit load that bypasses L1 (data written by other blocks of this grid)."""
    return _ld_v4("ld.global.cg.v4.u32", addr, loc, ip)


@dsl_user_op
def prefetch_l2_bulk(addr: Int64, nbytes: Int32, idx: Int32, limit: int, *, loc=None, ip=None):
    """If idx < limit: bulk prefetch of nbytes (multiple of 16, 16-byte aligned) into L2
    (sm_90 TMA unit): puts requests in flight without holding registers."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(nbytes).ir_value(loc=loc, ip=ip),
                           Int32(idx).ir_value(loc=loc, ip=ip)],
                    "{\n\t.reg .pred p;\n\tsetp.lt.u32 p, $2, " + str(int(limit)) + ";\n\t"
                    "@p cp.async.bulk.prefetch.L2.global [$0], $1;\n\t}",
                    "l,r,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


_WAITS = [0]  # unique PTX labels per pdl_wait instance


@dsl_user_op
def pdl_wait(tid: Int32, *, loc=None, ip=None):
    """griddepcontrol.wait as the body of a loop that runs once (its trip count, 1 + tid >> 31,
    is unknown to the compiler). As a plain instruction, or behind a branch it if-converts, ptxas
    hoists the wait to the top of the kernel, above the weight loads that are meant to be in
    flight during it (seen in the SASS of every non-fused kernel: no weight load before
    ACQBULK); it does not move a loop above earlier code."""
    _WAITS[0] += 1
    lab = f"PDLWAIT{_WAITS[0]}"
    llvm.inline_asm(None, [Int32(tid).ir_value(loc=loc, ip=ip)],
                    "{\n\t.reg .pred p;\n\t.reg .u32 i, n;\n\tshr.u32 n, $0, 31;\n\t"
                    f"add.u32 n, n, 1;\n\tmov.u32 i, 0;\n\t{lab}:\n\tgriddepcontrol.wait;\n\t"
                    f"add.u32 i, i, 1;\n\tsetp.lt.u32 p, i, n;\n\t@p bra {lab};\n\t}}",
                    "r", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None):
    llvm.inline_asm(None, [], "fence.acq_rel.gpu;", "", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def red_add_release_gpu(addr: Int64, val: Int32, *, loc=None, ip=None):
    """Release-ordered atomic add at GPU scope (publishes this block's earlier writes)."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip)],
                    "red.release.gpu.global.add.u32 [$0], $1;", "l,r", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _arrive_ptx(total: str) -> str:
    """PTX: count one arrival at [$0]; the one that completes `total` sets p and resets the
    counter to 0 (needs .reg .u32 o, tm1 and .reg .pred p)."""
    return ("atom.relaxed.gpu.global.add.u32 o, [$0], 1;\n\t"
            f"sub.u32 tm1, {total}, 1;\n\t"
            "setp.eq.u32 p, o, tm1;\n\t"
            "@p st.relaxed.gpu.global.u32 [$0], 0;\n\t")


@dsl_user_op
def wait_then_arrive(addr: Int64, target: Int32, total: Int32, *, loc=None, ip=None):
    """Spin (acquire, GPU scope) until *addr >= target, then add 1; the arrival that
    brings the counter to ``total`` resets it to 0 (self-cleaning across launches)."""
    llvm.inline_asm(
        None,
        [Int64(addr).ir_value(loc=loc, ip=ip), Int32(target).ir_value(loc=loc, ip=ip),
         Int32(total).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .u32 v, o, tm1;\n\t.reg .pred p;\n\t"
        "SPIN:\n\t"
        "ld.acquire.gpu.global.u32 v, [$0];\n\t"
        "setp.lt.u32 p, v, $1;\n\t"
        "@!p bra DONE;\n\t"
        "nanosleep.u32 64;\n\t"
        "bra SPIN;\n\t"
        "DONE:\n\t" + _arrive_ptx("$2") + "}",
        "l,r,r",
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None):
    """Round two fp32 values to bf16 and pack them (lo in the low half), as mma operands want."""
    return Int32(llvm.inline_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
                                 "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_tagged(addr: Int64, val: Int32, tag: Int32, *, loc=None, ip=None):
    """One single-copy-atomic 64-bit store of (val, tag): a reader that sees the tag sees val."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip),
                           Int32(tag).ir_value(loc=loc, ip=ip)],
                    "{\n\t.reg .b64 d;\n\tmov.b64 d, {$1, $2};\n\t"
                    "st.relaxed.gpu.global.b64 [$0], d;\n\t}",
                    "l,r,r", has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


_POLLS = [0]  # unique PTX labels per poll instance


@dsl_user_op
def poll_tagged(addr: Int64, tag: Int32, steps: int, *, loc=None, ip=None):
    """Whole warp: spin until the 4 * steps (value, tag) pairs of every lane (addr: byte address
    of the lane's first pair; 4 pairs per 128-byte step) carry `tag`, then return the values
    (4 per step, bf16x2). 128-bit relaxed GPU-scope loads, each 64-bit element single-copy
    atomic; the warp leaves the loop together (vote.all)."""
    _POLLS[0] += 1
    lab = f"TAGPOLL{_POLLS[0]}"
    nv = 4 * steps  # one b64 register per pair
    lines = ["{", ".reg .pred ok, all;", f".reg .b64 q<{nv}>;", f".reg .b32 tg<{nv}>;", f"{lab}:"]
    for sk in range(steps):
        for h in range(2):
            i = 4 * sk + 2 * h
            lines.append(f"ld.relaxed.gpu.global.v2.b64 {{q{i}, q{i + 1}}}, [${nv}+{sk * 128 + h * 16}];")
    for j in range(nv):
        lines.append(f"mov.b64 {{${j}, tg{j}}}, q{j};")
    lines.append(f"setp.eq.u32 ok, tg0, ${nv + 1};")
    for j in range(1, nv):
        lines.append(f"setp.eq.and.u32 ok, tg{j}, ${nv + 1}, ok;")
    lines += ["vote.sync.all.pred all, ok, 0xffffffff;", "@!all nanosleep.u32 32;",
              f"@!all bra {lab};", "}"]
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * nv),
        [Int64(addr).ir_value(loc=loc, ip=ip), Int32(tag).ir_value(loc=loc, ip=ip)],
        "\n\t".join(lines),
        ",".join(["=&r"] * nv + ["l", "r"]),
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return [Int32(llvm.extractvalue(T.i32(), res, [j])) for j in range(nv)]


@dsl_user_op
def ld_epoch(addr: Int64, *, loc=None, ip=None):
    """tag = 1: this launch's epoch, the 64-bit arrival word / EPOCH_SPAN. Every launch adds
    exactly EPOCH_SPAN, and a block reads the word after the PDL wait (all earlier launches'
    arrivals are in) and before its own arrival (not all of this launch's are), so every
    block of a launch sees the same epoch, whatever mix of configs shares the workspace."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .u64 c;\n\tld.relaxed.gpu.global.u64 c, [$1];\n\t"
        f"shr.u64 c, c, {EPOCH_SPAN.bit_length() - 1};\n\tcvt.u32.u64 $0, c;\n\t}}",
        "=r,l", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def red_epoch(addr: Int64, idx: Int32, total: int, *, loc=None, ip=None):
    """tag = 1: arrival `idx` of `total` adds its share of EPOCH_SPAN to the arrival word, fire
    and forget: no atomic round trip before the last blocks of the step can retire (H200
    run32: 0.5-2 us per step at m_tile 16 against a counted last arrival)."""
    base, rem = epoch_shares(total)
    llvm.inline_asm(
        None, [Int64(addr).ir_value(loc=loc, ip=ip), Int32(idx).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .u32 w;\n\t.reg .u64 w64;\n\t.reg .pred p;\n\t"
        f"setp.lt.u32 p, $1, {rem};\n\tselp.u32 w, {base + 1}, {base}, p;\n\t"
        "cvt.u64.u32 w64, w;\n\tred.relaxed.gpu.global.add.u64 [$0], w64;\n\t}",
        "l,r", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def st_global_words(addr: Int64, vals, *, loc=None, ip=None):
    """One plain global store of 1 or 4 32-bit words (e.g. bf16 pairs from pack_bf16x2);
    addr aligned to their total size."""
    n = len(vals)
    body = {1: "st.global.b32 [$0], $1;", 4: "st.global.v4.b32 [$0], {$1, $2, $3, $4};"}[n]
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)] + [Int32(v).ir_value(loc=loc, ip=ip) for v in vals],
                    body, "l" + ",r" * n, has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


@dsl_user_op
def globaltimer(*, loc=None, ip=None):
    """%globaltimer (ns, comparable across SMs)."""
    return Int64(llvm.inline_asm(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def globaltimer_after(dep: Float32, *, loc=None, ip=None):
    """%globaltimer read once `dep` is available (the value is +1 ns when dep == 1.0000001f, which
    ptxas cannot rule out, so the read waits for dep's producer, e.g. an mma)."""
    return Int64(llvm.inline_asm(
        T.i64(), [Float32(dep).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .pred p;\n\t.reg .u64 t, e;\n\tsetp.eq.f32 p, $1, 0f3F800001;\n\t"
        "selp.u64 e, 1, 0, p;\n\tmov.u64 t, %globaltimer;\n\tadd.u64 $0, t, e;\n\t}",
        "=l,f", has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def smid(*, loc=None, ip=None):
    return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_u64(addr: Int64, val: Int64, *, loc=None, ip=None):
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Int64(val).ir_value(loc=loc, ip=ip)],
                    "st.global.u64 [$0], $1;", "l,l", has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _stamp(base, bid, slot: int, dep=None):
    """dbg timeline (call from one thread): %globaltimer into record bid, slot (0 start,
    1 mid, 2 end; slot 3 = SM id), read after `dep` is available if given. Records are 32 bytes
    from workspace byte 16."""
    rec = base + Int64(16) + Int64(bid) * 32
    st_u64(rec + Int64(slot * 8), globaltimer() if dep is None else globaltimer_after(dep))
    if slot == 0:  # Python-level: traced once
        st_u64(rec + Int64(24), Int64(smid()))


@dsl_user_op
def mma_k32(a, b, c, *, loc=None, ip=None):
    """Two m16n8k16 bf16 mma.sync steps (K = 32) accumulating into fp32 c[0..3].

    a: 8 x b32 (bf16x2) registers, steps 0 and 1 (a[0:4], a[4:8]);
    b: 4 x b32 registers (steps 0 and 1: b[0:2], b[2:4]); c: 4 x f32.
    """
    ops = [Int32(v).ir_value(loc=loc, ip=ip) for v in list(a) + list(b)]
    ops += [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.f32()] * 4),
        ops,
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$12, $13}, {$16, $17, $18, $19};\n\t"
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{$0, $1, $2, $3}, {$8, $9, $10, $11}, {$14, $15}, {$0, $1, $2, $3};",
        "=&f,=&f,=&f,=&f,r,r,r,r,r,r,r,r,r,r,r,r,f,f,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i])) for i in range(4)]


@dsl_user_op
def dot_bf16x2(w: Int32, x: Int32, acc: Float32, *, loc=None, ip=None):
    """acc + w.lo*x.lo + w.hi*x.hi in fp32 (bf16x2 operands)."""
    res = llvm.inline_asm(
        T.f32(),
        [Int32(w).ir_value(loc=loc, ip=ip), Int32(x).ir_value(loc=loc, ip=ip),
         Float32(acc).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 wl, wh, xl, xh;\n\t"
        "shl.b32 wl, $1, 16;\n\tand.b32 wh, $1, 0xffff0000;\n\t"
        "shl.b32 xl, $2, 16;\n\tand.b32 xh, $2, 0xffff0000;\n\t"
        "fma.rn.f32 $0, wl, xl, $3;\n\tfma.rn.f32 $0, wh, xh, $0;\n\t}",
        "=&f,r,r,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return Float32(res)


def _launch_attrs(cfg: Config) -> dict:
    """Optional launch attributes of a tensor-core config (see Config.minb / carve)."""
    kw = {}
    if cfg.minb > 0:
        kw["min_blocks_per_mp"] = cfg.minb
        # an explicit carveout (-1 = the driver's default) keeps the DSL from asking the
        # device for its shared-memory size, so this compiles without a GPU
        kw["preferred_smem_carveout"] = -1
    if cfg.carve >= 0:
        kw["preferred_smem_carveout"] = cfg.carve
    return kw


def _imin(a, b):
    return cutlass.min(a, b)


def _prefetch_rows(w_base, n_tile0, lane, k0, R: int, N: int, K: int):
    """Byte address of (weight row n_tile0 + lane + 32 j, column k0) for the rows of this
    warp's 8R-row tile that lane handles in L2 prefetches (one list entry per j)."""
    out = []
    for j in range((8 * R + 31) // 32):  # plain Python loop: unrolled at trace time
        row = _imin(n_tile0 + lane + 32 * j, N - 1)
        out.append((w_base + Int64(row) * (K * 2) + Int64(k0 * 2), lane + 32 * j, 8 * R))
    return out


def _prefetch_chunks(pf_row, R: int, lane, it0: int, it1: int, U: int):
    """L2 bulk prefetch of K-iterations [it0, it1) (U 32-wide steps each) of every row
    of the warp's tile: lane l < 8R issues row l (and l + 32, ...)."""
    nbytes = (it1 - it0) * U * 64
    for addr, idx, limit in pf_row:
        prefetch_l2_bulk(addr + Int64(it0 * U * 64), Int32(nbytes), idx, limit)


# --------------------------------------------------------------------------------------
# Tensor-core kernel (kinds split_k and stream)
# --------------------------------------------------------------------------------------
def _weight_addrs(w_base, n_tile0, g, t, lane, step0, R: int, N: int, K: int, WL: int):
    """Byte address of this lane's weight vector for K step `step0` in each of its R n8 tiles.

    Row-major: row (tile row + g), columns step0*32 + t*8 .. +8. Tiled (tile_weights): the
    (tile, step) block is 512 contiguous bytes in lane order, so the lane's vector is at
    ((tile * K/32 + step) * 32 + lane) * 16. wl = 2 (swap): entries r = 2j, 2j + 1 are the two
    k16 A fragments of 16-row tile j. Rows/tiles past N are clamped (outputs dropped)."""
    out = []  # plain Python loop/if: this helper is traced, not AST-rewritten like a kernel body
    for r in range(R):
        if WL == 2:  # (16-row tile, step) blocks of 1 KB; n8 tile r is half r % 2 of 16-row tile r // 2
            tile = _imin(n_tile0 // 16 + r // 2, N // 16 - 1)
            out.append(w_base + (Int64(tile) * (K // 32) + Int64(step0)) * 1024 + Int64((r % 2) * 512 + lane * 16))
        elif WL == 1:
            tile = _imin(n_tile0 // 8 + r, N // 8 - 1)
            out.append(w_base + (Int64(tile) * (K // 32) + Int64(step0)) * 512 + Int64(lane * 16))
        else:
            row = _imin(n_tile0 + r * 8 + g, N - 1)
            out.append(w_base + Int64(row) * (K * 2) + Int64((step0 * 32 + t * 8) * 2))
    return out


def _load_w(w_addr, it: int, U: int, R: int, w_step: int, IS: int, u0: int = 0):
    """Weight vectors of K iteration `it` (IS steps after iteration it - 1): steps u0..U-1 x R n8
    tiles (see _weight_addrs)."""
    return [ld_weights_v4(w_addr[r] + Int64((it * IS + u) * w_step)) for u in range(u0, U) for r in range(R)]


def _x_addrs(x_base, sx, m_rows, g, koff):
    """Byte addresses of x rows g and g + 8 (clamped to M - 1) at byte offset koff."""
    return (x_base + Int64(_imin(g, m_rows - 1)) * Int64(sx) * 2 + koff,
            x_base + Int64(_imin(g + 8, m_rows - 1)) * Int64(sx) * 2 + koff)


def _load_x(xg_addr, xh_addr, it: int, U: int, MT: int, IS: int, DX: int = 0):
    """x vectors (rows g, g + 8; the second is zero for m_tile 8) of K iteration `it`.
    DX (diagnostics only, Config.dx): m_tile 16 without the second row's load (rows g + 8
    reuse row g: right only where M <= 8)."""
    regs = []
    for u in range(U):
        off = Int64((it * IS + u) * 64)
        xg = ld_act_v4(xg_addr + off)
        xh = (xg if DX else ld_act_v4(xh_addr + off)) if MT == 16 else [Int32(0)] * 4
        regs.append((xg, xh))
    return regs


def _k_steps(wk, WK: int, U: int, JW: int, KI: int):
    """(first 32-wide K step of warp wk, steps between its iterations). KI = 0: the warp
    owns the contiguous K slice [wk * JW, (wk + 1) * JW). KI = 1: iteration it of warp wk
    is steps (it * WK + wk) * U .. + U, so the WK warps of a block read one contiguous
    WK * U * 64-byte run of every weight row per iteration instead of WK runs spread over it."""
    if KI:
        return wk * U, WK * U
    return wk * JW, U


def _stream_mma(w_cur, w_addr, w_step: int, xg_addr, xh_addr, pf_row, lane,
                MT: int, R: int, U: int, NIT: int, PF: int, IS: int, hook=None, DX: int = 0,
                SWAP: int = 0):
    """The streaming main loop of the tensor-core kernels (build_tc, build_fused): w_cur
    (iteration 0's weights) is loaded by the caller before its PDL wait; iteration it + 1 is
    loaded while iteration it runs its mma.sync steps. hook = (it, addr, nbytes, idx): an L2
    bulk prefetch issued after the mma steps of iteration it where idx < 1 (fused knob fbpf).
    Returns this lane's accumulators (see _acc_entries for their layout).
    SWAP: the weights (two 16-byte A fragments per 16-row tile and step) are the A operand and
    x row g (+ 8) the B operand: (R // 2) x (MT // 8) accumulators."""
    x_cur = _load_x(xg_addr, xh_addr, 0, U, MT, IS, DX)
    acc = [[Float32(0.0)] * 4 for _ in range(R // 2 * (MT // 8) if SWAP else R)]
    for it in range(NIT):
        if PF > 0 and it + PF < NIT:
            _prefetch_chunks(pf_row, R, lane, it + PF, it + PF + 1, U)
        if it + 1 < NIT:
            w_nxt = _load_w(w_addr, it + 1, U, R, w_step, IS)
            x_nxt = _load_x(xg_addr, xh_addr, it + 1, U, MT, IS, DX)
        for u in range(U):
            xg, xh = x_cur[u]
            if SWAP:
                for j in range(R // 2):
                    a = list(w_cur[u * R + 2 * j]) + list(w_cur[u * R + 2 * j + 1])
                    for grp, xv in enumerate((xg, xh)[:MT // 8]):
                        i = j * (MT // 8) + grp
                        acc[i] = mma_k32(a, xv, acc[i])
                continue
            a = [xg[0], xh[0], xg[1], xh[1], xg[2], xh[2], xg[3], xh[3]]
            for r in range(R):
                acc[r] = mma_k32(a, w_cur[u * R + r], acc[r])
        if hook is not None and it == hook[0]:  # (iteration, addr, nbytes, idx)
            # after this iteration's mma steps: at the top of an iteration or after its loads
            # ptxas took 86-174 registers instead of 76-78 (m_tile 8); at m_tile 16 any place but
            # after the last iteration takes 102-110 (the default caps it with minb 3)
            prefetch_l2_bulk(hook[1], hook[2], hook[3], 1)
        if it + 1 < NIT:
            w_cur = w_nxt
            x_cur = x_nxt
    return acc


def _acc_entries(R: int, MT: int, SWAP: int, g, t):
    """(accumulator, component, n8 tile r, token row m, column c within the tile) of every
    accumulator value of this lane, for both operand roles: x as A (acc[r][2h + e] = token
    g + 8h, column 2t + e) or, with SWAP, the weights as A (acc[j * MT/8 + grp][2h + e] = weight
    row g + 8h of 16-row tile j, i.e. n8 tile 2j + h column g, and token grp * 8 + 2t + e)."""
    out = []
    if SWAP:
        for j in range(R // 2):
            for grp in range(MT // 8):
                for h in range(2):
                    for e in range(2):
                        out.append((j * (MT // 8) + grp, 2 * h + e, 2 * j + h, grp * 8 + 2 * t + e, g))
    else:
        for r in range(R):
            for h in range(MT // 8):
                for e in range(2):
                    out.append((r, 2 * h + e, r, g + 8 * h, 2 * t + e))
    return out


def build_tc(cfg: Config, n: int, k: int):
    MT = cfg.m_tile
    R = cfg.tiles
    WN = cfg.warps_n
    WK = cfg.warps_k
    U = cfg.unroll
    STEPS = k // 32
    JW = STEPS // WK  # 32-wide K steps per warp
    NIT = JW // U
    NTHR = 32 * WN * WK
    ROWS_BLK = 8 * R * WN
    GRID = cfg.grid(n)
    OUT_BLK = WN * R * MT * 8  # outputs per block (incl. padded rows)
    PDL = cfg.pdl
    PF = cfg.pf
    KI = cfg.ki
    WL = cfg.wl
    W_STEP = (64, 512, 1024)[WL]  # bytes between a lane's consecutive 32-wide K steps
    SWAP = cfg.swap
    N = n
    K = k

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        wn = warp % WN
        wk = warp // WN
        n_tile0 = (bid * WN + wn) * (8 * R)

        w_base = mW.iterator.toint()
        # byte address of this lane's first weight vector in each n8 tile
        ks0, IS = _k_steps(wk, WK, U, JW, KI)
        w_addr = _weight_addrs(w_base, n_tile0, g, t, lane, ks0, R, N, K, WL)

        pf_row = _prefetch_rows(w_base, n_tile0, lane, wk * JW * 32, R, N, K)
        if cutlass.const_expr(PF > 0):
            _prefetch_chunks(pf_row, R, lane, 0, min(PF, NIT), U)
        w_cur = _load_w(w_addr, 0, U, R, W_STEP, IS)
        if cutlass.const_expr(PDL):
            pdl_wait(tid)
            # let the next kernel launch now: it prefetches its own weights and then
            # blocks in its griddepcontrol.wait until this grid has finished
            cute.arch.griddepcontrol_launch_dependents()

        m_rows = mX.shape[0]
        sx = mX.stride[0]
        x_base = mX.iterator.toint()
        koff = Int64((ks0 * 32 + t * 8) * 2)
        xg_addr, xh_addr = _x_addrs(x_base, sx, m_rows, g, koff)
        acc = _stream_mma(w_cur, w_addr, W_STEP, xg_addr, xh_addr, pf_row, lane, MT, R, U, NIT, PF, IS,
                          None, 0, SWAP)

        ents = _acc_entries(R, MT, SWAP, g, t)
        if cutlass.const_expr(WK == 1):
            for q in cutlass.range_constexpr(len(ents)):
                ai, ci, r, m, c8 = ents[q]
                col = n_tile0 + r * 8 + c8
                if m < m_rows:
                    if col < N:
                        mO[m, col] = acc[ai][ci].to(BFloat16)
        else:
            smem = _SmemAllocator()
            red = smem.allocate_tensor(Float32, cute.make_layout(WK * OUT_BLK), byte_alignment=16)
            for q in cutlass.range_constexpr(len(ents)):
                ai, ci, r, m, c8 = ents[q]
                red[((wk * WN + wn) * R + r) * (MT * 8) + m * 8 + c8] = acc[ai][ci]
            cute.arch.sync_threads()
            for p in cutlass.range_constexpr((OUT_BLK + NTHR - 1) // NTHR):
                idx = tid + p * NTHR
                if idx < OUT_BLK:
                    s = Float32(0.0)
                    for q in cutlass.range_constexpr(WK):
                        s = s + red[q * OUT_BLK + idx]
                    col8 = idx % 8
                    m = (idx // 8) % MT
                    rr = (idx // (8 * MT)) % R
                    wnn = idx // (8 * MT * R)
                    col = (bid * WN + wnn) * (8 * R) + rr * 8 + col8
                    if m < m_rows:
                        if col < N:
                            mO[m, col] = s.to(BFloat16)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mX, mW, mO).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1), stream=stream,
                                  use_pdl=PDL, **_launch_attrs(cfg))

    _ = ROWS_BLK
    return host


# --------------------------------------------------------------------------------------
# CUDA-core split-N kernel (small N, large K)
# --------------------------------------------------------------------------------------
def build_split_n(cfg: Config, n: int, k: int):
    MT = cfg.m_tile
    RB = cfg.rows
    V = cfg.vec
    NTHR = k // (8 * V)
    NWARP = NTHR // 32
    GRID = cfg.grid(n)
    NACC = MT * RB
    PDL = cfg.pdl
    N = n
    K = k

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        row0 = bid * RB
        w_base = mW.iterator.toint()
        wv = []
        for r in cutlass.range_constexpr(RB):
            row = _imin(row0 + r, N - 1)
            rv = []
            for v in cutlass.range_constexpr(V):
                rv.append(ld_weights_v4(w_base + Int64(row) * (K * 2)
                                        + Int64((tid + v * NTHR) * 16)))
            wv.append(rv)
        if cutlass.const_expr(PDL):
            pdl_wait(tid)
            # let the next kernel launch now: it prefetches its own weights and then
            # blocks in its griddepcontrol.wait until this grid has finished
            cute.arch.griddepcontrol_launch_dependents()

        m_rows = mX.shape[0]
        sx = mX.stride[0]
        x_base = mX.iterator.toint()
        acc = [Float32(0.0)] * NACC
        for m in cutlass.range_constexpr(MT):
            xr = _imin(Int32(m), m_rows - 1)
            xa = x_base + Int64(xr) * Int64(sx) * 2
            for v in cutlass.range_constexpr(V):
                xv = ld_act_v4(xa + Int64((tid + v * NTHR) * 16))
                for r in cutlass.range_constexpr(RB):
                    a = acc[m * RB + r]
                    for q in cutlass.range_constexpr(4):
                        a = dot_bf16x2(wv[r][v][q], xv[q], a)
                    acc[m * RB + r] = a

        smem = _SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(NWARP * NACC), byte_alignment=16)
        for i in cutlass.range_constexpr(NACC):
            s = cute.arch.warp_reduction_sum(acc[i])
            if lane == 0:
                red[warp * NACC + i] = s
        cute.arch.sync_threads()
        for p in cutlass.range_constexpr((NACC + NTHR - 1) // NTHR):
            idx = tid + p * NTHR
            if idx < NACC:
                s = Float32(0.0)
                for w in cutlass.range_constexpr(NWARP):
                    s = s + red[w * NACC + idx]
                m = idx // RB
                col = row0 + idx % RB
                if m < m_rows:
                    if col < N:
                        mO[m, col] = s.to(BFloat16)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, stream):
        kernel(mX, mW, mO).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1), stream=stream,
                                  use_pdl=PDL)

    return host


# --------------------------------------------------------------------------------------
# Fused whole-step kernel: streaming GEMM over the packed weight + the dependent F_B GEMM
# --------------------------------------------------------------------------------------
def build_fused(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int):
    """out[M, n] = x @ w[n, k]^T and g1[M, nb] = out[:, a0:a0+kb] @ w_fb[nb, kb]^T, one grid.

    Blocks 0..P-1 (scheduled first) stream the weight tiles that hold out[:, a0:a0+kb]
    (f_a), then publish them: the block syncs, thread 0 fences and does a release add
    on a global counter. Blocks P..T-1 stream the other tiles. The last C
    blocks (highest blockIdx, so normally scheduled last) prefetch their F_B weights,
    spin (acquire) until the counter reaches P, compute F_B from f_a read through L2,
    and count themselves in; the last arrival resets the counter to 0, so no memset is
    needed between launches or graph replays. No ordering assumption is needed to be
    deadlock-free: producers never wait, and C is far below the resident capacity.
    Knob ``tag`` (the default when f_a is tile-aligned): the producers also store f_a as
    64-bit (bf16x2, epoch + 1) pairs in the workspace and one warp per 8 rows of every
    consumer spins on those pairs themselves, so no fence, no counter round trip and no reload of f_a sit
    between the last producer and F_B (H200 run23/run24: 0.4 us per step at M = 8). The
    epoch is the 64-bit arrival word at workspace byte 8 over EPOCH_SPAN, read after the
    PDL wait; each of the P + C blocks adds its share of EPOCH_SPAN with a fire-and-forget
    red at its end (run32; an atomic whose last arrival bumped an epoch word kept the last
    blocks alive for a round trip), so the next launch tags with the next value and stale
    pairs never match.
    Knob ``ppf``: the producers bulk-prefetch all their weight rows into L2 at launch (H200
    run12/13: 0.2-0.5 us per step faster at M <= 8; a graph-replay timeline shows the
    producers still finish near the end, so F_B stays a 1-2 us tail). ``dbg`` stamps
    %globaltimer per block into the workspace (scripts/fused_timeline.py).
    """
    from .config import fused_grid, fused_tag_offset

    MT = cfg.m_tile
    R = cfg.tiles
    WK = cfg.warps_k
    WN = cfg.warps_n
    NW = WN * WK  # warps per block
    U = cfg.unroll
    RB = cfg.fb_tiles
    STEPS = k // 32
    JW = STEPS // WK
    NIT = JW // U
    NTHR = 32 * NW
    OUT_BLK = WN * R * MT * 8  # outputs per block (incl. padded rows)
    T_ALL, T0, P, C = fused_grid(cfg, n, a0, kb, nb)
    GRID = T_ALL + C
    TOTAL = P + C
    TAG_OFF = fused_tag_offset(cfg, n, a0, kb, nb)  # tagged f_a pairs (TAG), bytes
    NV1 = 4 * (kb // 32)  # f_a words per consumer lane and row
    SB = kb // 32
    FP = cfg.fb_passes
    PDL = cfg.pdl
    PF = cfg.pf
    KI = cfg.ki
    WL = cfg.wl
    W_STEP = (64, 512, 1024)[WL]
    SWAP = cfg.swap
    PPF = cfg.ppf
    TAG = cfg.tag
    DBG = cfg.dbg
    FBPF = cfg.fbpf
    PWU = cfg.pwu or U  # K steps of iteration 0 loaded before the PDL wait
    GST = cfg.gst
    GROW = NW * RB * 4  # gst 2: bf16x2 words per g1 row of a consumer block
    OVERHANG = TAG and (a0 % (8 * R * WN) or kb % (8 * R * WN))
    RP = -(-nb // max(1, P))  # W_FB rows per producer (fbpf)
    N = n
    K = k
    NB = nb
    KB = kb
    A0 = a0

    @cute.kernel
    def kernel(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mWB: cute.Tensor,
               mG: cute.Tensor, mC: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        lane = tid % 32
        warp = tid // 32
        g = lane // 4
        t = lane % 4
        m_rows = mX.shape[0]
        smem = _SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(WK * OUT_BLK), byte_alignment=16)
        if cutlass.const_expr(TAG):  # consumers: the polling warps stage f_a words here
            fs = smem.allocate_tensor(Int32, cute.make_layout(32 * NV1 * (MT // 8)), byte_alignment=16)
        if cutlass.const_expr(GST == 2):  # consumers: the block's g1 tile as bf16x2 words
            gsm = smem.allocate_tensor(Int32, cute.make_layout(MT * GROW), byte_alignment=16)
        ctr = mC.iterator.toint()
        so = mO.stride[0]
        sg = mG.stride[0]
        if cutlass.const_expr(DBG):
            if tid == 0:
                _stamp(ctr, bid, 0)
        sb = bid  # position in the order [producers | other stream tiles | consumers]
        if sb < T_ALL:
            # ---------------- streaming part (producers first) ----------------
            tile = sb
            if sb < P:
                tile = sb + T0
            else:
                if sb - P < T0:
                    tile = sb - P
            wn = warp % WN  # warps side by side along N share their x slices (via L1)
            wk = warp // WN
            blk0 = tile * (8 * R * WN)
            n_tile0 = blk0 + wn * (8 * R)
            w_base = mW.iterator.toint()
            ks0, IS = _k_steps(wk, WK, U, JW, KI)
            w_addr = _weight_addrs(w_base, n_tile0, g, t, lane, ks0, R, N, K, WL)

            pf_row = _prefetch_rows(w_base, n_tile0, lane, wk * JW * 32, R, N, K)
            if cutlass.const_expr(PF > 0):
                _prefetch_chunks(pf_row, R, lane, 0, min(PF, NIT), U)
            if cutlass.const_expr(PPF > 0):
                if sb < P:
                    if cutlass.const_expr(WL == 2):
                        # the warp column's 16-row tiles are one contiguous region: a quarter of
                        # warp wk's WK-th part per lane 0..3
                        part = (R // 2) * (K // 32) * 1024 // WK
                        reg = w_base + Int64(n_tile0 // 16) * ((K // 32) * 1024)
                        prefetch_l2_bulk(reg + Int64(wk * part) + Int64(lane * (part // 4)),
                                         Int32(part // 4), lane, 4)
                    else:
                        _prefetch_chunks(pf_row, R, lane, 0, NIT, U)
            w_cur = _load_w(w_addr, 0, PWU, R, W_STEP, IS)
            if cutlass.const_expr(PDL):
                pdl_wait(tid)
                cute.arch.griddepcontrol_launch_dependents()
            if cutlass.const_expr(PWU < U):  # the rest of iteration 0 after the wait (knob pwu)
                w_cur = w_cur + _load_w(w_addr, 0, U, R, W_STEP, IS, PWU)
            ep = Int32(0)
            if cutlass.const_expr(TAG):
                if sb < P:  # this launch's epoch (earlier launches advanced it)
                    ep = ld_epoch(ctr + Int64(8))

            sx = mX.stride[0]
            x_base = mX.iterator.toint()
            koff = Int64((ks0 * 32 + t * 8) * 2)
            xg_addr, xh_addr = _x_addrs(x_base, sx, m_rows, g, koff)
            hook = None
            if cutlass.const_expr(FBPF > 0):
                # producer sb prefetches W_FB rows [sb * RP, sb * RP + RP), one 256-byte row per
                # thread, after stream iteration NIT - FBPF (1: after the loop; > NIT: before it):
                # the consumer blocks start as the producers retire and need W_FB at once
                fb_idx = Int32(1 << 20)
                if sb < P:
                    if tid < RP:
                        if sb * RP + tid < NB:
                            fb_idx = Int32(0)
                fb_row = _imin(sb * RP + tid, NB - 1)
                hook = (NIT - FBPF, mWB.iterator.toint() + Int64(fb_row) * (KB * 2),
                        Int32(KB * 2), fb_idx)
                if cutlass.const_expr(FBPF > NIT):  # before the loop (it = -1)
                    prefetch_l2_bulk(hook[1], hook[2], hook[3], 1)
            acc = _stream_mma(w_cur, w_addr, W_STEP, xg_addr, xh_addr, pf_row, lane, MT, R, U, NIT, PF, IS,
                              hook, cfg.dx, SWAP)

            ents = _acc_entries(R, MT, SWAP, g, t)
            for q in cutlass.range_constexpr(len(ents)):
                ai, ci, r, m, c8 = ents[q]
                red[((wk * WN + wn) * R + r) * (MT * 8) + m * 8 + c8] = acc[ai][ci]
            cute.arch.sync_threads()
            for p in cutlass.range_constexpr((OUT_BLK + NTHR - 1) // NTHR):
                idx = tid + p * NTHR
                if idx < OUT_BLK:
                    s = Float32(0.0)
                    for q in cutlass.range_constexpr(WK):
                        s = s + red[q * OUT_BLK + idx]
                    col8 = idx % 8
                    m = (idx // 8) % MT
                    rr = idx // (8 * MT)  # n8 tile within the block (wn * R + r)
                    col = blk0 + rr * 8 + col8
                    if m < m_rows:
                        if col < N:
                            mO[m, col] = s.to(BFloat16)
            if sb < P:
                if cutlass.const_expr(DBG):
                    if tid == 0:
                        _stamp(ctr, bid, 1)
                if cutlass.const_expr(TAG):
                    # f_a again as (bf16x2, epoch + 1) pairs: the consumers spin on these
                    for pp in cutlass.range_constexpr((OUT_BLK // 2 + NTHR - 1) // NTHR):
                        pidx = tid + pp * NTHR
                        if pidx < OUT_BLK // 2:
                            i0 = 2 * pidx
                            s0 = Float32(0.0)
                            s1 = Float32(0.0)
                            for q in cutlass.range_constexpr(WK):
                                s0 = s0 + red[q * OUT_BLK + i0]
                                s1 = s1 + red[q * OUT_BLK + i0 + 1]
                            m = (i0 // 8) % MT
                            col = blk0 + (i0 // (8 * MT)) * 8 + i0 % 8
                            if cutlass.const_expr(OVERHANG):
                                # tiles wider than f_a's alignment (e.g. warps_n 3: 48 rows)
                                # also hold columns outside [A0, A0 + KB): not f_a, no pair
                                if col < A0 or col >= A0 + KB:
                                    m = MT
                            if m < m_rows:
                                pa = ctr + Int64(TAG_OFF) + Int64(m * (KB // 2) + (col - A0) // 2) * 8
                                st_tagged(pa, pack_bf16x2(s0, s1), ep + 1)
                    cute.arch.sync_threads()  # every thread's epoch read before the arrival
                    if tid == 0:
                        red_epoch(ctr + Int64(8), sb, TOTAL)
                else:
                    cute.arch.sync_threads()
                    if tid == 0:
                        # the barrier orders the block's f_a stores before this thread's fence
                        # (cumulative), so one fence per block publishes them all (run22:
                        # 0-0.2 us faster than a fence in every thread)
                        fence_acq_rel_gpu()
                        red_add_release_gpu(ctr, Int32(1))
            if cutlass.const_expr(DBG):
                if tid == 0:
                    _stamp(ctr, bid, 2)
        else:
            # ---------------- consumer part: g1 = f_a @ w_fb^T ----------------
            # a warp owns FP passes of RB n8 tiles; pass 0's weights are loaded up front,
            # later passes' rows are bulk-prefetched into L2 up front and loaded after the
            # previous pass (FP > 1 keeps the consumer blocks few, so the grid fits one wave)
            cb = sb - T_ALL
            row0 = (cb * NW + warp) * (8 * RB * FP)
            wb_base = mWB.iterator.toint()

            def load_wb(ps):
                regs = []
                for r in cutlass.range_constexpr(RB):
                    row = _imin(row0 + (ps * RB + r) * 8 + g, NB - 1)
                    ra = wb_base + Int64(row) * (KB * 2) + Int64(t * 16)
                    for sk in cutlass.range_constexpr(SB):
                        regs.append(ld_weights_v4(ra + Int64(sk * 64)))
                return regs

            wv = load_wb(0)
            if cutlass.const_expr(FP > 1):
                r1 = _imin(row0 + 8 * RB, NB - 1)
                nrows = _imin(row0 + 8 * RB * FP, NB) - r1
                if nrows > 0:
                    prefetch_l2_bulk(wb_base + Int64(r1) * (KB * 2), Int32(nrows * (KB * 2)), lane, 1)
            if cutlass.const_expr(PDL):
                pdl_wait(tid)
                cute.arch.griddepcontrol_launch_dependents()
            ep = Int32(0)
            if cutlass.const_expr(TAG):
                # warp h (< m_tile / 8) spins on the tagged f_a pairs of row g + 8h for its
                # lanes (8 columns per 32-wide K step) and stages the values for all warps.
                # Register footprint matters here: with one row per warp the m_tile-8 and -16
                # kernels (t2/wk8) use 78 registers, 3 blocks/SM; a poll per (row, K step)
                # brought them to 64, 4 blocks/SM fit and the step got 4-5 us slower (run26)
                if warp < MT // 8:
                    ep = ld_epoch(ctr + Int64(8))
                    tb = ctr + Int64(TAG_OFF) + Int64(t * 32)
                    row = _imin(g + 8 * warp, m_rows - 1)
                    vals = poll_tagged(tb + Int64(row) * (KB * 4), ep + 1, SB)
                    for j in cutlass.range_constexpr(NV1):
                        fs[(warp * 32 + lane) * NV1 + j] = vals[j]
                    if cutlass.const_expr(DBG == 4 and MT == 16):  # mid: the second poller done
                        if warp == 1:
                            if lane == 0:
                                _stamp(ctr, bid, 1, Float32(vals[0]))
            else:
                if tid == 0:
                    wait_then_arrive(ctr, Int32(P), Int32(TOTAL))
            cute.arch.sync_threads()
            if cutlass.const_expr(DBG == 1):
                if tid == 0:
                    _stamp(ctr, bid, 1)
            if cutlass.const_expr(DBG == 5):  # mid: after the barrier, waiting for a shared load
                if tid == 0:
                    _stamp(ctr, bid, 1, Float32(fs[NV1 * 32]))
            o_base = mO.iterator.toint() + Int64(A0 * 2) + Int64(t * 16)
            fg = o_base + Int64(_imin(g, m_rows - 1)) * Int64(so) * 2
            fh = o_base + Int64(_imin(g + 8, m_rows - 1)) * Int64(so) * 2
            afr = []
            for sk in cutlass.range_constexpr(SB):
                if cutlass.const_expr(TAG):
                    xg = [fs[lane * NV1 + sk * 4 + j] for j in range(4)]
                    if cutlass.const_expr(MT == 16):
                        xh = [fs[(32 + lane) * NV1 + sk * 4 + j] for j in range(4)]
                    else:
                        xh = [Int32(0)] * 4
                else:
                    xg = ld_l2_v4(fg + Int64(sk * 64))
                    if cutlass.const_expr(MT == 16):
                        xh = ld_l2_v4(fh + Int64(sk * 64))
                    else:
                        xh = [Int32(0)] * 4
                afr.append([xg[0], xh[0], xg[1], xh[1], xg[2], xh[2], xg[3], xh[3]])
            for ps in cutlass.range_constexpr(FP):
                if cutlass.const_expr(ps > 0):
                    wv = load_wb(ps)
                acc = [[Float32(0.0)] * 4 for _ in range(RB)]
                for sk in cutlass.range_constexpr(SB):
                    for r in cutlass.range_constexpr(RB):
                        acc[r] = mma_k32(afr[sk], wv[r * SB + sk], acc[r])
                if cutlass.const_expr(DBG == 2 and ps == FP - 1):  # consumer "mid": after the last mma
                    if tid == 0:
                        _stamp(ctr, bid, 1, acc[0][0])
                for r in cutlass.range_constexpr(RB):
                    for h in cutlass.range_constexpr(MT // 8):
                        m = g + 8 * h
                        if cutlass.const_expr(GST == 2):  # staged: 16-byte stores below
                            gsm[m * GROW + (warp * RB + r) * 4 + t] = pack_bf16x2(acc[r][2 * h], acc[r][2 * h + 1])
                        elif cutlass.const_expr(GST == 1):
                            # columns 2t, 2t + 1 as one 32-bit store (NB even: both or none)
                            col = row0 + (ps * RB + r) * 8 + 2 * t
                            if m < m_rows:
                                if col < NB:
                                    ga = mG.iterator.toint() + (Int64(m) * Int64(sg) + Int64(col)) * 2
                                    st_global_words(ga, [pack_bf16x2(acc[r][2 * h], acc[r][2 * h + 1])])
                        else:
                            for e in cutlass.range_constexpr(2):
                                col = row0 + (ps * RB + r) * 8 + 2 * t + e
                                if m < m_rows:
                                    if col < NB:
                                        mG[m, col] = acc[r][2 * h + e].to(BFloat16)
            if cutlass.const_expr(GST == 2):
                # the block's g1 tile (MT rows x NW * RB * 8 contiguous columns, one pass) leaves
                # as 16-byte row chunks: one store per thread instead of 8 (4 with GST 1)
                cute.arch.sync_threads()
                for p in cutlass.range_constexpr((MT * GROW // 4 + NTHR - 1) // NTHR):
                    ch = tid + p * NTHR
                    if ch < MT * GROW // 4:
                        gm = ch // (GROW // 4)
                        gcol = cb * (NW * RB * 8) + (ch % (GROW // 4)) * 8
                        if gm < m_rows:
                            if gcol < NB:
                                gaddr = mG.iterator.toint() + (Int64(gm) * Int64(sg) + Int64(gcol)) * 2
                                st_global_words(gaddr, [gsm[ch * 4 + j] for j in range(4)])
            if cutlass.const_expr(DBG == 3):  # consumer "mid": after the g1 stores are issued
                if tid == 0:
                    _stamp(ctr, bid, 1)
            if cutlass.const_expr(TAG):
                if tid == 0:  # the epoch matters to the next launch only
                    red_epoch(ctr + Int64(8), Int32(P) + cb, TOTAL)
            if cutlass.const_expr(DBG):
                if tid == 0:
                    _stamp(ctr, bid, 2)

    @cute.jit
    def host(mX: cute.Tensor, mW: cute.Tensor, mO: cute.Tensor, mWB: cute.Tensor,
             mG: cute.Tensor, mC: cute.Tensor, stream):
        kernel(mX, mW, mO, mWB, mG, mC).launch(grid=(GRID, 1, 1), block=(NTHR, 1, 1),
                                               stream=stream, use_pdl=PDL, **_launch_attrs(cfg))

    return host


def fake_args_fused(n: int, k: int, nb: int, kb: int):
    m = cute.sym_int()
    sx = cute.sym_int64(divisibility=8)
    so = cute.sym_int64(divisibility=8)
    sg = cute.sym_int64()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, k), stride=(sx, 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(BFloat16, (n, k), stride=(k, 1), assumed_align=16)
    o = cute.runtime.make_fake_tensor(BFloat16, (m, n), stride=(so, 1), assumed_align=16)
    wb = cute.runtime.make_fake_tensor(BFloat16, (nb, kb), stride=(kb, 1), assumed_align=16)
    g1 = cute.runtime.make_fake_tensor(BFloat16, (m, nb), stride=(sg, 1), assumed_align=2)
    c = cute.runtime.make_fake_tensor(Int32, (1,), stride=(1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, w, o, wb, g1, c, stream


def compile_fused_tvm_ffi(cfg: Config, n: int, k: int, a0: int, nb: int, kb: int,
                          extra_options: str = ""):
    host = build_fused(cfg, n, k, a0, nb, kb)
    args = fake_args_fused(n, k, nb, kb)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, *args, options=opts)


def build_host(cfg: Config, n: int, k: int):
    if cfg.kind == "split_n":
        return build_split_n(cfg, n, k)
    return build_tc(cfg, n, k)


def fake_args(n: int, k: int):
    """Fake tensors/stream for TVM-FFI compilation: M and the row strides are runtime."""
    m = cute.sym_int()
    sx = cute.sym_int64(divisibility=8)
    so = cute.sym_int64()
    x = cute.runtime.make_fake_tensor(BFloat16, (m, k), stride=(sx, 1), assumed_align=16)
    w = cute.runtime.make_fake_tensor(BFloat16, (n, k), stride=(k, 1), assumed_align=16)
    o = cute.runtime.make_fake_tensor(BFloat16, (m, n), stride=(so, 1), assumed_align=2)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return x, w, o, stream


def compile_tvm_ffi(cfg: Config, n: int, k: int, extra_options: str = ""):
    host = build_host(cfg, n, k)
    x, w, o, stream = fake_args(n, k)
    opts = "--enable-tvm-ffi" + (" " + extra_options if extra_options else "")
    return cute.compile(host, x, w, o, stream, options=opts)


_ = ir
