"""Whether two tensors share memory: the out= check of a call (executors.custom_op.check_out).

Exact for views that are boxes of one strided lattice (column slices of one packed buffer,
rows of one batch, ...): the elements of each are decomposed level by level along the strides
of both. Anything else that shares a byte range counts as overlapping.
"""

from __future__ import annotations

import torch

__all__ = ["overlaps", "storage_key", "unshared"]


def storage_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr())


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    es = t.element_size()
    start = t.storage_offset() * es
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * es


def _boxes_meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b (same storage and dtype) have an element in common; True where undecided."""
    strides = sorted({s for n, s in zip(a.shape, a.stride(), strict=True) if n > 1}
                     | {s for n, s in zip(b.shape, b.stride(), strict=True) if n > 1}, reverse=True)
    if not strides or strides[-1] < 1:
        return True
    boxes = []
    for t in (a, b):
        size = dict.fromkeys(strides, 1)
        for n, s in zip(t.shape, t.stride(), strict=True):
            if n > 1:
                if size[s] != 1:
                    return True  # two axes of one stride: a self-overlapping view
                size[s] = n
        o = t.storage_offset()
        box, outer = [], None
        for s in strides:
            if outer is not None and outer % s:
                return True
            coord = o // s if outer is None else (o % outer) // s
            if outer is not None and coord + size[s] > outer // s:
                return True  # the axis wraps into the next level
            box.append((coord, coord + size[s]))
            outer = s
        box.append((o % strides[-1], o % strides[-1] + 1))
        boxes.append(box)
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(*boxes, strict=True))


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b share at least one element of memory (conservative where the layouts are irregular)."""
    if a.numel() == 0 or b.numel() == 0 or storage_key(a) != storage_key(b):
        return False
    (s1, e1), (s2, e2) = _byte_span(a), _byte_span(b)
    if e1 <= s2 or e2 <= s1:
        return False
    if a.element_size() != b.element_size():
        return True
    return _boxes_meet(a, b)


def unshared(results, ins):
    """results (a tensor or a list) with each one that shares memory with an input or an earlier
    result copied: for ops that hand back their input at some sizes (a shard without padding, a
    collective over one rank, model code) whose result a later op overwrites in place."""
    many = isinstance(results, (list, tuple))
    seen = [x for x in ins if isinstance(x, torch.Tensor) and x.numel()]
    out = []
    for r in (results if many else [results]):
        if isinstance(r, torch.Tensor) and r.numel():
            if any(overlaps(r, x) for x in seen):
                r = r.clone()
            seen.append(r)
        out.append(r)
    return out if many else out[0]
