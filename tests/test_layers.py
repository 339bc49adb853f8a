"""``make lint`` catches an import that closes a cycle, inside a package as well as between packages, also
when it is written inside a function (where Python would hide the cycle until run time).

The project's own import-linter contracts (``pyproject.toml``) run on a copy of the source tree with one
new import added per case; each must be reported as a broken contract naming the import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dl2ray", "clusters", "serve", "elastic_mxnet")

# (module that gets the new import, module it imports): each closes a cycle the issue named
CYCLES = [
    ("clusters.ray.agent", "clusters.federation.live"),  # live_agent <-> fed_live
    ("clusters.cli.live_bench", "clusters.cli.demo"),  # live_bench <-> live_demo
    ("clusters.federation.bench", "clusters.cli.plugin"),  # fed_bench <-> plugin
    ("serve.launch", "serve.plugin"),  # serve.plugin <-> bench
    ("dl2ray.cluster", "dl2ray.view"),  # cluster <-> view
    ("dl2ray.schedulers.builtin", "dl2ray.harmony.policy"),  # the registry importing up
    ("dl2ray.learn.shape.trainer", "dl2ray.learn.rl"),  # learn.rl <-> learn.shape
    ("dl2ray.learn.shape.sl", "dl2ray.learn.sl"),  # learn.sl <-> learn.shape
    ("dl2ray.sched2.dqn", "dl2ray.sched2.imitation"),  # sched2.dqn <-> imitation <-> rollout
    ("elastic_mxnet.protocol.messages", "elastic_mxnet.coordination.coordinator"),  # no layers contract there
]


@pytest.fixture(scope="module")
def broken_tree(tmp_path_factory) -> tuple[int, str]:
    """Lint a copy of the tree with every import of :data:`CYCLES` added inside a function."""
    tree = tmp_path_factory.mktemp("tree")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tree / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pt", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    for k, (module, target) in enumerate(CYCLES):
        path = tree / (module.replace(".", "/") + ".py")
        path.write_text(path.read_text() + f"\n\ndef _cycle_{k}():\n    import {target}  # noqa\n")
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize(("module", "target"), CYCLES, ids=[f"{m}->{t}" for m, t in CYCLES])
def test_lint_reports_an_import_that_closes_a_cycle(broken_tree, module: str, target: str) -> None:
    code, out = broken_tree
    assert code == 1, out[-2000:]
    # a layers contract names the import; the acyclic contract names it relative to the package it is in
    package = module.rsplit(".", 1)[0]
    relative = f"{module.removeprefix(package)} -> {target.removeprefix(package)}"
    assert f"{module} -> {target}" in out or (f"No cycles are allowed in {package}." in out
                                              and relative in out), out[-3000:]


@pytest.mark.parametrize("module", ["dl2ray.loose", "dl2ray.learn.shape.loose", "dl2ray.cli.loose"])
def test_lint_fails_on_a_module_no_room_holds(tmp_path, module: str) -> None:
    """The layers contracts are exhaustive: a new module must be placed before lint passes."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pt", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / (module.replace(".", "/") + ".py")).write_text('"""Placed nowhere."""\n')
    lint = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and module in out, out[-2000:]
