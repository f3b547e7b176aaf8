"""The dashboard's explain panel in headless Chromium: pick a profile, see the verdict and
the reasons per host, read from the real API (in-process app on a loopback WSGI server)."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from acceld.api.app import build_app
from tests.helpers import ADMIN
from tests.support import browser, inventory
from tests.support.net import free_port

pytestmark = pytest.mark.integration


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
        pass


@pytest.fixture
def served(conf, sqlite_db):
    app = build_app(conf, sqlite_db)
    server = make_server("127.0.0.1", free_port(), app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", app
    finally:
        server.shutdown()
        server.server_close()


def test_pick_a_profile_see_the_verdict_and_reasons(served, sqlite_db):
    from falcon import testing
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    root, app = served
    client = testing.TestClient(app)
    assert client.simulate_post("/v2/device_profiles", headers=ADMIN, json=[{
        "name": "fpga-dp", "groups": [{"resources:FPGA": "1"}]}]).status_code == 201
    inventory.add_fpga(sqlite_db, hostname="node-a")
    broken = inventory.add_fpga(sqlite_db, hostname="node-b")
    assert client.simulate_patch(f"/v2/devices/{broken['device']['uuid']}", headers=ADMIN, json=[
        {"op": "replace", "path": "/status", "value": "disabled",
         "reason": "fan swap"}]).status_code == 204

    driver = browser.chrome()
    try:
        driver.get(f"{root}/dashboard?refresh=0")
        wait = WebDriverWait(driver, 30, poll_frequency=0.1)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR,
                                             "#explain-profile option[value='fpga-dp']"))
        Select(driver.find_element(By.ID, "explain-profile")).select_by_value("fpga-dp")
        verdict = driver.find_element(By.ID, "explain-verdict")
        wait.until(lambda d: verdict.text != "")
        assert verdict.text == "satisfiable on 1 host: node-a"
        assert "ok" in verdict.get_attribute("class")
        row_a = driver.find_element(By.CSS_SELECTOR, "#explain tr[data-host='node-a']")
        row_b = driver.find_element(By.CSS_SELECTOR, "#explain tr[data-host='node-b']")
        assert row_a.find_element(By.CSS_SELECTOR, "[data-field=verdict]").text == "satisfiable"
        assert row_b.find_element(By.CSS_SELECTOR, "[data-field=verdict]").text == \
            "not satisfiable"
        assert "group 0: node-b_FakeDevice: device" in row_b.text
        assert "is disabled by an operator: fan swap" in row_b.text
        # Placement is not configured in-process: the page says so under the verdict.
        assert "Placement is not configured" in driver.find_element(By.ID, "explain-note").text
        # The page's host filter narrows explain to that host.
        Select(driver.find_element(By.ID, "filter-host")).select_by_value("node-b")
        wait.until(lambda d: verdict.text.startswith("not satisfiable on host node-b"))
        assert verdict.text == ("not satisfiable on host node-b: group 0 (FPGA:1): 1 matching "
                                "provider, none usable (1 disabled)")
        assert "bad" in verdict.get_attribute("class")
        assert [r.get_attribute("data-host") for r in
                driver.find_elements(By.CSS_SELECTOR, "#explain tbody tr")] == ["node-b"]
        Select(driver.find_element(By.ID, "filter-host")).select_by_value("")
        wait.until(lambda d: verdict.text == "satisfiable on 1 host: node-a")
        driver.save_screenshot(browser.artefact("dashboard-explain.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()
