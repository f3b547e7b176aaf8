"""Issue 14 on a real all-in-one: `curl /metrics` of the API, the conductor and the agent
against a known inventory and a bind, and the dashboard in headless Chromium.

One all-in-one (two API workers, the fake FPGA) serves both tests of this module.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import time
import uuid
from typing import Any, Callable

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support import allinone, browser
from tests.support.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOST = "obs-node"
REFRESH = 2  # seconds between the dashboard's refreshes in the browser test
V26 = {"OpenStack-API-Version": "accelerator 2.6"}
# The fake driver's hardware: upstream's FPGA (16 handles), a GPU that reports itself
# unhealthy (quarantined by the conductor) and a healthy QAT.
DEVICES = [
    {"type": "FPGA", "name": "FakeDevice"},
    {"type": "GPU", "name": "Gpu0", "attach_handles": 4, "rc": "PGPU",
     "health": {"state": "unhealthy", "reason": "XID 79: GPU has fallen off the bus"}},
    {"type": "QAT", "name": "Qat0", "attach_handles": 8, "health": {"state": "healthy"}},
]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def documented_dashboard() -> tuple[str, int]:
    """The README's dashboard URL of `make run`, and the port `make run` starts the
    all-in-one on (the Makefile's PORT): the test opens exactly that URL."""
    with open(os.path.join(ROOT, "README.md")) as readme:
        urls = set(re.findall(r"<(http://127\.0\.0\.1:\d+/dashboard)>", readme.read()))
    assert len(urls) == 1, f"the README names more than one all-in-one dashboard: {urls}"
    with open(os.path.join(ROOT, "Makefile")) as makefile:
        (port,) = re.findall(r"^PORT \?= (\d+)$", makefile.read(), re.M)
    (url,) = urls
    assert url == f"http://127.0.0.1:{port}/dashboard", (url, port)
    return url, int(port)


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        # As a server binds (a previous run's connections in TIME_WAIT do not hold it).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Any:
    tmp = tmp_path_factory.mktemp("observability")
    ports = {name: free_port() for name in ("conductor", "agent", "m_api", "m_conductor",
                                            "m_agent")}
    spec = tmp / "fake-devices.json"
    spec.write_text(json.dumps(DEVICES))
    conf = tmp / "acceld.conf"
    conf.write_text(
        f"[DEFAULT]\nhost = {HOST}\n[api]\nworkers = 2\n"
        f"[fake_driver]\nspec_file = {spec}\n"
        f"[conductor]\nport = {ports['conductor']}\n"
        f"[agent]\nport = {ports['agent']}\nenabled_drivers = fake\nheartbeat_interval = 1\n"
        f"[metrics]\napi_enabled = true\napi_port = {ports['m_api']}\n"
        f"conductor_enabled = true\nconductor_port = {ports['m_conductor']}\n"
        f"agent_enabled = true\nagent_port = {ports['m_agent']}\n")
    # As `make run` starts it (acceld all --port PORT), where that port is free (another
    # all-in-one on this machine may hold it: the browser test then skips, saying so).
    _url, port = documented_dashboard()
    launched = allinone.launch(str(tmp / "state"), str(conf),
                               port=port if _is_free(port) else None)
    try:
        api = launched.url  # .../accelerator/v2
        found = wait_for(lambda: len(devices := requests.get(
            f"{api}/devices", timeout=10, headers=V26).json()["devices"]) == len(DEVICES)
            and devices, "the fake devices")
        device = next(d for d in found if d["type"] == "FPGA")
        deployable = next(d for d in requests.get(f"{api}/deployables", timeout=10).json()[
            "deployables"] if d["name"] == f"{HOST}_FakeDevice")
        yield {"api": api, "root": api.rsplit("/accelerator/v2", 1)[0], "device": device,
               "deployable": deployable, "launched": launched, "state": str(tmp / "state"),
               "metrics": {s: f"http://127.0.0.1:{ports['m_' + s]}/metrics"
                           for s in ("api", "conductor", "agent")}}
    finally:
        allinone.stop(launched.proc)


def wait_for(probe: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def bind(stack: dict) -> tuple[str, str]:
    """One ARQ of a fresh one-FPGA profile bound to the fake FPGA; (arq, instance)."""
    api = stack["api"]
    name = f"dp-{uuid.uuid4().hex[:8]}"
    assert requests.post(f"{api}/device_profiles", json=[
        {"name": name, "groups": [{"resources:FPGA": "1"}]}], timeout=10).status_code == 201
    arq = requests.post(f"{api}/accelerator_requests", json={"device_profile_name": name},
                        timeout=10).json()["arqs"][0]["uuid"]
    instance = str(uuid.uuid4())
    patch = {arq: [{"op": "add", "path": "/hostname", "value": HOST},
                   {"op": "add", "path": "/device_rp_uuid",
                    "value": stack["deployable"]["rp_uuid"]},
                   {"op": "add", "path": "/instance_uuid", "value": instance}]}
    assert requests.patch(f"{api}/accelerator_requests", json=patch,
                          timeout=10).status_code == 202
    wait_for(lambda: requests.get(f"{api}/accelerator_requests/{arq}", timeout=10)
             .json()["state"] == "Bound", f"ARQ {arq} Bound")
    return arq, instance


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    resp = requests.get(url, timeout=10)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(resp.text) for s in f.samples}


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_each_service_serves_its_metrics(stack):
    arq, _ = bind(stack)
    # Twenty requests on twenty connections, spread over the two workers by the kernel.
    for _ in range(20):
        assert requests.get(f"{stack['api']}/attributes", timeout=10,
                            headers={"Connection": "close"}).status_code == 200
    api = scrape(stack["metrics"]["api"])
    assert value(api, "acceld_inventory_up") == 1
    vendor = stack["device"]["vendor"]
    assert value(api, "acceld_devices", type="FPGA", vendor=vendor, host=HOST,
                 status="enabled", health="unknown") == 1
    assert value(api, "acceld_devices", type="QAT", vendor=vendor, host=HOST,
                 status="enabled", health="healthy") == 1
    assert value(api, "acceld_devices", type="GPU", vendor=vendor, host=HOST,
                 status="enabled", health="unhealthy") == 1
    assert sum(v for (n, _), v in api.items() if n == "acceld_devices") == 3
    assert value(api, "acceld_devices_quarantined", type="GPU", host=HOST) == 1
    assert value(api, "acceld_devices_quarantined", type="FPGA", host=HOST) == 0
    assert value(api, "acceld_attach_handles", resource_class="PGPU", state="free") == 4
    assert value(api, "acceld_attach_handles", resource_class="FPGA", state="in_use") == 1
    assert value(api, "acceld_attach_handles", resource_class="FPGA", state="free") == 15
    assert value(api, "acceld_arqs", state="Bound") == 1
    assert value(api, "acceld_agent_up", host=HOST) == 1
    assert value(api, "acceld_agents", state="down") == 0
    # Counted in whichever worker answered, summed by the master: exactly twenty.
    assert value(api, "acceld_api_requests_total", route="/v2/attributes", method="GET",
                 status="200") == 20
    assert value(api, "acceld_api_request_duration_seconds_count", route="/v2/attributes",
                 method="GET") == 20
    assert not any("/accelerator/" in dict(labels).get("route", "") for _, labels in api)
    # Only the API's own families: none of the conductor's, which the workers' processes
    # also define (an `acceld_placement_up 0` from the API would fire an alert).
    assert {n for n, _ in api if n.startswith(("acceld_placement", "acceld_heartbeats",
                                               "acceld_binds", "acceld_reconcile"))} == set()
    files = glob.glob(os.path.join(stack["state"], "metrics", "api-*", "counter_*.db"))
    assert files, "the API workers count into the multiprocess directory"

    conductor = scrape(stack["metrics"]["conductor"])
    assert value(conductor, "acceld_binds_total", outcome="bound") == 1
    assert value(conductor, "acceld_bind_duration_seconds_count", outcome="bound") == 1
    assert value(conductor, "acceld_nova_events_total", result="delivered") == 1
    assert value(conductor, "acceld_heartbeats_total") >= 1
    assert value(conductor, "acceld_reconciles_total", outcome="ok") >= 1
    assert value(conductor, "acceld_reconcile_duration_seconds_count") >= 1
    assert value(conductor, "acceld_api_requests_total", route="/v2/attributes",
                 method="GET", status="200") is None  # each service its own families

    agent = scrape(stack["metrics"]["agent"])
    assert value(agent, "acceld_discoveries_total", driver="fake", outcome="ok") >= 1
    assert value(agent, "acceld_discovery_duration_seconds_count", driver="fake") >= 1
    # Metrics never appear on the public API's port.
    assert requests.get(f"{stack['root']}/metrics", timeout=10).status_code == 404
    assert requests.delete(f"{stack['api']}/accelerator_requests/{arq}",
                           timeout=10).status_code in (204, 409)


def test_dashboard_in_headless_chromium(stack):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    url, port = documented_dashboard()
    if stack["root"] != f"http://127.0.0.1:{port}":
        pytest.skip(f"port {port} (make run's) was taken by another process: the all-in-one "
                    f"runs on {stack['root']}, not at the README's {url}")
    driver = browser.chrome()
    api, device = stack["api"], stack["device"]["uuid"]
    try:
        driver.get(url)  # exactly the README's URL
        wait = WebDriverWait(driver, 30, poll_frequency=0.1)
        # Refreshing every REFRESH seconds, chosen as a user would.
        wait.until(lambda d: d.find_elements(By.ID, "refresh"))
        Select(driver.find_element(By.ID, "refresh")).select_by_value(str(REFRESH))

        def cell(selector: str) -> str:
            found = driver.find_elements(By.CSS_SELECTOR, selector)
            return found[0].text if found else ""

        row = f"#devices tr[data-uuid='{device}']"
        wait.until(lambda d: cell(f"{row} [data-field=status]") == "enabled")
        assert cell(f"#hosts tr[data-host='{HOST}'] [data-field=state]") == "up"
        assert cell(f"{row} td:nth-child(1)") == HOST
        assert cell(f"{row} td:nth-child(2)") == "FPGA"
        used_before = int(cell(f"{row} [data-field=handles]").split("/")[0])
        # The GPU that reports itself unhealthy stands out: its badges and the tile.
        gpu = "#devices tr[data-type='GPU']"
        assert cell(f"{gpu} [data-field=health]") == "unhealthy"
        assert cell(f"{gpu} [data-field=quarantined]") == "quarantined"
        assert "fallen off the bus" in cell(gpu)
        assert cell("#t-unhealthy") == "1"
        assert len(driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr[data-uuid]")) == 3

        # A bind made through the API shows within one refresh: the ARQ, its instance and
        # its state, and one more handle in use on the device.
        arq, instance = bind(stack)
        quick = WebDriverWait(driver, REFRESH + 3, poll_frequency=0.1)
        try:
            quick.until(lambda d: cell(f"#arqs tr[data-uuid='{arq}'] [data-field=state]")
                        == "Bound")
        except TimeoutException:
            pytest.fail(f"the bind of {arq} did not show within one refresh")
        assert instance in cell(f"#arqs tr[data-uuid='{arq}']")
        assert cell(f"{row} [data-field=handles]").startswith(f"{used_before + 1} /")

        # A disable made through the API shows within one refresh.
        assert requests.post(f"{api}/devices/{device}/disable", timeout=10).status_code == 200
        try:
            quick.until(lambda d: cell(f"{row} [data-field=status]") == "maintaining")
        except TimeoutException:
            pytest.fail("the disable did not show within one refresh")

        # The filters offer the host and the type, and keep the device when chosen.
        for select, choice in (("filter-host", HOST), ("filter-type", "FPGA")):
            Select(driver.find_element(By.ID, select)).select_by_value(choice)
        assert cell(f"{row} td:nth-child(1)") == HOST
        assert len(driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr[data-uuid]")) == 1
        Select(driver.find_element(By.ID, "filter-type")).select_by_value("")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr[data-uuid]")) == 3
        # A device's events: those of the disable among them (from microversion 2.6).
        driver.find_element(By.CSS_SELECTOR, row).click()
        wait.until(lambda d: "selected" in d.find_element(By.CSS_SELECTOR, row)
                   .get_attribute("class"))
        wait.until(lambda d: d.find_element(By.ID, "events-device").text == device[:8])
        newest = driver.find_element(By.ID, "version").text.rsplit(" ", 1)[-1]
        if tuple(map(int, newest.split("."))) >= (2, 6):  # device events
            wait.until(lambda d: "disabled" in d.find_element(By.ID, "events").text)
        path = browser.artefact("dashboard.png")
        driver.save_screenshot(path)
        print(f"dashboard screenshot: {path}")

        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()
        requests.post(f"{api}/devices/{device}/enable", timeout=10)


def test_chromium_refuses_the_ports_acceld_warns_of():
    """Why `make run` is not on 6666: Chromium refuses it before connecting (nothing needs
    to listen there), as it does every port of acceld.dashboard.BROWSER_REFUSED_PORTS; the
    documented port it opens (the test above), and a port off the list it tries."""
    from selenium.common.exceptions import WebDriverException

    from acceld.dashboard import BROWSER_PORT, BROWSER_REFUSED_PORTS, announcement

    _url, port = documented_dashboard()
    assert port == BROWSER_PORT and port not in BROWSER_REFUSED_PORTS
    assert "refuse" not in announcement(f"http://127.0.0.1:{port}", port)
    assert "browsers refuse port 6666" in announcement("http://127.0.0.1:6666", 6666)
    driver = browser.chrome()
    try:
        assert {6665, 6666, 6667, 6668, 6669} <= BROWSER_REFUSED_PORTS
        for refused in sorted(BROWSER_REFUSED_PORTS):
            driver.get(f"http://127.0.0.1:{refused}/dashboard")
            assert "ERR_UNSAFE_PORT" in driver.page_source, refused
        with socket.socket() as closed:  # a port nothing listens on, off the list: tried
            closed.bind(("127.0.0.1", 0))
            free = closed.getsockname()[1]
        assert free not in BROWSER_REFUSED_PORTS
        with pytest.raises(WebDriverException, match="ERR_CONNECTION_REFUSED"):
            driver.get(f"http://127.0.0.1:{free}/dashboard")
    finally:
        driver.quit()
