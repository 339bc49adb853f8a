"""What an RLlib run leaves for ``dl2ray compare``: the policy in our checkpoint format, and ``rllib:DIR``.

``DIR/policy.pt`` is :func:`dl2ray.policy.network.save_checkpoint` of the RLlib
module's policy and value networks (``extra["kind"] == "rllib"``, with the
algorithm, iteration, seed and validation JCT). The ``rllib:DIR`` scheduler runs
it through the same greedy decision loop as ``dl2:PATH``
(:class:`~dl2ray.schedulers.dl2.DL2Scheduler`: argmax of the masked logits,
what RLlib's ``forward_inference`` of the module picks), in numpy, without Ray:
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
    """Write ``OUT/policy.pt`` (atomically: a reader never sees half a file); its path."""
    from dl2ray.policy.network import save_checkpoint

    path = out / POLICY_FILE
    tmp = out / (POLICY_FILE + ".tmp")
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
