"""The shape policy's network (torch), its numpy inference path and its checkpoints.

One scorer shared by every job (a DeepSets network): each job row ``x_j``
(``F`` columns, :func:`dl2ray.policy.shape.job_features`) is embedded,
``h_j = φ(x_j)`` (an MLP of ``policy.shape.embed`` widths, ReLU after every
layer); the context is ``c = [mean_j h_j, max_j h_j, g]`` over the jobs of
the view (``g`` the global row); each job's logits over the ``K`` menu rows
are ``W_o·relu(W_h·[h_j, c] + b_h) + b_o``. The same weights score job 3 and
job 30, so what is learned for one resnet-50 carries to every other, and
the view may hold any number of jobs. Shapes: ``x`` (B, n, F), ``present``
(B, n) bool (padding rows False), ``g`` (B, G) → logits (B, n, K).

With profile features (``enc.profile``) ``x`` is a job's own columns
followed by ``enc.row_dim`` columns per menu row ``r_jk``; only the first are
embedded, and each logit gains a row term scored by one small network shared by
every row of every job: ``v·relu(A·[h_j, c] + B·r_jk + b)``, ``A·[h_j, c]``
computed once per job (so the cost is ``n·K·(row_dim + 1)·head``, not a full
MLP per row).

A checkpoint is a ``torch.save`` dict with ``arch: "shape"`` (paper
checkpoints have no ``arch``), the state dict, the menu and the catalogue;
:func:`load_shape_checkpoint` refuses one whose menu or catalogue differs
from the config's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from dl2ray.policy.network import CheckpointError, read_checkpoint_doc
from dl2ray.policy.shape import ShapeEncoding

ARCH = "shape"


class ShapePolicyNet(nn.Module):
    """Job rows and the global row → per-job menu logits (module docstring)."""

    def __init__(self, enc: ShapeEncoding, embed: Sequence[int], head: int) -> None:
        super().__init__()
        self.enc, self.embed_widths, self.head_width = enc, tuple(embed), head
        layers: list[nn.Module] = []
        d = enc.job_columns
        for h in embed:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.embed = nn.Sequential(*layers)
        self.hidden = nn.Linear(3 * d + enc.global_dim, head)
        self.out = nn.Linear(head, enc.num_shapes)
        if enc.profile:
            self.row_job = nn.Linear(3 * d + enc.global_dim, head)
            self.row_in = nn.Linear(enc.row_dim, head, bias=False)
            self.row_out = nn.Linear(head, 1, bias=False)

    def forward(self, x: torch.Tensor, present: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Padded layout: ``x`` (B, n, F), ``present`` (B, n), ``g`` (B, G) → (B, n, K) (padding rows'
        logits are those of a job with ``x`` all zeros; callers mask them)."""
        cols = self.enc.job_columns
        h = self.embed(x[..., :cols])  # (B, n, H)
        keep = present.unsqueeze(-1)
        count = keep.sum(dim=1).clamp(min=1)
        mean = (h * keep).sum(dim=1) / count
        mx = h.masked_fill(~keep, 0.0).amax(dim=1)  # h ≥ 0 (ReLU), so 0 is a neutral pad
        ctx = torch.cat([mean, mx, g], dim=-1).unsqueeze(1).expand(-1, h.shape[1], -1)
        return self._logits(x, torch.cat([h, ctx], dim=-1))

    def packed(self, x: torch.Tensor, slot: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Packed layout, no padding: ``x`` (N, F) the job rows of ``B`` slots, ``slot`` (N,) int64 the
        slot of each row, ``g`` (B, G) → (N, K); row for row what :meth:`forward` gives on the same
        slots padded (the context is each slot's mean and max over its own rows). A learner's batch of
        slots holds on average well under half its largest slot's jobs, so this is what training runs."""
        cols = self.enc.job_columns
        h = self.embed(x[:, :cols])  # (N, H)
        B, H = g.shape[0], h.shape[1]
        count = torch.zeros(B, dtype=h.dtype).index_add_(0, slot, torch.ones_like(slot, dtype=h.dtype))
        mean = torch.zeros(B, H, dtype=h.dtype).index_add(0, slot, h) / count.clamp(min=1)[:, None]
        # h ≥ 0 (ReLU): the zeros it starts from are the padded layout's neutral pad
        mx = torch.zeros(B, H, dtype=h.dtype).scatter_reduce(0, slot[:, None].expand(-1, H), h, "amax")
        ctx = torch.cat([mean, mx, g], dim=-1)[slot]  # (N, 2H + G)
        return self._logits(x, torch.cat([h, ctx], dim=-1))

    def _logits(self, x: torch.Tensor, hc: torch.Tensor) -> torch.Tensor:
        """``(..., K)``: the head and the row term over ``hc = [h_j, c]`` (..., 3H + G) and ``x``'s rows."""
        logits = self.out(torch.relu(self.hidden(hc)))
        if self.enc.profile:
            K, R, head = self.enc.num_shapes, self.enc.row_dim, self.head_width
            rows = x[..., self.enc.job_columns:].reshape(-1, K, R)  # (M, K, R), M = the jobs
            w_in = self.row_in.weight.t()  # (R, head)
            # relu(row_job(hc) + rows @ w_in) as one batched multiply-add: the same sums as the two
            # Linear modules, with row_in's gradient a batched r^T·dz (one (head, M·K) @ (M·K, R)
            # product took ~0.26 s of a 3 s pg update; tests/bench/bench_pg_update.py)
            z = torch.baddbmm(self.row_job(hc).reshape(-1, 1, head), rows,
                              w_in.expand(rows.shape[0], R, head)).relu_()  # (M, K, head)
            logits = logits + (z @ self.row_out.weight[0]).reshape(logits.shape)
        return logits


def build_shape_policy(enc: ShapeEncoding, embed: Sequence[int], head: int, seed: int) -> ShapePolicyNet:
    """A freshly initialised network; the init draws only from a generator seeded by ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ShapePolicyNet(enc, embed, head)


class NumpyShapePolicy:
    """The network in float32 numpy for one view at a time: ``logits(x (n, F), g (G,)) -> (n, K)``."""

    def __init__(self, net: ShapePolicyNet) -> None:
        self.enc = net.enc
        with torch.no_grad():
            lin = [m for m in net.embed if isinstance(m, nn.Linear)]
            self.embed = [(m.weight.numpy().T.copy(), m.bias.numpy().copy()) for m in lin]
            wh = net.hidden.weight.numpy().T.copy()  # (3H + G, head)
            d = lin[-1].out_features if lin else self.enc.job_columns
            self.wh_job, self.wh_ctx, self.bh = wh[:d], wh[d:], net.hidden.bias.numpy().copy()
            self.wo, self.bo = net.out.weight.numpy().T.copy(), net.out.bias.numpy().copy()
            self.row = None
            if self.enc.profile:
                wr = net.row_job.weight.numpy().T.copy()  # (3H + G, head)
                self.row = (wr[:d], wr[d:], net.row_job.bias.numpy().copy(),
                            net.row_in.weight.numpy().T.copy(), net.row_out.weight.numpy()[0].copy())

    def logits(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        h, ctx, out = self.trunk(x[:, :self.enc.job_columns], g)
        if self.row is not None:
            ri, ro = self.row[3], self.row[4]
            a = self.row_input(h, ctx)  # (n, head)
            n, k = x.shape[0], self.enc.num_shapes
            cols = self.enc.job_columns
            u = (x[:, cols:].reshape(n * k, self.enc.row_dim) @ ri).reshape(n, k, ri.shape[1])  # one product
            u += a[:, None, :]
            np.maximum(u, 0.0, out=u)
            out = out + u @ ro
        return out.astype(np.float32)

    def trunk(self, x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(h, ctx, out)`` of the job columns ``x`` (n, job_columns) and the global row ``g``: the
        embeddings (n, H), the context (2H + G,) and the logits before any row term (n, K)."""
        h = x
        for w, b in self.embed:
            h = np.maximum(h @ w + b, 0.0)
        if h.shape[0]:
            ctx = np.concatenate([h.mean(axis=0), h.max(axis=0), g])
        else:
            ctx = np.concatenate([np.zeros(2 * h.shape[1], np.float32), g])
        z = np.maximum(h @ self.wh_job + (ctx @ self.wh_ctx + self.bh), 0.0)
        return h, ctx, z @ self.wo + self.bo

    def row_input(self, h: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """``(n, head)``: each job's ``A·[h_j, c] + b`` of the row term (profile features only)."""
        assert self.row is not None
        rj, rc, rb = self.row[:3]
        return h @ rj + (ctx @ rc + rb)


@dataclass
class ShapeCheckpoint:
    policy: ShapePolicyNet
    extra: dict


def save_shape_checkpoint(path: str | Path, net: ShapePolicyNet, catalogue: Sequence[str],
                          extra: dict | None = None) -> None:
    """``torch.save`` of the state dict with what it takes to rebuild it and ``extra`` (plain data)."""
    enc = net.enc
    if len(catalogue) != enc.num_types:
        raise ValueError(f"catalogue has {len(catalogue)} names, the encoding {enc.num_types} types")
    doc = {
        "arch": ARCH,
        "meta": {"catalogue": list(catalogue), "menu": [list(s) for s in enc.menu],
                 "slots_run_scale": enc.slots_run_scale, "work_conserving": enc.work_conserving,
                 "profile_features": enc.profile,
                 "placement": "interleaved" if enc.interleaved else "per-job",
                 "layouts": list(enc.layouts),
                 "embed": list(net.embed_widths),
                 "head": net.head_width},
        "policy": net.state_dict(),
        "extra": extra or {},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(doc, path)


def _placement(name: object) -> str:
    """A checkpoint's ``meta.placement`` (ValueError for anything but the two the decoder knows)."""
    if name not in ("interleaved", "per-job"):
        raise ValueError(f"placement: {name!r}: must be 'interleaved' or 'per-job'")
    return str(name)


def _layouts(names: object) -> tuple[str, ...]:
    """A checkpoint's ``meta.layouts`` (ValueError for a placer the decoder cannot take per job)."""
    from dl2ray.cluster import PLACEMENTS

    if not isinstance(names, list | tuple):
        raise ValueError(f"layouts: {names!r}: a list of placers")
    out = tuple(str(x) for x in names)
    if any(x not in PLACEMENTS for x in out) or len(set(out)) != len(out):
        raise ValueError(f"layouts: {list(out)}: distinct placers of {', '.join(PLACEMENTS)}")
    return out


def checkpoint_placer(path: str | Path) -> str:
    """The placement policy a checkpoint (either architecture) decides under as its own: ``meta.placer``,
    ``load_balancing`` when it has none; CheckpointError for a name :mod:`dl2ray.cluster` does not know."""
    from dl2ray.cluster import PLACEMENTS

    name = read_checkpoint_doc(path).get("meta", {}).get("placer", "load_balancing")
    if name not in PLACEMENTS:
        raise CheckpointError(f"{path}: meta.placer: {name!r}: must be one of {', '.join(PLACEMENTS)}")
    return str(name)


def checkpoint_arch(path: str | Path) -> str:
    """``"shape"`` or ``"paper"`` (a checkpoint without ``arch``)."""
    return str(read_checkpoint_doc(path).get("arch", "paper"))


def load_shape_checkpoint(path: str | Path, expect: ShapeEncoding | None = None,
                          decoding: Literal["checkpoint", "config"] = "checkpoint") -> ShapeCheckpoint:
    """Rebuild the network; refuse a checkpoint whose menu or catalogue differs from ``expect``.

    ``decoding``: whose placement and work conservation the network's encoding keeps — the
    checkpoint's (a deployed policy decodes as it was trained and tested) or ``expect``'s (a training
    run from an init decodes as its config says, and saves that)."""
    doc = read_checkpoint_doc(path)
    if doc.get("arch") != ARCH:
        raise CheckpointError(f"{path}: a {doc.get('arch', 'paper')!r} checkpoint, not a shape policy")
    try:
        m = doc["meta"]
        enc = ShapeEncoding(len(m["catalogue"]), tuple((int(w), int(p)) for w, p in m["menu"]),
                            float(m["slots_run_scale"]), bool(m.get("work_conserving", False)),
                            bool(m.get("profile_features", False)),
                            interleaved=_placement(m.get("placement", "per-job")) == "interleaved",
                            layouts=_layouts(m.get("layouts", [])))
        embed, head = tuple(int(h) for h in m["embed"]), int(m["head"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a dl2ray shape checkpoint (meta: {exc!r})") from None
    if expect is not None:
        if enc.layouts != expect.layouts:
            raise CheckpointError(f"{path}: checkpoint layouts {list(enc.layouts)} differ from the config's "
                                  f"{list(expect.layouts)} (policy.shape.layouts)")
        if enc.menu != expect.menu:
            raise CheckpointError(f"{path}: checkpoint menu {list(enc.menu)} differs from the config's "
                                  f"{list(expect.menu)} (policy.shape.menu_workers / menu_ps)")
        if enc.num_types != expect.num_types:
            raise CheckpointError(f"{path}: checkpoint has {enc.num_types} job types, the config "
                                  f"{expect.num_types}")
        if enc.profile != expect.profile:
            raise CheckpointError(f"{path}: checkpoint {'has' if enc.profile else 'lacks'} profile features, "
                                  f"the config's policy.shape.profile_features is {expect.profile}")
        decode = expect if decoding == "config" else enc
        base = expect if enc.profile else enc  # profile features: computed with the config's profile
        enc = dataclasses.replace(base, work_conserving=decode.work_conserving,
                                  interleaved=decode.interleaved)
    net = ShapePolicyNet(enc, embed, head)
    net.load_state_dict(doc["policy"])
    return ShapeCheckpoint(net, dict(doc.get("extra", {})))


def checkpoint_catalogue(path: str | Path) -> tuple[str, ...]:
    return tuple(read_checkpoint_doc(path).get("meta", {}).get("catalogue", ()))


def numpy_policy(net):
    """The numpy inference copy of either architecture's torch policy network."""
    if isinstance(net, ShapePolicyNet):
        return NumpyShapePolicy(net)
    from dl2ray.policy.network import NumpyPolicy

    return NumpyPolicy.from_torch(net)


def load_shape_policy(path: str | Path, cfg) -> ShapePolicyNet:
    """The shape network of a checkpoint, checked against ``cfg``'s menu and job-type catalogue. Its layouts
    are its own (``meta.layouts``: whether it places each job by its row's placer), whatever ``cfg``'s
    ``policy.shape.layouts`` says: a deployed policy decides as it was trained and tested."""
    trained_on, names = checkpoint_catalogue(path), tuple(cfg.catalogue.names)
    if trained_on != names:
        raise CheckpointError(f"{path}: checkpoint was trained on job types {list(trained_on)}, "
                              f"the config has {list(names)}")
    try:
        layouts = _layouts(read_checkpoint_doc(path).get("meta", {}).get("layouts", []))
    except ValueError as exc:
        raise CheckpointError(f"{path}: not a dl2ray shape checkpoint (meta: {exc!r})") from None
    shape = cfg.policy.shape
    if layouts != tuple(shape.layouts):
        policy = cfg.policy.model_copy(update={"shape": shape.model_copy(update={"layouts": layouts})})
        cfg = cfg.model_copy(update={"policy": policy})
    return load_shape_checkpoint(path, expect=ShapeEncoding.from_config(cfg)).policy


def load_policy_net(path: str | Path, cfg) -> nn.Module:
    """The torch policy network of a checkpoint of either architecture, checked against ``cfg``."""
    if checkpoint_arch(path) == ARCH:
        return load_shape_policy(path, cfg)
    from dl2ray.policy.encoding import Encoding
    from dl2ray.policy.network import load_checkpoint

    return load_checkpoint(path, Encoding.from_config(cfg), cfg.catalogue.names).policy
