"""The agent's dashboard in a real headless browser (Debian's chromium + chromedriver, driven by Selenium) on
the live agent of configs/live-local.yaml with jobs running: the page shows the nodes, every job with its
state and allocation, the timeline, the policy and the guardrail's decisions, and refreshes by itself.

Screenshots: ``dashboard-running.png`` and ``dashboard-later.png`` in the test's ``tmp_path`` (printed;
``pytest -s`` shows where), and copied to ``$DL2RAY_SCREENSHOTS`` when that folder is set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import requests
from support import wait_for
from test_live import small_spec
from test_live_agent import agent  # noqa: F401  (the live agent fixture: its DL2 policy, 2 s slots)

from clusters.agent.waiting import MIN_DOES_NOT_FIT, NO_RESOURCES

FOR_ROOM = (NO_RESOURCES, MIN_DOES_NOT_FIT)
"""The reasons a job too big for the cluster waits with: given nothing, or given tasks placement cannot fit
(whichever the DL2 policy chose in the last slot)."""

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _browser(profile: Path):
    """Headless chromium with a fresh profile, nothing fetched from outside (the flags the brief names)."""
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are not installed (make browser installs them)")
        pytest.skip("no chromium/chromedriver here: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _shot(driver, path: Path) -> None:
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    out = os.environ.get("DL2RAY_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(out) / path.name)


@pytest.mark.ray
@pytest.mark.slow
def test_the_dashboard_shows_the_live_cluster_in_a_browser(agent, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    ray, handle, _ = agent
    # dash-wait's smallest deployment (a 1.9-core worker and a 0.2-core PS) never fits the 2-core cluster:
    # it waits first in the queue, for room (the reasons of clusters.agent.waiting)
    waiting = small_spec("dash-wait", epochs=1, worker={"cpu": 1.9, "gpu": 0, "mem": 0.1})
    for spec in (small_spec("dash-a", epochs=12), small_spec("dash-b", epochs=12, seed=4), waiting):
        assert ray.get(handle.submit.remote(spec.model_dump(mode="json")))["ok"]
    status = ray.get(handle.status.remote())
    url = status["dashboard_url"]
    assert url and url.startswith("http://127.0.0.1:")

    def slots() -> int:
        return ray.get(handle.status.remote(), timeout=60)["slots_done"]

    def running() -> bool:
        jobs = requests.get(f"{url}/api/state", timeout=60).json()["jobs"]
        return any(j["state"] == "running" and j["workers"] > 0 and j["timeline"] for j in jobs)

    def waits_for_room() -> bool:
        # a slot decided after dash-wait's submission names a reason for room; before it, the job only
        # waits for its first slot
        jobs = {j["name"]: j for j in requests.get(f"{url}/api/state", timeout=60).json()["jobs"]}
        return jobs["dash-wait"]["wait_reason"] in FOR_ROOM

    wait_for("a job running with a closed slot", running, progress=slots)
    wait_for("dash-wait waiting for room", waits_for_room, progress=slots)
    rows = {j["name"]: j for j in requests.get(f"{url}/api/state", timeout=60).json()["jobs"]}
    # last in submission order: behind whichever of dash-a and dash-b still waits (one may not have its
    # worker yet when the other already runs)
    ahead = sum(rows[n]["queue_position"] is not None for n in ("dash-a", "dash-b"))
    assert rows["dash-wait"]["queue_position"] == 1 + ahead and rows["dash-wait"]["state"] == "pending"
    assert rows["dash-wait"]["wait_reason"] in FOR_ROOM and rows["dash-wait"]["wait_detail"]
    state = requests.get(f"{url}/api/state", timeout=60).json()
    assert state["policy"]["scheduler"].startswith("dl2:") and state["nodes"] and state["decisions"]
    metrics = requests.get(f"{url}/metrics", timeout=60).text
    assert 'dl2ray_jobs{state="running"}' in metrics and "dl2ray_agent_slot_seconds_bucket" in metrics

    driver = _browser(tmp_path / "chrome-profile")
    try:
        driver.get(f"{url}/?refresh=0.5")

        def page_rows() -> dict[str, str]:
            # read in one script: the page rebuilds its tables every refresh (elements go stale)
            return driver.execute_script(
                "return Object.fromEntries([...document.querySelectorAll('#jobs tr[data-job]')]"
                ".map(r => [r.dataset.job, r.innerText]))")

        shown = wait_for("every job on the page",
                         lambda: (r := page_rows()) and {"dash-a", "dash-b", "dash-wait"} <= set(r) and r,
                         progress=slots)
        assert any("running" in text for text in shown.values()), shown
        queues = driver.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#jobs tr[data-job]')]"
            ".map(r => [r.dataset.job, r.querySelector('td.queue').textContent]))")
        # dash-wait is last in submission order: behind whichever of dash-a and dash-b the page shows waiting
        ahead = sum(queues[n].isdigit() for n in ("dash-a", "dash-b"))
        assert queues["dash-wait"] == str(1 + ahead), queues
        assert any(r in shown["dash-wait"] for r in FOR_ROOM), shown
        assert driver.find_element(By.ID, "policy").text.startswith("dl2:")
        assert driver.find_element(By.ID, "conn").text.startswith("live")
        assert driver.find_elements(By.CSS_SELECTOR, "#nodes tr[data-node]")
        assert driver.find_elements(By.CSS_SELECTOR, "#decisions tr[data-slot]")
        wait_for("the timeline to draw a slot",
                 lambda: driver.find_elements(By.CSS_SELECTOR, "#timeline rect.slot"), progress=slots)
        _shot(driver, tmp_path / "dashboard-running.png")

        # it refreshes by itself: the slot shown advances without a reload
        first = int(driver.find_element(By.ID, "slot").text)
        wait_for("the page to show a later slot",
                 lambda: int(driver.find_element(By.ID, "slot").text) > first + 1, progress=slots)
        page_slot = int(driver.find_element(By.ID, "slot").text)
        assert abs(page_slot - ray.get(handle.status.remote())["slot"]) <= 2
        _shot(driver, tmp_path / "dashboard-later.png")
        assert not driver.find_element(By.ID, "error").text
    finally:
        driver.quit()
