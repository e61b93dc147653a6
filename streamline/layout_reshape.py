"""Reshapes of permuted tensors: when a Reshape can act on the NHWC representation directly, and which Transpose
makes it possible when it cannot (for :class:`streamline.layout_walk.LayoutWalk`).

A Reshape from shape ``s`` to ``s'`` splits and merges *groups* of axes: consecutive axes of ``s`` whose sizes
multiply to those of consecutive axes of ``s'`` (axes of size 1 belong to no group: they can sit anywhere). If the
tensor ``t`` is held as ``u = t.transpose(p)`` and every group's axes are adjacent and in order in ``u``, the same
splits and merges act on ``u``: ``u.reshape(...)`` holds ``t.reshape(s')`` transposed by the permutation that lists
the groups' output axes in ``u``'s order (:func:`reshape_in_place`). Otherwise one Transpose of ``u`` puts the
groups in order first (:func:`reshape_target`); the walk picks the order that leaves the result in the layout it
wants (NHWC for a 4-D NCHW tensor, the original layout at a graph output). DepthToSpace, SpaceToDepth and channel
shuffles are such Reshape–Transpose–Reshape chains (:mod:`streamline.lower_space`).
"""

from __future__ import annotations

from typing import Sequence

Perm = tuple[int, ...]


def reshape_groups(s_in: Sequence[int], s_out: Sequence[int]) -> list[tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """The groups ``(input axes, output axes)`` of a reshape from ``s_in`` to ``s_out`` (module docstring), axes of
    size 1 left out; None if the sizes do not match."""
    ins = [a for a, d in enumerate(s_in) if d != 1]
    outs = [b for b, d in enumerate(s_out) if d != 1]
    groups: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    i = j = 0
    while i < len(ins) or j < len(outs):
        if i >= len(ins) or j >= len(outs):
            return None
        gi, go = [ins[i]], [outs[j]]
        pi, po = s_in[ins[i]], s_out[outs[j]]
        i, j = i + 1, j + 1
        while pi != po:
            if pi < po:
                if i >= len(ins):
                    return None
                gi.append(ins[i])
                pi *= s_in[ins[i]]
                i += 1
            else:
                if j >= len(outs):
                    return None
                go.append(outs[j])
                po *= s_out[outs[j]]
                j += 1
        groups.append((tuple(gi), tuple(go)))
    return groups


def _place_free(order: list[int], s_out: Sequence[int], preferred: Perm | None) -> Perm:
    """A full output permutation from the physical order of the non-unit output axes, with the axes of size 1
    placed as in ``preferred`` when that keeps the order (else each right after its logical predecessor)."""
    free = [b for b, d in enumerate(s_out) if d == 1]
    if preferred is not None and len(preferred) == len(s_out):
        if [b for b in preferred if b not in free] == order:
            return tuple(preferred)
    result = list(order)
    for b in free:
        pos = 0
        if b > 0 and (b - 1) in result:
            pos = result.index(b - 1) + 1
        result.insert(pos, b)
    return tuple(result)


def reshape_in_place(perm: Sequence[int], s_in: Sequence[int], s_out: Sequence[int],
                     preferred: Perm | None = None) -> Perm | None:
    """The permutation ``q`` with ``u.reshape([s_out[b] for b in q]) = t.reshape(s_out).transpose(q)`` for
    ``u = t.transpose(perm)``, if the reshape can act on ``u`` directly (every group's axes adjacent and in order
    in ``u``, axes of size 1 anywhere); None otherwise. ``preferred``: where to put the output's axes of size 1."""
    groups = reshape_groups(s_in, s_out)
    if groups is None:
        return None
    group_of = {a: k for k, (gi, _) in enumerate(groups) for a in gi}
    physical = [a for a in perm if s_in[a] != 1]
    order: list[int] = []
    pos = 0
    while pos < len(physical):
        gi, go = groups[group_of[physical[pos]]]
        if tuple(physical[pos:pos + len(gi)]) != gi:
            return None
        order.extend(go)
        pos += len(gi)
    return _place_free(order, s_out, preferred)


def reshape_target(s_in: Sequence[int], s_out: Sequence[int], desired: Perm) -> tuple[Perm, Perm]:
    """``(target, q)``: transposing ``t`` by ``target`` lets the reshape act on it in place, giving
    ``t.reshape(s_out).transpose(q)``, with ``q`` the ``desired`` output permutation when its groups' axes are
    adjacent and in order, else the identity."""
    groups = reshape_groups(s_in, s_out)
    assert groups is not None, "the sizes of a reshape match"
    free_out = [b for b, d in enumerate(s_out) if d == 1]
    for q in (tuple(desired), tuple(range(len(s_out)))):
        order = [b for b in q if b not in free_out]
        seq: list[int] = []
        pos, ok = 0, True
        by_first = {go[0]: (gi, go) for gi, go in groups}
        while pos < len(order):
            found = by_first.get(order[pos])
            if found is None or tuple(order[pos:pos + len(found[1])]) != found[1]:
                ok = False
                break
            seq.extend(found[0])
            pos += len(found[1])
        if ok:
            target = list(seq)
            for a in (a for a, d in enumerate(s_in) if d == 1):  # each axis of size 1 after its predecessor
                target.insert(target.index(a - 1) + 1 if a > 0 and (a - 1) in target else 0, a)
            return tuple(target), q
    raise AssertionError("the identity order always fits")
