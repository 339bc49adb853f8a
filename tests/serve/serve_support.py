"""Helpers of the Serve tests: paths, a free port, simulator views, the app on plain uvicorn."""

from __future__ import annotations

import socket
import threading
import time

from support import CONFIGS

from dl2ray.config import ExperimentConfig
from dl2ray.view import ClusterView

ROOT = CONFIGS.parent
SHIPPED = ROOT / "models" / "dl2-testbed.pt"
TESTBED = CONFIGS / "testbed.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_views(cfg: ExperimentConfig, seed: int, slots: tuple[int, ...]) -> list[ClusterView]:
    """Views of the testbed simulator run by DRF at the given slots (jobs with histories and placements)."""
    from dl2ray.schedulers.drf import DRF
    from dl2ray.world import build_simulator

    sim, drf, out = build_simulator(cfg), DRF(), []
    view = sim.reset(seed)
    while view.slot <= max(slots) and not sim.done:
        if view.slot in slots and view.jobs:
            out.append(view)
        view = sim.step(drf.decide(view)).view
    return out


class Endpoint:
    """The app on plain uvicorn in a thread, on a free loopback port."""

    def __init__(self, settings: dict) -> None:
        import uvicorn

        from serve.app import DecisionService, plain_app

        self.service = DecisionService(settings)
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        self.server = uvicorn.Server(uvicorn.Config(plain_app(self.service), host="127.0.0.1", port=port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        end = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > end or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.service.close()
