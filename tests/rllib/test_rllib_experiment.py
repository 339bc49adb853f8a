"""`dl2ray experiment rllib` as a user runs it: a separate process that starts its own Ray.

Runs on the tiny config (tests/rllib/tiny.yaml): two PPO iterations whose
exported policy `dl2ray compare --schedulers rllib:DIR` runs (in worker
processes), the same for APPO and IMPALA, and a PPO run interrupted with Ctrl-C
(SIGINT to its process group, as a terminal sends it). For each, every process the
run started — its whole process tree, sampled while it ran, and anything naming its
Ray session — is gone when it exits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from support import run_cli, terminal_signals, wait_for

HERE = Path(__file__).resolve().parent
TINY = HERE / "tiny.yaml"
DL2RAY = Path(sys.executable).with_name("dl2ray")
SMALL_PPO = ["--algo-opt", "train_batch_size_per_learner=200", "--algo-opt", "minibatch_size=100",
             "--algo-opt", "num_epochs=1", "--max-slots", "60", "--val-every", "1"]
# IMPALA/APPO: 4 fragments of RLlib's 50 steps per update; an iteration lasts 1 s (min_time_s_per_iteration)
SMALL_ASYNC = ["--algo-opt", "train_batch_size_per_learner=200", "--max-slots", "60", "--val-every", "1"]

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid → (parent pid, start time in clock ticks, command line) of every live, non-zombie process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if fields[0] != "Z":
            out[int(d.name)] = (int(fields[1]), fields[19], cmd)
    return out


class Tree:
    """Every process descended from ``root`` while it ran, sampled every 0.1 s: (pid, start time)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.seen = proc, set[tuple[int, str]]()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            procs = _processes()
            tree, grew = {self.proc.pid}, True
            while grew:
                new = {p for p, (ppid, _, _) in procs.items() if ppid in tree} - tree
                tree |= new
                grew = bool(new)
            self.seen |= {(p, procs[p][1]) for p in tree - {self.proc.pid} if p in procs}
            threading.Event().wait(0.1)

    def alive(self) -> list[str]:
        """The processes seen that are still running (same pid *and* start time: not a reused pid)."""
        self.thread.join()
        procs = _processes()
        return [procs[p][2] for p, start in self.seen if p in procs and procs[p][1] == start]


def _session_processes(session_dir: str) -> list[str]:
    name = Path(session_dir).name
    return [cmd for _, _, cmd in _processes().values() if name in cmd]


def _start(out: Path, *extra: str, small: Sequence[str] = SMALL_PPO) -> tuple[subprocess.Popen, Tree]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen([str(DL2RAY), "experiment", "rllib", "--config", str(TINY), "--out", str(out),
                             "--seed", "3", *small, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=terminal_signals)
    return proc, Tree(proc)


def _no_leftovers(tree: Tree, session_dir: str) -> None:
    assert len(tree.seen) >= 3, "the run should have started Ray's processes (gcs, raylet, …)"
    wait_for("the run's processes to exit", lambda: not tree.alive() and not _session_processes(session_dir))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("rllib") / "run"
    proc, tree = _start(out, "--minutes", "5", "--iterations", "2", "--json")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    doc = json.loads(stdout)
    _no_leftovers(tree, doc["ray_session_dir"])
    return out, doc


def test_two_iterations_validated_and_exported(trained) -> None:
    out, doc = trained
    record = json.loads((out / "run.json").read_text())
    assert doc["iterations"] == 2 and [r["iteration"] for r in record["history"]] == [1, 2]
    assert [v["iteration"] for v in record["validation"]] == [0, 1, 2]
    assert record["history"][-1]["env_steps"] >= 400
    assert doc["best_val_avg_jct"] == min(v["avg_jct"] for v in record["validation"])
    assert (out / "policy.pt").is_file() and (out / "rllib" / "algorithm_state.pkl").is_file()


def test_exported_policy_is_the_rllib_module(trained) -> None:
    """policy.pt holds the weights of the saved RLlib module, and both pick the same greedy actions."""
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.rl_module import RLModule

    from dl2ray.config import load_config
    from dl2ray.envs.dl2_env import DL2Env
    from dl2ray.policy.network import load_checkpoint

    out, _ = trained
    module = RLModule.from_checkpoint(out / "rllib" / "learner_group" / "learner" / "rl_module"
                                      / "default_policy")
    ckpt = load_checkpoint(out / "policy.pt")
    for name, tensor in ckpt.policy.state_dict().items():
        assert torch.equal(tensor, module.pi.state_dict()[name]), name
    env = DL2Env(cfg=load_config(TINY))
    obs, _ = env.reset(options={"trace_seed": 3_000_000})
    with torch.no_grad():
        batch = {Columns.OBS: {k: torch.as_tensor(v)[None] for k, v in obs.items()}}
        rllib_logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0].numpy()
        ours = ckpt.policy(torch.as_tensor(obs["observations"])[None])[0].numpy()
    mask = obs["action_mask"].astype(bool)
    assert int(np.argmax(rllib_logits)) == int(np.argmax(np.where(mask, ours, -np.inf)))


def _assert_compare_runs(capsys, out: Path) -> None:
    """`dl2ray compare` runs the export ``rllib:OUT`` in worker processes on 2 test traces (4 jobs)."""
    code, stdout, err = run_cli(capsys, "compare", "--config", str(TINY), "--schedulers", f"drf,rllib:{out}",
                                "--traces", "2", "--seed", "3000000", "--processes", "2", "--no-references",
                                "--json")
    assert code == 0, err
    rows = {r["scheduler"]: r for r in json.loads(stdout)["results"]}
    assert rows[f"rllib:{out}"]["jobs"] == 4


def test_compare_runs_the_exported_policy_in_worker_processes(trained, capsys) -> None:
    out, _ = trained
    _assert_compare_runs(capsys, out)


@pytest.mark.parametrize(("algo", "why"), [("dqn", "Q-function"), ("sac", "Q-networks"), ("bc", "offline"),
                                          ("dreamerv3", "world model"), ("a3c", "not an RLlib algorithm")])
def test_algorithms_that_cannot_run_exit_2_before_ray_starts(tmp_path, capsys, monkeypatch, algo,
                                                             why) -> None:
    """RLlib's algorithms that cannot train our masked policy/value networks, and unknown names: one line
    naming the algorithm and why, exit 2, no output folder and no Ray started (the test session's own
    Ray may be running: ``ray.init`` is what must not be called)."""
    import ray

    started: list = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "experiment", "rllib", "--config", str(TINY), "--out", str(out),
                           "--minutes", "1", "--algo", algo.upper())
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: --algo {algo}") and why in lines[0], err
    assert not out.exists() and started == []


def test_bad_options_exit_2_with_one_line(tmp_path, capsys) -> None:
    # RLlib's own checks of the settings run before Ray starts: a bad value is refused, not a traceback
    code, _, err = run_cli(capsys, "experiment", "rllib", "--config", str(TINY), "--out", str(tmp_path / "r"),
                           "--minutes", "1", "--algo-opt", "minibatch_size=5000")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: --algo-opt: `minibatch_size` (5000)"), err
    assert not (tmp_path / "r").exists()
    code, _, err = run_cli(capsys, "compare", "--config", str(TINY), "--schedulers", f"rllib:{tmp_path}",
                           "--traces", "1", "--processes", "1", "--no-references")
    assert code == 2 and "policy.pt" in err


def test_ctrl_c_stops_every_ray_process(tmp_path) -> None:
    out = tmp_path / "run"
    proc, tree = _start(out, "--minutes", "5")
    wait_for("the first validation", lambda: (out / "run.json").is_file() or proc.poll() is not None)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    record = json.loads((out / "run.json").read_text())
    assert record["interrupted"] is True and (out / "policy.pt").is_file()
    _no_leftovers(tree, record["ray_session_dir"])


@pytest.fixture(scope="module", params=["appo", "impala"])
def trained_async(request, tmp_path_factory) -> tuple[str, Path, dict]:
    """Two iterations of APPO or IMPALA (learner updates in a background thread)."""
    algo = request.param
    out = tmp_path_factory.mktemp(algo) / "run"
    proc, tree = _start(out, "--algo", algo, "--minutes", "5", "--iterations", "2", "--json",
                        small=SMALL_ASYNC)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    doc = json.loads(stdout)
    _no_leftovers(tree, doc["ray_session_dir"])
    return algo, out, doc


def test_appo_and_impala_train_validate_and_export_for_compare(trained_async, capsys) -> None:
    """Each new algorithm: trained (env steps, its losses), validated like PPO, best policy exported with its
    name, the algorithm saved, and `compare` runs the export in worker processes."""
    from dl2ray.policy.network import read_checkpoint_doc

    algo, out, doc = trained_async
    record = json.loads((out / "run.json").read_text())
    assert doc["algo"] == algo and record["run"]["algo"] == algo
    assert [r["iteration"] for r in record["history"]] == [1, 2]
    assert [v["iteration"] for v in record["validation"]] == [0, 1, 2]
    # an async iteration samples for min_time_s_per_iteration (1 s): how many steps depends on the load,
    # so the test asks that every iteration sampled (the count grows), not for a number of steps
    steps = [r["env_steps"] for r in record["history"]]
    assert 0 < steps[0] < steps[1], steps
    assert any(r["policy_loss"] is not None and r["vf_loss"] is not None for r in record["history"])
    assert doc["best_val_avg_jct"] == min(v["avg_jct"] for v in record["validation"])
    assert (out / "rllib" / "algorithm_state.pkl").is_file()
    extra = read_checkpoint_doc(out / "policy.pt")["extra"]
    assert extra["kind"] == "rllib" and extra["algo"] == algo and extra["iteration"] == doc["best_iteration"]
    _assert_compare_runs(capsys, out)


def test_appo_learner_keeps_a_target_copy_of_the_policy(trained_async) -> None:
    """APPO's learner module (saved with the algorithm) carries ``_old_pi``, shaped like ``pi``; IMPALA's
    has none. The saved module loads back for RLlib users (the target copy is not part of it)."""
    import pickle

    from ray.rllib.core.rl_module.rl_module import RLModule

    algo, out, _ = trained_async
    path = out / "rllib" / "learner_group" / "learner" / "rl_module" / "default_policy"
    saved = pickle.loads((path / "module_state.pkl").read_bytes())
    pi = {k.removeprefix("pi.") for k in saved if k.startswith("pi.")}
    old = {k.removeprefix("_old_pi.") for k in saved if k.startswith("_old_pi.")}
    assert pi
    if algo == "appo":
        assert old == pi and all(saved[f"_old_pi.{k}"].shape == saved[f"pi.{k}"].shape for k in pi)
    else:
        assert not old
    module = RLModule.from_checkpoint(path)
    for name, tensor in module.pi.state_dict().items():
        assert np.array_equal(tensor.numpy(), saved[f"pi.{name}"]), name
