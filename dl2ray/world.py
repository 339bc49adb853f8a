"""The simulated world a run happens in: the config's speed model (true surfaces or the operator's
profile) and the simulator built on it.

:func:`build_simulator` is the one factory of simulators (``simulate``, ``compare``, every trainer and
validator); :func:`speed_model` the one builder of speed models, cached per process.
"""

from __future__ import annotations

from typing import Literal

from dl2ray.config import ExperimentConfig
from dl2ray.measurements import load_surfaces
from dl2ray.sim import Simulator
from dl2ray.speed import SpeedModel, config_placement
from dl2ray.workload import Trace

_SPEED_MODELS: dict[tuple, SpeedModel] = {}


World = Literal["truth", "operator"]
"""Which speeds a simulator runs on: the simulator's true surfaces (every evaluation), or the operator's
profile (:mod:`dl2ray.knowledge.profile`) — the world a deployable learner trains in."""


def speed_model(cfg: ExperimentConfig, world: World = "truth") -> SpeedModel:
    """The config's speed model, built once per process for the same catalogue and surfaces (or profile).

    (Keyed on paths and flags, not on the config object: configs hold numpy arrays,
    which make pydantic equality ambiguous.)
    """
    calibration = cfg.resolve(cfg.speed.placement_calibration) if cfg.speed.placement_calibration else None
    placement = config_placement(cfg)
    place_key = (cfg.speed.placement_model, str(calibration.resolve()) if calibration else "shipped")
    if world == "operator":
        path = cfg.profile_path
        key: tuple = (str(cfg.resolve(cfg.jobtypes).resolve()), f"profile:{path}", "measured",
                      cfg.speed.placement_aware, *place_key)  # the operator's twin: the network it measured
        if key not in _SPEED_MODELS:
            from dl2ray.knowledge.profile import config_profile

            _SPEED_MODELS[key] = SpeedModel(cfg.catalogue, config_profile(cfg).surfaces(), "measured",
                                            cfg.speed.placement_aware, placement)
        return _SPEED_MODELS[key]
    key = (str(cfg.resolve(cfg.jobtypes).resolve()), str(cfg.surfaces_dir.resolve()),
           cfg.speed.model, cfg.speed.placement_aware, *place_key, cfg.speed.bandwidth_scale,
           cfg.speed.compute_key)
    if key not in _SPEED_MODELS:
        surfaces = load_surfaces(cfg.surfaces_dir) if cfg.speed.model == "measured" else None
        _SPEED_MODELS[key] = SpeedModel(cfg.catalogue, surfaces, cfg.speed.model, cfg.speed.placement_aware,
                                        placement, cfg.speed.bandwidth_scale, cfg.speed.compute_scale)
    return _SPEED_MODELS[key]


def build_simulator(
    cfg: ExperimentConfig, trace: Trace | None = None, record_events: bool = False, world: World = "truth"
) -> Simulator:
    """The composition of config, speed model and (optional) fixed trace.

    ``world``: ``truth`` runs on the simulator's true surfaces (every measurement
    in docs/ is on it); ``operator`` replaces them with the config's operator
    profile, keeping the config's workload and uncertainty (job deviation,
    variation, interference, change cost, epoch error) — the operator's model
    of its cluster, in which the shipped DL2 policies are trained, so no weight
    of theirs has seen the truth. A config with a ``gang`` group gets the
    non-preemptive gang-mode simulator (:class:`dl2ray.gang.sim.GangSimulator`, a
    :class:`Simulator` with the same reset/step).
    """
    if cfg.gang is not None:
        from dl2ray.gang.sim import GangSimulator

        return GangSimulator(cfg, speed_model(cfg, world), trace, record_events)
    return Simulator(cfg, speed_model(cfg, world), trace, record_events)
