"""What an RLlib run leaves for ``dl2ray compare``: the policy in our checkpoint format, and ``rllib:DIR``.

``DIR/policy.pt`` is, for the paper architecture,
:func:`dl2ray.policy.network.save_checkpoint` of the RLlib module's policy and
value networks; for the shape architecture
:func:`dl2ray.policy.shape_net.save_shape_checkpoint` of its shape network (the
format has no value network). ``extra["kind"] == "rllib"``, with the
architecture, algorithm, iteration, seed and validation JCT. The ``rllib:DIR``
scheduler runs it through the same greedy decision loop as ``dl2:PATH``
(:class:`~dl2ray.schedulers.dl2.DL2Scheduler`; paper: argmax of the masked
logits, what RLlib's ``forward_inference`` of the module picks; shape:
:func:`~dl2ray.policy.shape_decode.decide_shapes` of the network's logits), in numpy, without Ray:
``compare``'s worker processes find it through the ``dl2ray.schedulers`` entry
point (``pyproject.toml``). Imports neither Ray nor, until a policy is saved or
loaded, torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dl2ray.errors import UserError

POLICY_FILE = "policy.pt"


def export_policy(out: Path, policy, value, catalogue: Sequence[str], extra: dict) -> Path:
    """Write ``OUT/policy.pt`` (atomically: a reader never sees half a file) in ``policy``'s architecture
    (a shape network's checkpoint leaves ``value`` out); its path."""
    from dl2ray.policy.network import save_checkpoint
    from dl2ray.policy.shape_net import ShapePolicyNet, save_shape_checkpoint

    path = out / POLICY_FILE
    tmp = out / (POLICY_FILE + ".tmp")
    if isinstance(policy, ShapePolicyNet):
        save_shape_checkpoint(tmp, policy, catalogue, extra=extra)
    else:
        save_checkpoint(tmp, policy, value, catalogue, extra=extra)
    tmp.replace(path)
    return path


def rllib_scheduler(arg: str | None, cfg):
    """``rllib:DIR``: the greedy policy exported by ``dl2ray experiment rllib --out DIR``."""
    from dl2ray.schedulers.dl2 import DL2Scheduler

    if not arg:
        raise UserError("rllib needs the run's folder: rllib:DIR (the --out of `dl2ray experiment rllib`)")
    path = Path(arg) / POLICY_FILE
    if not path.is_file():
        raise UserError(f"rllib:{arg}: no {POLICY_FILE} in it (not the --out of `dl2ray experiment rllib`?)")
    sched = DL2Scheduler(str(path), cfg)
    sched.name = "rllib"
    return sched
