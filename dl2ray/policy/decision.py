"""The incremental decision loop: one slot's :class:`~dl2ray.view.Allocation`, one action at a time.

For each window of J jobs (see :mod:`dl2ray.policy.encoding`): encode →
mask → if only stop is allowed, the window is done → ask a :class:`Chooser`
for one action → stop ends the window, any other action is placed through
the slot's placer and updates the state → repeat. Every task goes through
:class:`~dl2ray.cluster.Placer`, and masked actions are refused, so the
result never exceeds a node's capacity or a job's caps.

The same loop serves the learned policy (:class:`PolicyChooser`) and the
supervised teacher (``dl2ray.learn.teacher``), so both produce the same
``(state, mask, action)`` steps; an actor-critic learner can replay those.

**Compiled path.** A plain :class:`PolicyChooser` over a
:class:`~dl2ray.policy.network.NumpyPolicy` needs no Python call per
inference: :func:`run_decision` then runs the same loop as one numba function
over arrays (:func:`_decide_compiled`). Masks, features and placement are the
step-by-step path's, computed with the same float operations (the placer's
node per distinct demand is the root of a tournament tree over the nodes,
O(log N) per placement), and sampling draws the same Gumbel noise from the
same Generator. The logits differ only by float rounding: the first layer is
accumulated in float64 (the step-by-step path's float32 updates drift over a
slot), the rest in float32 in a fixed order. So both paths return the same
steps and allocation unless two allowed logits are within ~1e-6 of each
other. ``fast=False`` forces the step-by-step path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
from numba import njit

from dl2ray.cluster import ALIGNED, final_layout, placement_mode
from dl2ray.policy.encoding import PS, WORKER, Encoding, InfeasibleAction, JobArrays, SlotState
from dl2ray.view import Allocation, ClusterView, JobPlacement, Tasks


class Step(NamedTuple):
    """One inference: state ``(J·(L+5),)`` float32, mask ``(3J+1,)`` bool, chosen action."""

    state: np.ndarray
    mask: np.ndarray
    action: int


@dataclass
class Decision:
    """A slot's allocation (with placement), its recorded steps and its inference count."""

    allocation: Allocation
    steps: list[Step] = field(default_factory=list)
    inferences: int = 0


class Chooser(Protocol):
    def begin(self, slot: SlotState) -> None:
        """A new window is current in ``slot``."""

    def choose(self, slot: SlotState, mask: np.ndarray) -> int:
        """One allowed action index (``mask[a]`` is True)."""

    def applied(self, row: int, delta: np.ndarray) -> None:
        """The chosen action changed state columns L+2..L+4 of ``row`` by ``delta``."""


def run_decision(
    view: ClusterView, enc: Encoding, chooser: Chooser, record: bool = False, fast: bool = True
) -> Decision:
    """Run the loop over every window of ``view``; see the module docstring.

    With ``fast`` (the default) a plain :class:`PolicyChooser` whose policy has
    ``dense_layers()`` runs on the compiled path; any other chooser step by step.
    """
    if fast and type(chooser) is PolicyChooser and chooser.compiled_ok():
        return _decide_compiled(view, enc, chooser, record)
    slot = SlotState(view, enc)
    steps: list[Step] = []
    inferences = 0
    stop = enc.stop
    for k in range(slot.num_windows):
        slot.begin(k)
        chooser.begin(slot)
        while True:
            mask = slot.mask()
            if not mask[:stop].any():
                break
            action = chooser.choose(slot, mask)
            inferences += 1
            if record:
                steps.append(Step(slot.state().copy(), mask.copy(), action))
            if action == stop:
                break
            row, delta = slot.apply(action)
            chooser.applied(row, delta)
    return Decision(slot.allocation(), steps, inferences)


def sample_masked(logits: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> int:
    """Draw from ``softmax(logits)`` restricted to ``mask``; shapes (A,).

    Gumbel-max: ``argmax(logits + G)`` with ``G`` i.i.d. standard Gumbel is an
    exact sample of the softmax, and is cheaper here than a cumulative sum.
    """
    return int(np.argmax(np.where(mask, logits + rng.gumbel(size=logits.shape[0]), -np.inf)))


def greedy_masked(logits: np.ndarray, mask: np.ndarray) -> int:
    """The allowed action with the largest logit (ties: lowest index)."""
    return int(np.argmax(np.where(mask, logits, -np.inf)))


class PolicyChooser:
    """Chooses with a :class:`~dl2ray.policy.network.NumpyPolicy`: greedy, or sampled from ``rng``.

    Keeps the first layer's pre-activation across steps and updates it from
    each action's state delta (exactly the full product up to float32 rounding).
    :func:`run_decision` runs a chooser of exactly this class on the compiled path.
    """

    def __init__(self, policy, greedy: bool = True, rng: np.random.Generator | None = None) -> None:
        if not greedy and rng is None:
            raise ValueError("sampling needs an explicit numpy Generator")
        self.policy, self.greedy, self.rng = policy, greedy, rng
        self._pre1: np.ndarray | None = None

    def begin(self, slot: SlotState) -> None:
        self._pre1 = self.policy.first(slot.state())

    def choose(self, slot: SlotState, mask: np.ndarray) -> int:
        assert self._pre1 is not None
        logits = self.policy.head(self._pre1)
        if self.greedy:
            return greedy_masked(logits, mask)
        assert self.rng is not None
        return sample_masked(logits, mask, self.rng)

    def applied(self, row: int, delta: np.ndarray) -> None:
        assert self._pre1 is not None
        self._pre1 = self._pre1 + self.policy.first_delta(row, delta)

    def compiled_ok(self) -> bool:
        """Can :func:`run_decision` run this chooser on the compiled path?"""
        return (hasattr(self.policy, "dense_layers") and len(self.policy.dense_layers()) >= 2
                and (self.greedy or isinstance(self.rng, np.random.Generator)))


def decide_slot(
    view: ClusterView,
    policy,
    enc: Encoding,
    greedy: bool = True,
    rng: np.random.Generator | None = None,
    record: bool = False,
    fast: bool = True,
) -> Decision:
    """One slot's decision by a :class:`~dl2ray.policy.network.NumpyPolicy`."""
    return run_decision(view, enc, PolicyChooser(policy, greedy, rng), record, fast)


# -- the compiled path ----------------------------------------------------------------------
#
# The same loop as run_decision + SlotState + Placer + PolicyChooser, on arrays:
# per-job arrays from JobArrays; nodes = (capacity, free, 1/capacity as (N, 3) float64,
# placement modes (M,), dl2ray.cluster.placement_mode); per mode and distinct demand a
# tournament tree whose root is the node Placer.peek would return, updated in O(M·log N)
# per placement (build_trees). Each
# helper names the Python code it mirrors; the float operations are the same, in the
# same order, so masks and features are identical.

_EPS = 1e-9  # as dl2ray.cluster


def _decide_compiled(view: ClusterView, enc: Encoding, chooser: PolicyChooser, record: bool) -> Decision:
    arr = JobArrays.of(view, enc)
    layers = chooser.policy.dense_layers()
    if layers[0][0].shape[0] != enc.state_dim or layers[-1][0].shape[1] != enc.action_dim:
        raise ValueError(f"policy layers {[w.shape for w, _ in layers]} do not fit state dim "
                         f"{enc.state_dim} and {enc.action_dim} actions")
    cap = np.array(view.capacity, dtype=np.float64)  # own writable copies: one compiled signature
    free = np.array(view.free, dtype=np.float64)
    inv = np.divide(1.0, cap, out=np.zeros_like(cap), where=cap > 0)
    jobs = (arr.present, arr.max_workers, arr.max_ps, arr.wkey, arr.pkey, arr.wshare, arr.pshare)
    net = (layers[0][0], layers[0][1], tuple(w for w, _ in layers[1:]), tuple(b for _, b in layers[1:]))
    tasks_max = int(arr.max_workers.sum() + arr.max_ps.sum())
    rows = tasks_max + arr.static.shape[0] if record else 0  # each inference but a window's last adds a task
    states = np.empty((rows, enc.state_dim), dtype=np.float32)
    masks = np.empty((rows, enc.action_dim), dtype=bool)
    actions = np.empty(rows, dtype=np.int64)
    placed = np.empty((tasks_max, 3), dtype=np.int64)
    rng = None if chooser.greedy else chooser.rng
    inferences, n_placed = _decide_kernel(
        arr.static, jobs, arr.demands, arr.share_scale, (cap, free, inv, view_modes(view)),
        net, rng, record, states, masks, actions, placed)
    if inferences < 0:
        raise InfeasibleAction("compiled decision: no node for a task the mask allowed")
    steps: list[Step] = []
    if record:
        states, masks = states[:inferences].copy(), masks[:inferences].copy()
        steps = [Step(states[t], masks[t], a) for t, a in enumerate(actions[:inferences].tolist())]
    return Decision(placed_allocation(view, placed[:n_placed]), steps, inferences)


def view_modes(view: ClusterView) -> np.ndarray:
    """``(1,)`` int64: the placement mode of the view's placer (the compiled placers' ``modes``)."""
    return np.array([placement_mode(view.placement)], dtype=np.int64)


def placed_allocation(view: ClusterView, placed: np.ndarray, relayout: bool = True) -> Allocation:
    """As :meth:`Placer.allocation` (and :class:`OptimusPlacer`'s) after placing ``placed``.

    ``placed``: rows ``(job index in view.jobs, WORKER or PS, node)`` in placement order.
    Jobs come in Placer.job_ids() order: by first worker, then PS-only jobs by first PS.
    ``relayout``: lay the jobs out again as the view's placer does at the end (``optimus``); False when
    the tasks were placed by placers of the policy's own (its layouts), not the view's.
    """
    g, role, node = placed[:, 0], placed[:, 1], placed[:, 2]
    key = g * 2 + role
    order = np.argsort(key, kind="stable")  # by job and role; placement order kept within each
    sorted_key = key[order]
    starts = np.flatnonzero(np.diff(sorted_key, prepend=-1))
    bounds, run = [*starts.tolist(), len(placed)], node[order].tolist()
    nodes = {divmod(k, 2): tuple(run[a:b])
             for k, a, b in zip(sorted_key[starts].tolist(), bounds, bounds[1:], strict=False)}
    first = np.sort(order[starts]).tolist()  # each (job, role)'s first placement
    jobs = dict.fromkeys([*(int(g[i]) for i in first if role[i] == WORKER),
                          *(int(g[i]) for i in first if role[i] == PS)])
    tasks, placement, demands = {}, {}, {}
    for j in jobs:
        v = view.jobs[j]
        w, p = nodes.get((j, WORKER), ()), nodes.get((j, PS), ())
        tasks[v.job_id], placement[v.job_id] = Tasks(len(w), len(p)), JobPlacement(w, p)
        demands[v.job_id] = (v.worker_demand if w else None, v.ps_demand if p else None)
    allocation = Allocation(tasks, placement)
    return final_layout(view.placement, view.free, allocation, demands) if relayout else allocation


@njit(cache=True)
def _fits(free, n, d):
    """Placer._fits: node ``n`` has ``d`` free (within ε) in every resource."""
    return free[n, 0] + _EPS >= d[0] and free[n, 1] + _EPS >= d[1] and free[n, 2] + _EPS >= d[2]


@njit(cache=True)
def _score(cap, free, inv, n, d, mode):
    """Placer._score: ``mode ×`` node ``n``'s dominant usage over the resources ``d`` asks for, or
    (``mode`` ALIGNED) minus its Tetris alignment ``Σ_r d_r · free_r / cap_r²``."""
    if mode == ALIGNED:
        a = 0.0
        for r in range(3):
            a += d[r] * free[n, r] * inv[n, r] * inv[n, r]
        return -a
    used = 0.0
    for r in range(3):
        if d[r] > 0:
            used = max(used, (cap[n, r] - free[n, r]) * inv[n, r])
    return mode * used


@njit(cache=True)
def _pull(score, node, m, k, v):
    """Vertex ``v`` of tree ``(m, k)`` takes the smaller ``(score, node)`` of its two children."""
    c = 2 * v
    if score[m, k, c + 1] < score[m, k, c] or (score[m, k, c + 1] == score[m, k, c]
                                                 and node[m, k, c + 1] < node[m, k, c]):
        c += 1
    score[m, k, v], node[m, k, v] = score[m, k, c], node[m, k, c]


@njit(cache=True)
def set_leaf(trees, nodes, dem, k, n):
    """Node ``n``'s leaf in tree ``k`` of every mode from its free capacity now, and the paths above it."""
    cap, free, inv, modes = nodes
    score, node = trees
    fits = _fits(free, n, dem[k])
    for m in range(modes.shape[0]):
        v = score.shape[2] // 2 + n
        if fits:
            score[m, k, v], node[m, k, v] = _score(cap, free, inv, n, dem[k], modes[m]), n
        else:
            score[m, k, v], node[m, k, v] = np.inf, -1
        v //= 2
        while v >= 1:
            was_score, was_node = score[m, k, v], node[m, k, v]
            _pull(score, node, m, k, v)
            if score[m, k, v] == was_score and node[m, k, v] == was_node:
                break  # the vertices above depend on this one only through its value
            v //= 2


@njit(cache=True)
def build_trees(nodes, dem):
    """Per placement mode m and demand k, a tournament tree whose root ``node[m, k, 1]`` is the node
    Placer.peek of mode ``modes[m]`` returns (-1: none).

    ``nodes`` = (capacity, free, 1/capacity, modes (M,) int64: placement modes,
    :func:`dl2ray.cluster.placement_mode`); ``score``/``node`` (M, K, 2S), S ≥ N a
    power of two; leaf ``S + n`` is node ``n``'s ``(score, n)``, or ``(inf, -1)``
    when ``n`` does not fit the demand (and for padding); each vertex holds the
    smaller ``(score, node)`` of its children, the Placer's order. A placement
    updates one leaf per tree: O(M·K log N).
    """
    N, K, M = nodes[1].shape[0], dem.shape[0], nodes[3].shape[0]
    S = 1
    while S < N:
        S *= 2
    score, node = np.full((M, K, 2 * S), np.inf), np.full((M, K, 2 * S), -1, np.int64)
    for m in range(M):
        for k in range(K):
            for n in range(N):
                if _fits(nodes[1], n, dem[k]):
                    score[m, k, S + n] = _score(nodes[0], nodes[1], nodes[2], n, dem[k], nodes[3][m])
                    node[m, k, S + n] = n
            for v in range(S - 1, 0, -1):
                _pull(score, node, m, k, v)
    return score, node


@njit(cache=True)
def place_task(nodes, dem, trees, key, m):
    """Placer.place of one task of demand ``dem[key]`` by placement mode ``nodes[3][m]``: its node, or -1."""
    n = trees[1][m, key, 1]
    if n >= 0:
        free = nodes[1]
        for r in range(3):
            free[n, r] -= dem[key, r]
        for k in range(dem.shape[0]):  # only node n changed
            set_leaf(trees, nodes, dem, k, n)
    return n


@njit(cache=True)
def _bundle_fits(free, dem, best, wk, pk):
    """SlotState._bundle_fits: would a worker of ``dem[wk]`` then a PS of ``dem[pk]`` be placed?

    ``best[k, 1]``: the placer's node for demand k (the trees' roots).
    """
    a, b = best[wk, 1], best[pk, 1]
    if a < 0 or b < 0:
        return False
    if a != b:
        return True
    wd, pd = dem[wk], dem[pk]
    both = after_worker = True
    for r in range(3):
        both = both and free[a, r] + _EPS >= wd[r] + pd[r]
        after_worker = after_worker and (free[a, r] - wd[r]) + _EPS >= pd[r]
    if both or after_worker:
        return True
    for n in range(free.shape[0]):  # noqa: SIM110 (a loop: numba compiles no any(generator))
        if n != a and _fits(free, n, pd):
            return True
    return False


@njit(cache=True)
def _fill_mask(mask, lo, counts, jobs, dem, free, best, pair_fits):
    """SlotState.mask for the window of rows ``lo .. lo+J-1``; True if a non-stop action is allowed."""
    present, maxw, maxp, wkey, pkey = jobs[0], jobs[1], jobs[2], jobs[3], jobs[4]
    J = (mask.shape[0] - 1) // 3
    pair_fits[:] = -1  # bundle fits per (worker demand, PS demand), computed once per mask
    allowed = False
    for i in range(J):
        g = lo + i
        wk, pk = wkey[g], pkey[g]
        wroom = present[g] and counts[g, WORKER] < maxw[g]
        proom = present[g] and counts[g, PS] < maxp[g]
        mask[i] = wroom and best[wk, 1] >= 0
        mask[J + i] = proom and best[pk, 1] >= 0
        bundle = False
        if wroom and proom:
            if pair_fits[wk, pk] < 0:
                pair_fits[wk, pk] = _bundle_fits(free, dem, best, wk, pk)
            bundle = pair_fits[wk, pk] == 1
        mask[2 * J + i] = bundle
        allowed = allowed or mask[i] or mask[J + i] or bundle
    mask[3 * J] = True
    return allowed


@njit(cache=True)
def _update_row(x, i, g, counts, jobs, share_scale, w1, pre1):
    """SlotState._dynamic + PolicyChooser.applied: new columns L+2..L+4 of row ``i``; first layer updated."""
    maxw, maxp, wshare, pshare = jobs[1], jobs[2], jobs[5], jobs[6]
    w, p = counts[g, WORKER], counts[g, PS]
    ws, ps = wshare[g], pshare[g]
    share = max(w * ws[0] + p * ps[0], w * ws[1] + p * ps[1], w * ws[2] + p * ps[2])
    new = (np.float32(min(share * share_scale, 1.0)), np.float32(w / maxw[g]), np.float32(p / maxp[g]))
    c0 = x.shape[1] - 3
    d0, d1, d2 = new[0] - x[i, c0], new[1] - x[i, c0 + 1], new[2] - x[i, c0 + 2]
    x[i, c0], x[i, c0 + 1], x[i, c0 + 2] = new
    r = i * x.shape[1] + c0
    for h in range(pre1.shape[0]):
        pre1[h] += np.float64(d0) * w1[r, h] + np.float64(d1) * w1[r + 1, h] + np.float64(d2) * w1[r + 2, h]


@njit(cache=True)
def _first_layer(x, w1, b1, pre1):
    """NumpyPolicy.first: ``pre1 = x @ w1 + b1``, accumulated in float64.

    (x is sparse: a one-hot and two features a row.) Float64 keeps the
    incremental updates of a whole slot from drifting away from the full
    product; the layers after it compute in float32 as NumpyPolicy does.
    """
    pre1[:] = b1
    flat = x.reshape(-1)
    for k in range(flat.shape[0]):
        v = np.float64(flat[k])
        if v != 0.0:
            for h in range(pre1.shape[0]):
                pre1[h] += v * w1[k, h]


@njit(cache=True)
def _relu_dense(x, w, b, out):
    """``out = relu(x) @ w + b`` in float32; shapes (I,), (I, O), (O,), (O,)."""
    out[:] = b
    for i in range(x.shape[0]):
        v = np.float32(x[i])
        if v > 0.0:  # relu; a zero input adds nothing
            for j in range(out.shape[0]):
                out[j] += v * w[i, j]


@njit(cache=True)
def _head(pre1, ws, bs, even, odd):
    """NumpyPolicy.head: the logits, a view of the scratch buffer ``even`` or ``odd``.

    The buffers are 1-d (as wide as the widest layer): their slices stay
    contiguous, so the inner loops compile to SIMD code.
    """
    x = even[:ws[0].shape[1]]
    _relu_dense(pre1, ws[0], bs[0], x)
    for k in range(1, len(ws)):
        out = (odd if k % 2 == 1 else even)[:ws[k].shape[1]]
        _relu_dense(x, ws[k], bs[k], out)
        x = out
    return x


@njit(cache=True)
def greedy_compiled(logits, mask):
    """greedy_masked: first index of the largest allowed logit."""
    best, best_v = 0, -np.inf
    for a in range(logits.shape[0]):
        v = logits[a] if mask[a] else -np.inf
        if a == 0 or v > best_v:
            best, best_v = a, v
    return best


@njit(cache=True)
def _gumbel(rng):
    """One ``rng.gumbel()`` draw, bit for bit (numpy's random_gumbel with loc 0, scale 1)."""
    u = 1.0 - rng.random()
    while u >= 1.0:  # numpy rejects U == 1 and draws again
        u = 1.0 - rng.random()
    return 0.0 - 1.0 * math.log(-math.log(u))


@njit(cache=True)
def sample_compiled(logits, mask, rng):
    """sample_masked: argmax of ``logits + G`` over allowed actions, G drawn for every action in order."""
    best, best_v = 0, -np.inf
    for a in range(logits.shape[0]):
        g = _gumbel(rng)
        v = np.float64(logits[a]) + g if mask[a] else -np.inf
        if a == 0 or v > best_v:
            best, best_v = a, v
    return best


@njit(cache=True)
def _choose(logits, mask, rng):
    if rng is None:
        return greedy_compiled(logits, mask)
    return sample_compiled(logits, mask, rng)


@njit(cache=True)
def _apply(kind, g, counts, nodes, dem, trees, jobs, placed, n_placed):
    """SlotState.apply's placement for job row ``g``: rows added to ``placed``; -1 if the placer refused."""
    for role, key, wanted in ((WORKER, jobs[3][g], kind != PS), (PS, jobs[4][g], kind != WORKER)):
        if wanted:
            node = place_task(nodes, dem, trees, key, 0)
            if node < 0:
                return -1
            placed[n_placed, 0], placed[n_placed, 1], placed[n_placed, 2] = g, role, node
            n_placed += 1
            counts[g, role] += 1
    return n_placed


@njit(cache=True)
def _decide_kernel(static, jobs, dem, share_scale, nodes, net, rng, record, states, masks, actions, placed):
    """run_decision with a PolicyChooser: ``(inferences, rows of placed)``, inferences -1 on a refusal.

    ``static`` (windows, J, L+5) float32 from JobArrays; ``jobs`` its per-row
    arrays; ``dem`` (K, 3) distinct demands; ``nodes`` = (capacity, free (changed
    in place), 1/capacity, placement modes (1,)); ``net`` = (W1, b1, later weights,
    later biases); ``rng`` None for greedy. With ``record`` every inference's
    state, mask and action go to ``states``/``masks``/``actions``.
    """
    w1, b1, ws, bs = net
    n_windows, J = static.shape[0], static.shape[1]
    K = dem.shape[0]
    trees = build_trees(nodes, dem)
    counts = np.zeros((n_windows * J, 2), np.int64)
    mask = np.zeros(3 * J + 1, np.bool_)
    pair_fits = np.empty((K, K), np.int8)
    pre1 = np.empty(b1.shape[0], np.float64)
    widest = b1.shape[0]
    for k in range(len(bs)):
        widest = max(widest, bs[k].shape[0])
    even, odd = np.empty(widest, np.float32), np.empty(widest, np.float32)
    inferences = n_placed = 0
    for k in range(n_windows):
        lo = k * J
        x = static[k].copy()
        _first_layer(x, w1, b1, pre1)
        while _fill_mask(mask, lo, counts, jobs, dem, nodes[1], trees[1][0], pair_fits):
            action = _choose(_head(pre1, ws, bs, even, odd), mask, rng)
            if record:
                states[inferences], masks[inferences], actions[inferences] = x.reshape(-1), mask, action
            inferences += 1
            if action == 3 * J:
                break
            n_placed = _apply(action // J, lo + action % J, counts, nodes, dem, trees, jobs, placed, n_placed)
            if n_placed < 0:
                return -1, 0
            _update_row(x, action % J, lo + action % J, counts, jobs, share_scale, w1, pre1)
    return inferences, n_placed
