"""The shipped alert rules and Grafana dashboard (deploy/), and the dashboard page's files.

promtool (Debian's ``prometheus`` package) checks the rules and runs their unit tests,
and checks the Grafana queries' PromQL as recording rules; every metric name either
file refers to must be one acceld exposes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml
from falcon import testing

from acceld import dashboard
from acceld.metrics.families import exposed_names
from tests.helpers import ADMIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "deploy", "prometheus", "acceld-alerts.yaml")
RULE_TESTS = os.path.join(ROOT, "deploy", "prometheus", "acceld-alerts.test.yaml")
GRAFANA = os.path.join(ROOT, "deploy", "grafana", "acceld.json")
NAME = re.compile(r"\bacceld_[a-z_]+\b")
ALERTS = {"AcceldAgentDown", "AcceldDeviceUnhealthy", "AcceldDeviceQuarantined",
          "AcceldConductorBehind",
          "AcceldBindFailuresRising", "AcceldNovaEventsFailing", "AcceldPlacementUnreachable",
          "AcceldPlacementDrifting"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus; "
                    "`make test-tools` does it as root)")
    return found


def rule_exprs() -> dict[str, str]:
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def grafana_exprs() -> list[str]:
    with open(GRAFANA) as f:
        doc = json.load(f)
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def test_alert_rules_cover_the_issue_and_name_only_exposed_metrics():
    exprs = rule_exprs()
    assert ALERTS <= set(exprs)
    known = exposed_names()
    for alert, expr in exprs.items():
        names = set(NAME.findall(expr))
        assert names, alert
        assert names <= known, (alert, names - known)


def test_grafana_dashboard_queries_name_only_exposed_metrics():
    exprs = grafana_exprs()
    assert len(exprs) >= 20
    known = exposed_names()
    used = set()
    for expr in exprs:
        names = set(NAME.findall(expr))
        assert names, expr
        assert names <= known, (expr, names - known)
        used |= names
    # Every family is on the dashboard somewhere (a _bucket or _total stands for its family).
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in known}
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in used}
    assert families == shown, families - shown


def test_a_misspelt_metric_is_caught():
    assert not {"acceld_device"} <= exposed_names()  # the check above is not vacuous
    assert "acceld_binds_total" in exposed_names()


def test_promtool_checks_and_unit_tests_the_alert_rules():
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", RULES], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([tool, "test", "rules", RULE_TESTS], capture_output=True,
                            text=True, timeout=60, cwd=os.path.dirname(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_promtool_parses_every_grafana_query(tmp_path):
    tool = promtool()
    rules = [{"record": f"acceld:grafana_panel:{n}", "expr": expr.replace("$host", ".*")
              .replace("$type", ".*")}
             for n, expr in enumerate(grafana_exprs()) if not expr.startswith("label_values")]
    path = tmp_path / "grafana-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))
    checked = subprocess.run([tool, "check", "rules", str(path)], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # And a broken query would have failed.
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "acceld:broken", "expr": "sum by (host (acceld_devices)"}]}]}))
    assert subprocess.run([tool, "check", "rules", str(path)], capture_output=True,
                          timeout=60).returncode != 0


@pytest.fixture
def web(conf, sqlite_db) -> testing.TestClient:
    from acceld.api.app import build_app

    return testing.TestClient(build_app(conf, sqlite_db))


@pytest.mark.parametrize("prefix", ["", "/accelerator"])
def test_dashboard_is_static_and_self_contained(web, prefix):
    page = web.simulate_get(f"{prefix}/dashboard")
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/html")
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    html = page.text
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing from elsewhere
    assert "<script>" not in html  # no inline script (the CSP would refuse it)
    for asset, media in (("app.js", "text/javascript"), ("app.css", "text/css")):
        got = web.simulate_get(f"{prefix}/dashboard/{asset}")
        assert got.status_code == 200 and got.headers["Content-Type"].startswith(media)
        assert f"dashboard/{asset}" in html
        assert "http://" not in got.text and "https://" not in got.text
    assert web.simulate_get(f"{prefix}/dashboard/").status_code == 301
    assert web.simulate_get(f"{prefix}/dashboard/").headers["Location"].endswith(
        f"{prefix}/dashboard")


def test_dashboard_serves_only_its_own_files(web):
    for name in ("secret.txt", "..%2F__init__.py", "__init__.py", "index.htm"):
        got = web.simulate_get(f"/dashboard/{name}")
        assert got.status_code == 404, name
    assert web.simulate_get("/dashboard/static/app.js").status_code == 404
    assert web.simulate_post("/dashboard", headers=ADMIN).status_code == 405


def test_dashboard_reads_only_the_public_api_with_the_callers_token():
    js = open(os.path.join(ROOT, "acceld", "dashboard", "static", "app.js")).read()
    assert "X-Auth-Token" in js and "sessionStorage" in js and "localStorage" not in js
    assert "innerHTML" not in js  # data reaches the page as text only
    paths = set(re.findall(r"API \+ \"(/[a-z_]+)", js))
    assert paths <= {"/hosts", "/devices", "/deployables", "/accelerator_requests",
                     "/device_profiles"}, paths


def test_dashboard_paths_skip_auth_token_only_for_the_page():
    assert dashboard.is_dashboard_path("/dashboard")
    assert dashboard.is_dashboard_path("/accelerator/dashboard/app.js")
    assert not dashboard.is_dashboard_path("/dashboards")
    assert not dashboard.is_dashboard_path("/v2/dashboard")
    assert not dashboard.is_dashboard_path("/accelerator/v2/devices")


def test_keystone_lets_only_the_dashboards_files_and_versions_past_auth_token():
    from acceld.api.auth import _PublicVersions

    seen: list[tuple[str, str | None]] = []

    def app(environ, start_response):  # type: ignore[no-untyped-def]
        seen.append(("app", environ.get("HTTP_X_ROLES")))
        start_response("200 OK", [])
        return [b""]

    def protected(environ, start_response):  # type: ignore[no-untyped-def]
        seen.append(("auth_token", environ.get("HTTP_X_ROLES")))
        start_response("401 Unauthorized", [])
        return [b""]

    gate = _PublicVersions(app, protected)
    for method, path in (("GET", "/dashboard"), ("GET", "/accelerator/dashboard/app.js"),
                         ("HEAD", "/dashboard"), ("POST", "/dashboard"),
                         ("GET", "/v2/devices"), ("GET", "/dashboards")):
        gate({"REQUEST_METHOD": method, "PATH_INFO": path, "HTTP_X_ROLES": "admin"},
             lambda *a: None)
    # The page's GETs skip auth_token with forged identity headers removed; nothing else.
    assert seen == [("app", None), ("app", None), ("app", None), ("auth_token", "admin"),
                    ("auth_token", "admin"), ("auth_token", "admin")]
