""":func:`dl2ray.cluster.optimus_layout` compiled, for decisions that place their tasks in compiled code.

The Optimus placement principle lays every job of an allocation out again over the fewest nodes, its
workers and PS split evenly over them (largest jobs first; for k = 1, 2, … the k groups go, largest
first, each to the fitting node with the most room for worker + PS pairs, ties to the lowest index).
:func:`optimus_layout_compiled` makes the same choices with the same float operations, without a scan
of every node per group:

- a k whose largest group exceeds every node's free amount of some resource fails at its first group,
  so it is skipped without a search;
- the k groups have at most three distinct demands; one search per demand finds its k best fitting
  nodes, and each group takes the first of its demand's list not taken by an earlier group — the node
  the reference's scan finds, since fewer than k nodes are taken before any group;
- a search goes through the nodes' *states* (nodes of equal free capacity, with their members as bits):
  the fitting states by room, and within one room the lowest indices of every state of that room. While
  a slot has more than :data:`_STATES` distinct free capacities, the search scans the nodes instead.

``tests/policy/test_shape_fused.py`` compares it with :func:`dl2ray.cluster.optimus_layout` on random
clusters, through states and by scanning.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import Dict

_EPS = 1e-9  # as dl2ray.cluster
_KEY = types.UniTuple(types.float64, 3)


@njit(cache=True)
def optimus_layout_compiled(free, dem, wkey, pkey, tasks, seq, nodes_out):
    """dl2ray.cluster.optimus_layout of the grouped jobs from the slot's free capacity ``free`` (consumed):
    largest jobs first (ties in allocation order), each over the fewest nodes; ``nodes_out`` rewritten only
    if every job could be laid out. The nodes are searched through :func:`_buckets` (nodes of equal free
    capacity together) while there are at most :data:`_STATES` distinct ones, else one by one."""
    m = seq[-1]
    sizes = np.empty(m, dtype=np.int64)
    start = np.empty(m, dtype=np.int64)
    at = 0
    for i in range(m):
        g = seq[i]
        sizes[i] = -(tasks[g, 0] + tasks[g, 1])
        start[i] = at
        at += -sizes[i]
    out = nodes_out.copy()
    taken = np.zeros(free.shape[0], dtype=np.bool_)  # kept all False between jobs
    room = np.empty(free.shape[0])
    b = _buckets(free)
    for i in np.argsort(sizes, kind="mergesort"):
        g = seq[i]
        w, p, wd, pd = tasks[g, 0], tasks[g, 1], dem[wkey[g]], dem[pkey[g]]
        dst = out[start[i]:start[i] - sizes[i]]
        if not _lay_out_job(b, b[7][0] == 0, free, w, p, wd, pd, taken, room, dst):
            return
    nodes_out[:] = out


_STATES = 256
"""Most distinct free capacities the bucketed Optimus layout tracks (then it scans the nodes)."""


@njit(cache=True)
def _buckets(free):
    """The nodes grouped by their free capacity: ``(state of each node (N,), each state's free (S, 3),
    member count (S,), member bits (S, words), the states' index, [states used], [ids to reuse, count],
    [overflowed])``."""
    num = free.shape[0]
    words = (num + 63) // 64
    index = Dict.empty(key_type=_KEY, value_type=types.int64)
    b = (np.empty(num, dtype=np.int64), np.empty((_STATES, 3)), np.zeros(_STATES, dtype=np.int64),
         np.zeros((_STATES, words), dtype=np.uint64), index, np.zeros(1, dtype=np.int64),
         np.zeros(_STATES + 1, dtype=np.int64), np.zeros(1, dtype=np.int64))
    for n in range(num):
        if n > 0 and free[n, 0] == free[n - 1, 0] and free[n, 1] == free[n - 1, 1] \
                and free[n, 2] == free[n - 1, 2]:
            _bucket_add(b, n, b[0][n - 1])  # a run of equal nodes: no lookup
            continue
        _bucket_join(b, n, free[n, 0], free[n, 1], free[n, 2])
        if b[7][0]:
            break
    return b


@njit(cache=True)
def _bucket_join(b, n, f0, f1, f2):
    """Node ``n`` joins the state of free capacity ``(f0, f1, f2)`` (made if new; overflow flagged)."""
    st_free, index, used, spare, over = b[1], b[4], b[5], b[6], b[7]
    key = (f0, f1, f2)
    s = index[key] if key in index else -1  # noqa: SIM401 (numba types dict.get as Optional)
    if s < 0:
        if spare[-1] > 0:
            spare[-1] -= 1
            s = spare[spare[-1]]
        elif used[0] < _STATES:
            s = used[0]
            used[0] += 1
        else:
            over[0] = 1
            return
        index[key] = s
        st_free[s, 0], st_free[s, 1], st_free[s, 2] = f0, f1, f2
    _bucket_add(b, n, s)


@njit(cache=True)
def _bucket_add(b, n, s):
    """Node ``n`` is a member of state ``s``."""
    state, count, bits = b[0], b[2], b[3]
    state[n] = s
    count[s] += 1
    bits[s, n // 64] |= np.uint64(1) << np.uint64(n % 64)


@njit(cache=True)
def _bucket_leave(b, n):
    """Node ``n`` leaves its state (an emptied state's id is kept for reuse)."""
    state, st_free, count, bits, index, _, spare, _ = b
    s = state[n]
    bits[s, n // 64] &= ~(np.uint64(1) << np.uint64(n % 64))
    count[s] -= 1
    if count[s] == 0:
        del index[(st_free[s, 0], st_free[s, 1], st_free[s, 2])]
        spare[spare[-1]] = s
        spare[-1] += 1


@njit(cache=True)
def _top_nodes_buckets(b, d0, d1, d2, wd, pd, k, out):
    """_top_nodes over the states: their room, the fitting ones by room, and within a room the lowest node
    indices of every state of that room."""
    _, st_free, count, bits, _, used, _, _ = b
    sid = np.empty(used[0], dtype=np.int64)
    sroom = np.empty(used[0])
    m = 0
    for s in range(used[0]):
        f = st_free[s]
        if count[s] > 0 and f[0] + _EPS >= d0 and f[1] + _EPS >= d1 and f[2] + _EPS >= d2:
            sid[m], sroom[m] = s, _state_room(st_free[s], wd, pd)
            m += 1
    ranked = np.argsort(-sroom[:m], kind="mergesort")
    got, i = 0, 0
    pool = np.empty(k * m + 1, dtype=np.int64)
    while i < m and got < k:
        j, size = i, 0
        while j < m and sroom[ranked[j]] == sroom[ranked[i]]:  # one room: merge its states by index
            size = _first_members(bits[sid[ranked[j]]], k, pool, size)
            j += 1
        pool[:size].sort()
        for c in range(min(size, k - got)):
            out[got] = pool[c]
            got += 1
        i = j
    return got


@njit(cache=True)
def _first_members(row, k, pool, size):
    """Append the (up to) ``k`` lowest node indices of a member bit row to ``pool[size:]``."""
    taken = 0
    for wi in range(row.shape[0]):
        word = row[wi]
        if word == 0:
            continue
        for bit in range(64):
            if word & (np.uint64(1) << np.uint64(bit)):
                pool[size] = wi * 64 + bit
                size += 1
                taken += 1
                if taken == k:
                    return size
    return size


@njit(cache=True)
def _state_room(f, wd, pd):
    """_room of one free capacity ``f`` (3,)."""
    rm = np.inf
    for r in range(3):
        pair = wd[r] + pd[r]
        if pair > 0:
            v = f[r] / max(pair, _EPS)
            if v < rm:
                rm = v
    return rm


@njit(cache=True)
def _lay_out_job(b, bucketed, free, w, p, wd, pd, taken, room, out):
    """dl2ray.cluster._lay_out_job: ``out`` the job's worker nodes then PS nodes; False if no k fits.

    A k whose largest group exceeds every node's free amount of some resource fails at its first group
    there, so it is skipped without a search. Otherwise the k groups have at most three distinct demands;
    one search per demand finds its k best fitting nodes (most room, then lowest index; through the
    states ``b`` when ``bucketed``, else a scan of the nodes), and each group takes the first of its
    demand's list not taken by an earlier group — the node the reference's scan finds, since fewer than
    k nodes are taken before any group."""
    if w + p == 0:
        return True
    most = _most_free(b) if bucketed else _room(free, wd, pd, room)
    chosen = np.empty(w + p, dtype=np.int64)
    best = np.empty((3, w + p), dtype=np.int64)
    for k in range(1, w + p + 1):
        wk, pk = -(-w // k), -(-p // k)  # the largest group
        if (most[0] + _EPS < wk * wd[0] + pk * pd[0] or most[1] + _EPS < wk * wd[1] + pk * pd[1]
                or most[2] + _EPS < wk * wd[2] + pk * pd[2]):
            continue
        got = _pick_groups(b, bucketed, free, room, w, p, wd, pd, k, taken, chosen, best)
        for i in range(got):
            taken[chosen[i]] = False
        if got == k:
            _commit(free, w, p, wd, pd, k, chosen, out)
            if bucketed:
                for i in range(k):
                    n = chosen[i]
                    _bucket_leave(b, n)
                    _bucket_join(b, n, free[n, 0], free[n, 1], free[n, 2])
            return True
    return False


@njit(cache=True)
def _pick_groups(b, bucketed, free, room, w, p, wd, pd, k, taken, chosen, best):
    """The nodes of the k groups in order (marked ``taken``) in ``chosen``; returns how many were found
    before a group found none."""
    found = np.zeros(3, dtype=np.int64)
    got, kind, last_w, last_p = 0, -1, -1, -1
    for i in range(k):
        wk = w // k + (1 if i < w % k else 0)
        pk = p // k + (1 if i < p % k else 0)
        if wk != last_w or pk != last_p:  # a new demand: its k best nodes
            kind, last_w, last_p = kind + 1, wk, pk
            d0, d1, d2 = wk * wd[0] + pk * pd[0], wk * wd[1] + pk * pd[1], wk * wd[2] + pk * pd[2]
            if bucketed:
                found[kind] = _top_nodes_buckets(b, d0, d1, d2, wd, pd, k, best[kind])
            else:
                found[kind] = _top_nodes(free, d0, d1, d2, room, k, best[kind])
        node = -1
        for c in range(found[kind]):
            if not taken[best[kind, c]]:
                node = best[kind, c]
                break
        if node < 0:
            break
        taken[node] = True
        chosen[got] = node
        got += 1
    return got


@njit(cache=True)
def _most_free(b):
    """Each resource's largest free amount over the nodes (3,), from their states."""
    st_free, count, used = b[1], b[2], b[5]
    most = np.full(3, -np.inf)
    for s in range(used[0]):
        if count[s] > 0:
            for r in range(3):
                most[r] = max(most[r], st_free[s, r])
    return most


@njit(cache=True)
def _top_nodes(free, d0, d1, d2, room, k, out):
    """The (up to) ``k`` nodes that fit the demand ``(d0, d1, d2)`` with the most ``room``, ties by index,
    best first, in ``out``; returns how many."""
    m = 0
    for n in range(free.shape[0]):
        if m == k and room[n] <= room[out[m - 1]]:
            continue
        if free[n, 0] + _EPS >= d0 and free[n, 1] + _EPS >= d1 and free[n, 2] + _EPS >= d2:
            at = m if m < k else k - 1
            while at > 0 and room[out[at - 1]] < room[n]:
                if at < k:
                    out[at] = out[at - 1]
                at -= 1
            out[at] = n
            if m < k:
                m += 1
    return m


@njit(cache=True)
def _room(free, wd, pd, room):
    """Fill ``room`` (N,): worker + PS pairs each node could host (inf without demand); returns each
    resource's largest free amount (3,)."""
    most = np.full(3, -np.inf)
    for n in range(free.shape[0]):
        rm = np.inf
        for r in range(3):
            if free[n, r] > most[r]:
                most[r] = free[n, r]
            pair = wd[r] + pd[r]
            if pair > 0:
                v = free[n, r] / max(pair, _EPS)
                if v < rm:
                    rm = v
        room[n] = rm
    return most


@njit(cache=True)
def _commit(free, w, p, wd, pd, k, chosen, out):
    """The job's ``k`` groups on the ``chosen`` nodes: ``free`` less their demands, ``out`` its worker
    nodes then its PS nodes."""
    at_w, at_p = 0, w
    for i in range(k):
        wk = w // k + (1 if i < w % k else 0)
        pk = p // k + (1 if i < p % k else 0)
        node = chosen[i]
        for r in range(3):
            free[node, r] -= wk * wd[r] + pk * pd[r]
        for _ in range(wk):
            out[at_w] = node
            at_w += 1
        for _ in range(pk):
            out[at_p] = node
            at_p += 1
