"""Inline-PTX operations of the CuTe DSL kernels (imports cutlass: load lazily, see __init__.py):
vector loads with cache hints, L2 bulk prefetch, bulk copies into shared memory on mbarriers, the
PDL wait, the release/acquire and tagged
handoffs of the fused step kernel, mma.sync steps and the stamps of its timeline switch."""

from __future__ import annotations

from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .config import EPOCH_SPAN, epoch_shares


# --------------------------------------------------------------------------------------
# PTX helpers
# --------------------------------------------------------------------------------------
def _ld_v4(instr: str, addr, loc, ip, shared: bool = False):
    """One 128-bit load `instr` (e.g. ld.global.v4.u32) as four i32 values; `shared`: addr is a
    32-bit shared-memory address, else a 64-bit global one."""
    res = llvm.inline_asm(
        llvm.StructType.get_literal([T.i32()] * 4),
        [(Int32(addr) if shared else Int64(addr)).ir_value(loc=loc, ip=ip)],
        instr + " {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r," + ("r" if shared else "l"),
        has_side_effects=True,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(4)]


def _asm(text: str, cons: str, args):
    """An inline-PTX statement without results, kept in program order (side effects)."""
    llvm.inline_asm(None, args, text, cons, has_side_effects=True, is_align_stack=False,
                    asm_dialect=llvm.AsmDialect.AD_ATT)


def _below(idx: str, limit: int, instr: str) -> str:
    """A PTX block that runs `instr` only where the u32 operand `idx` (e.g. $2) < limit."""
    return "{\n\t.reg .pred p;\n\t" f"setp.lt.u32 p, {idx}, {int(limit)};\n\t@p {instr}\n\t}}"


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
    _asm(_below("$2", limit, "cp.async.bulk.prefetch.L2.global [$0], $1;"), "l,r,r",
         [Int64(addr).ir_value(loc=loc, ip=ip), Int32(nbytes).ir_value(loc=loc, ip=ip),
          Int32(idx).ir_value(loc=loc, ip=ip)])


# --------------------------------------------------------------------------------------
# bulk copies (the TMA unit) into shared memory, completed on mbarriers
# --------------------------------------------------------------------------------------
@dsl_user_op
def mbar_init(bar: Int32, count: int, idx: Int32, limit: int, *, loc=None, ip=None):
    """If idx < limit: initialise the 8-byte mbarrier at shared address `bar` for `count`
    arrivals per phase."""
    _asm(_below("$1", limit, f"mbarrier.init.shared::cta.b64 [$0], {int(count)};"),
         "r,r", [Int32(bar).ir_value(loc=loc, ip=ip), Int32(idx).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def mbar_init_fence(*, loc=None, ip=None):
    """Make initialised mbarriers visible to the bulk-copy (async) proxy before its first use."""
    _asm("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;", "", [])


@dsl_user_op
def mbar_expect_tx(bar: Int32, nbytes: int, idx: Int32, limit: int, *, loc=None, ip=None):
    """If idx < limit: arrive on `bar` and raise its transaction count by `nbytes` (the bytes
    of the bulk copies that complete this phase)."""
    _asm(_below("$1", limit, f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {int(nbytes)};"),
         "r,r", [Int32(bar).ir_value(loc=loc, ip=ip), Int32(idx).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def bulk_g2s(dst: Int32, src: Int64, nbytes: int, bar: Int32, idx: Int32, limit: int, *,
             loc=None, ip=None):
    """If idx < limit: one bulk copy of `nbytes` (multiple of 16; both addresses 16-byte
    aligned) global -> shared, whose bytes complete on mbarrier `bar`."""
    _asm(_below("$3", limit, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                f"[$0], [$1], {int(nbytes)}, [$2];"),
         "r,l,r,r", [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
                     Int32(bar).ir_value(loc=loc, ip=ip), Int32(idx).ir_value(loc=loc, ip=ip)])


_MBAR_WAITS = [0]  # unique PTX labels per mbar_wait instance


@dsl_user_op
def mbar_wait(bar: Int32, parity: int, *, loc=None, ip=None):
    """Spin until the phase of `bar` with this parity has completed (its copies have landed)."""
    _MBAR_WAITS[0] += 1
    lab = f"MBARWAIT{_MBAR_WAITS[0]}"
    _asm("{\n\t.reg .pred p;\n\t" f"{lab}:\n\t"
         f"mbarrier.try_wait.parity.shared::cta.b64 p, [$0], {int(parity) & 1};\n\t"
         f"@!p bra {lab};\n\t}}", "r", [Int32(bar).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def ld_shared_v4(smem: Int32, *, loc=None, ip=None):
    """One 128-bit shared-memory load as four i32 values."""
    return _ld_v4("ld.shared.v4.u32", smem, loc, ip, shared=True)


@dsl_user_op
def sync_warp(*, loc=None, ip=None):
    _asm("bar.warp.sync 0xffffffff;", "", [])


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
    _asm("{\n\t.reg .pred p;\n\t.reg .u32 i, n;\n\tshr.u32 n, $0, 31;\n\t"
         f"add.u32 n, n, 1;\n\tmov.u32 i, 0;\n\t{lab}:\n\tgriddepcontrol.wait;\n\t"
         f"add.u32 i, i, 1;\n\tsetp.lt.u32 p, i, n;\n\t@p bra {lab};\n\t}}",
         "r", [Int32(tid).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None):
    _asm("fence.acq_rel.gpu;", "", [])


@dsl_user_op
def red_add_release_gpu(addr: Int64, val: Int32, *, loc=None, ip=None):
    """Release-ordered atomic add at GPU scope (publishes this block's earlier writes)."""
    _asm("red.release.gpu.global.add.u32 [$0], $1;", "l,r", [Int64(addr).ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip)])


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
    _asm("{\n\t.reg .u32 v, o, tm1;\n\t.reg .pred p;\n\t"
         "SPIN:\n\t"
         "ld.acquire.gpu.global.u32 v, [$0];\n\t"
         "setp.lt.u32 p, v, $1;\n\t"
         "@!p bra DONE;\n\t"
         "nanosleep.u32 64;\n\t"
         "bra SPIN;\n\t"
         "DONE:\n\t" + _arrive_ptx("$2") + "}",
         "l,r,r", [Int64(addr).ir_value(loc=loc, ip=ip), Int32(target).ir_value(loc=loc, ip=ip),
                   Int32(total).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def pack_bf16x2(lo: Float32, hi: Float32, *, loc=None, ip=None):
    """Round two fp32 values to bf16 and pack them (lo in the low half), as mma operands want."""
    return Int32(llvm.inline_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
                                 "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False,
                                 is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_tagged(addr: Int64, val: Int32, tag: Int32, *, loc=None, ip=None):
    """One single-copy-atomic 64-bit store of (val, tag): a reader that sees the tag sees val."""
    _asm("{\n\t.reg .b64 d;\n\tmov.b64 d, {$1, $2};\n\tst.relaxed.gpu.global.b64 [$0], d;\n\t}",
         "l,r,r", [Int64(addr).ir_value(loc=loc, ip=ip), Int32(val).ir_value(loc=loc, ip=ip),
                   Int32(tag).ir_value(loc=loc, ip=ip)])


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
    """tagged_handoff: this launch's epoch, the 64-bit arrival word / EPOCH_SPAN. Every launch adds
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
    """tagged_handoff: arrival `idx` of `total` adds its share of EPOCH_SPAN to the arrival word,
    fire and forget: no atomic round trip before the last blocks of the step can retire."""
    base, rem = epoch_shares(total)
    _asm("{\n\t.reg .u32 w;\n\t.reg .u64 w64;\n\t.reg .pred p;\n\t"
         f"setp.lt.u32 p, $1, {rem};\n\tselp.u32 w, {base + 1}, {base}, p;\n\t"
         "cvt.u64.u32 w64, w;\n\tred.relaxed.gpu.global.add.u64 [$0], w64;\n\t}",
         "l,r", [Int64(addr).ir_value(loc=loc, ip=ip), Int32(idx).ir_value(loc=loc, ip=ip)])


@dsl_user_op
def st_global_words(addr: Int64, vals, *, loc=None, ip=None):
    """One plain global store of 1 or 4 32-bit words (e.g. bf16 pairs from pack_bf16x2);
    addr aligned to their total size."""
    n = len(vals)
    body = {1: "st.global.b32 [$0], $1;", 4: "st.global.v4.b32 [$0], {$1, $2, $3, $4};"}[n]
    _asm(body, "l" + ",r" * n,
         [Int64(addr).ir_value(loc=loc, ip=ip)] + [Int32(v).ir_value(loc=loc, ip=ip) for v in vals])


@dsl_user_op
def globaltimer(*, loc=None, ip=None):
    """%globaltimer (ns, comparable across SMs)."""
    return Int64(llvm.inline_asm(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def smid(*, loc=None, ip=None):
    return Int32(llvm.inline_asm(T.i32(), [], "mov.u32 $0, %smid;", "=r",
                                 has_side_effects=True, is_align_stack=False,
                                 asm_dialect=llvm.AsmDialect.AD_ATT))


@dsl_user_op
def st_u64(addr: Int64, val: Int64, *, loc=None, ip=None):
    _asm("st.global.u64 [$0], $1;", "l,l", [Int64(addr).ir_value(loc=loc, ip=ip), Int64(val).ir_value(loc=loc, ip=ip)])


def stamp_record(rec, slot: int, sm_slot: int):
    """A timeline stamp (call from one thread): %globaltimer into 8-byte slot `slot` of the
    record at rec; with slot 0 also the SM id into slot `sm_slot`."""
    st_u64(rec + Int64(slot * 8), globaltimer())
    if slot == 0:  # Python-level: traced once
        st_u64(rec + Int64(sm_slot * 8), Int64(smid()))


def _stamp(base, bid, slot: int):
    """Config.timeline (call from one thread): %globaltimer into record bid, slot (0 start,
    1 mid, 2 end; slot 3 = SM id). Records are 32 bytes from workspace byte 16."""
    stamp_record(base + Int64(16) + Int64(bid) * 32, slot, 3)


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
