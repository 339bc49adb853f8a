"""Parameter-to-PS assignment: chunking, best-fit balancing, minimal-movement rebalancing.

Pure functions over plain lists; no sockets, no MXNet.

Parameters are split once, at job start, into *chunks* of at most
``chunk_elems`` elements (an array larger than that is split into nearly equal
contiguous pieces). An assignment maps every chunk to a PS id. Balance means
``max(load) - min(load) <= max(chunk size)`` over the PS, loads in bytes; any
list-scheduling assignment achieves it, which is why it is the invariant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from elastic_mxnet.protocol.messages import ChunkSpec

UNASSIGNED = -1


def make_layout(shapes: Sequence[Sequence[int]], chunk_elems: int) -> list[ChunkSpec]:
    """Chunks of the parameters (by order) of at most ``chunk_elems`` elements each.

    A parameter of ``n`` elements becomes ``ceil(n / chunk_elems)`` contiguous
    pieces of sizes differing by at most one. Zero-size parameters get no chunk.
    """
    if chunk_elems < 1:
        raise ValueError("chunk_elems must be >= 1")
    layout: list[ChunkSpec] = []
    for index, shape in enumerate(shapes):
        n = 1
        for d in shape:
            n *= int(d)
        pieces = -(-n // chunk_elems)
        for k in range(pieces):
            start, stop = n * k // pieces, n * (k + 1) // pieces
            layout.append(ChunkSpec(cid=len(layout), param=index, start=start, stop=stop))
    return layout


def loads(sizes: Sequence[int], owners: Sequence[int], ps: Sequence[int]) -> dict[int, int]:
    """Bytes held by each PS in ``ps`` (chunks owned by others are ignored)."""
    out = dict.fromkeys(ps, 0)
    for size, owner in zip(sizes, owners, strict=True):
        if owner in out:
            out[owner] += size
    return out


def moved_bytes(sizes: Sequence[int], old: Sequence[int], new: Sequence[int]) -> int:
    """Bytes of the chunks whose owner differs between ``old`` and ``new``."""
    return sum(s for s, a, b in zip(sizes, old, new, strict=True) if a != b)


def best_fit(sizes: Sequence[int], ps: Sequence[int]) -> list[int]:
    """Initial assignment: largest chunk first onto the least-loaded PS (ties: lowest id)."""
    return rebalance(sizes, [UNASSIGNED] * len(sizes), ps)


def rebalance(sizes: Sequence[int], owners: Sequence[int], ps: Sequence[int]) -> list[int]:
    """The balanced assignment over ``ps`` closest to ``owners``.

    1. Chunks of PS not in ``ps`` (removed or dead) go to a pool.
    2. Each PS above the fair share ``sum(sizes) / len(ps)`` sheds its largest
       chunks that keep it at or above the fair share into the pool.
    3. The pool goes largest first onto the least-loaded PS.
    4. While ``max - min`` exceeds the largest chunk, the chunk of the fullest
       PS whose size is closest to half the gap moves to the emptiest one
       (each move lowers the sum of squared loads, so this ends).

    An assignment that is already balanced over ``ps`` is returned as is.
    The result is always balanced; in exhaustive checks on small instances it
    moves at most one largest chunk more than the optimum (see the tests).

    Args:
        sizes: bytes of each chunk.
        owners: current owner PS id per chunk (``UNASSIGNED`` for none).
        ps: the new set of PS ids (non-empty).

    Returns:
        New owner PS id per chunk.
    """
    members = sorted(set(ps))
    if not members:
        raise ValueError("at least one PS is needed")
    if is_balanced(sizes, owners, members):
        return list(owners)
    new = list(owners)
    load = dict.fromkeys(members, 0)
    held: dict[int, list[int]] = {p: [] for p in members}
    pool: list[int] = []
    for cid, owner in enumerate(owners):
        if owner in load:
            load[owner] += sizes[cid]
            held[owner].append(cid)
        else:
            pool.append(cid)
    fair = sum(sizes) / len(members)
    for p in members:
        for cid in sorted(held[p], key=lambda c: (-sizes[c], c)):
            if load[p] - sizes[cid] >= fair:
                load[p] -= sizes[cid]
                held[p].remove(cid)
                pool.append(cid)
    for cid in sorted(pool, key=lambda c: (-sizes[c], c)):
        p = min(members, key=lambda q: (load[q], q))
        new[cid] = p
        load[p] += sizes[cid]
        held[p].append(cid)
    _fix_up(sizes, new, load, held)
    return new


def _fix_up(
    sizes: Sequence[int], new: list[int], load: dict[int, int], held: dict[int, list[int]]
) -> None:
    """Move chunks from the fullest to the emptiest PS until balanced (in place)."""
    largest = max(sizes, default=0)
    while True:
        hi = max(load, key=lambda q: (load[q], -q))
        lo = min(load, key=lambda q: (load[q], q))
        gap = load[hi] - load[lo]
        if gap <= largest:
            return
        movable = [c for c in held[hi] if 0 < sizes[c] < gap]
        if not movable:  # unreachable: every chunk is smaller than the gap here
            return
        cid = min(movable, key=lambda c: (abs(2 * sizes[c] - gap), c))
        held[hi].remove(cid)
        held[lo].append(cid)
        load[hi] -= sizes[cid]
        load[lo] += sizes[cid]
        new[cid] = lo


def is_balanced(sizes: Sequence[int], owners: Sequence[int], ps: Sequence[int]) -> bool:
    """Whether every chunk is on a PS of ``ps`` and ``max - min <= largest chunk``."""
    members = set(ps)
    if not members or any(o not in members for o in owners):
        return False
    held = loads(sizes, owners, ps)
    return max(held.values()) - min(held.values()) <= max(sizes, default=0)


def owned_by(owners: Sequence[int], ps_id: int) -> list[int]:
    """Chunk ids owned by ``ps_id``, ascending."""
    return [cid for cid, o in enumerate(owners) if o == ps_id]


def chunk_sizes_bytes(layout: Sequence[ChunkSpec], itemsize: int = 4) -> list[int]:
    """Bytes of every chunk of ``layout`` (float32 by default)."""
    return [c.size * itemsize for c in layout]


def substitute(owners: Sequence[int], mapping: Mapping[int, int]) -> list[int]:
    """``owners`` with PS ids replaced per ``mapping`` (a dead PS -> its replacement)."""
    return [mapping.get(o, o) for o in owners]
