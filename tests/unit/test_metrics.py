"""Metrics against a known inventory and a few binds (issue 14), on every backend.

The inventory gauges are read from the database at scrape time in a few aggregate
queries; the activity counters count what the conductor and the API did, once each.
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from falcon import testing
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert, update

from acceld.api.app import build_app
from acceld.conductor.binding.worker import BindWorker
from acceld.db import agents as agents_db
from acceld.db.clock import sql_now
from acceld.db.models import conductors, devices
from acceld.metrics import families, record
from acceld.metrics.http import MetricsServer
from acceld.metrics.inventory import InventoryCollector
from tests.conftest import count_queries, make_conf
from tests.helpers import ADMIN
from tests.support.binds import RecordingNotifier, arq_state, request_binds
from tests.support.inventory import add_fpga


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    """Every sample of the registry's exposition text: {(name, labels): value}."""
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def inventory(db) -> dict[tuple[str, frozenset], float]:  # type: ignore[no-untyped-def]
    registry = CollectorRegistry()
    registry.register(InventoryCollector(db))
    return scrape(registry)


def sample(samples, name: str, **labels: str) -> float | None:  # type: ignore[no-untyped-def]
    return samples.get((name, frozenset(labels.items())))


def conductor_value(name: str, **labels: str) -> float:
    return families.registry_for("conductor").get_sample_value(name, labels) or 0.0


@pytest.fixture
def fleet(db):  # type: ignore[no-untyped-def]
    """node1: an FPGA with 4 handles (agent up); node2: an FPGA with 2 handles, disabled,
    and a GPU (rc PGPU) that is unhealthy and quarantined (agent down)."""
    a = add_fpga(db, hostname="node1", handles=4)
    b = add_fpga(db, hostname="node2", name="Second", handles=2, status="maintaining")
    gpu = add_fpga(db, hostname="node2", name="Gpu", handles=1)
    with db.write() as conn:
        conn.execute(update(devices).where(devices.c.id == gpu["device"]["id"]).values(
            type="GPU", vendor="0x10de", health="unhealthy", quarantined=True))
        conn.execute(update(devices).where(devices.c.id == a["device"]["id"]).values(
            health="healthy"))
        from acceld.db.models import attributes
        conn.execute(update(attributes).where(
            attributes.c.deployable_id == gpu["deployable"]["id"],
            attributes.c.key == "rc").values(value="PGPU"))
        agents_db.record_heartbeat(conn, "node1", "127.0.0.1:1", 10)
        agents_db.record_heartbeat(conn, "node2", "127.0.0.1:2", 10)
    with db.write() as conn:
        row = agents_db.get_agent(conn, "node2")
        assert agents_db.mark_down(conn, row)
    return {"a": a, "b": b, "gpu": gpu}


def test_inventory_gauges_match_the_database_in_five_queries(db, fleet):
    with db.write() as conn:  # c1 current, c2 behind on writing its agents' heartbeats
        for name, heard in (("c1", None), ("c2", sql_now(db.backend, -40))):
            conn.execute(insert(conductors).values(
                name=name, url=None, started_at=sql_now(db.backend, -60),
                heartbeat_at=sql_now(db.backend, -1), heard_through=heard))
    with count_queries(db) as statements:
        samples = inventory(db)
    assert len(statements) == 5, statements  # aggregates only, whatever the inventory's size
    assert sample(samples, "acceld_inventory_up") == 1
    assert sample(samples, "acceld_devices", type="FPGA", vendor="0x8086", host="node1",
                  status="enabled", health="healthy") == 1
    assert sample(samples, "acceld_devices", type="FPGA", vendor="0x8086", host="node2",
                  status="maintaining", health="unknown") == 1
    assert sample(samples, "acceld_devices", type="GPU", vendor="0x10de", host="node2",
                  status="enabled", health="unhealthy") == 1
    assert sum(v for (n, _), v in samples.items() if n == "acceld_devices") == 3
    assert sample(samples, "acceld_devices_quarantined", type="GPU", host="node2") == 1
    assert sample(samples, "acceld_devices_quarantined", type="FPGA", host="node1") == 0
    assert sample(samples, "acceld_attach_handles", resource_class="FPGA", state="free") == 6
    assert sample(samples, "acceld_attach_handles", resource_class="FPGA", state="in_use") == 0
    assert sample(samples, "acceld_attach_handles", resource_class="PGPU", state="free") == 1
    assert sample(samples, "acceld_agents", state="up") == 1
    assert sample(samples, "acceld_agents", state="down") == 1
    assert sample(samples, "acceld_agent_up", host="node1") == 1
    assert sample(samples, "acceld_agent_up", host="node2") == 0
    assert 0 <= sample(samples, "acceld_agent_last_seen_seconds", host="node1") < 60
    assert sample(samples, "acceld_arqs", state="Bound") == 0
    for name in ("c1", "c2"):
        assert 0.5 <= sample(samples, "acceld_conductor_heartbeat_seconds", conductor=name) < 30
    assert sample(samples, "acceld_conductor_heartbeats_written_seconds", conductor="c1") < 30
    assert 39 <= sample(samples, "acceld_conductor_heartbeats_written_seconds",
                        conductor="c2") < 70


def test_binds_count_outcome_reason_and_duration_once(conf, db, fleet):
    a, b = fleet["a"], fleet["b"]
    with db.write() as conn:  # node2's agent is back: its disabled device refuses the bind
        agents_db.record_heartbeat(conn, "node2", "127.0.0.1:2", 10)
    notifier = RecordingNotifier()
    before = {k: conductor_value(*k[:1], **dict(k[1:])) for k in (
        ("acceld_binds_total", ("outcome", "bound")),
        ("acceld_binds_total", ("outcome", "failed")),
        ("acceld_bind_failures_total", ("reason", "device_disabled")),
        ("acceld_bind_duration_seconds_count", ("outcome", "bound")),
        ("acceld_nova_events_total", ("result", "delivered")))}
    made = request_binds(conf, db, [("node1", a["deployable"]["rp_uuid"])] * 2
                         + [("node2", b["deployable"]["rp_uuid"])])
    worker = BindWorker(conf, db, notifier=notifier)
    while worker.run_once():
        pass
    assert [arq_state(db, arqs[0])[0] for _, arqs in made] == ["Bound", "Bound", "BindFailed"]

    def delta(name: str, label: str, value: str) -> float:
        return conductor_value(name, **{label: value}) - before[(name, (label, value))]

    assert delta("acceld_binds_total", "outcome", "bound") == 2
    assert delta("acceld_binds_total", "outcome", "failed") == 1
    assert delta("acceld_bind_failures_total", "reason", "device_disabled") == 1
    assert delta("acceld_bind_duration_seconds_count", "outcome", "bound") == 2
    assert delta("acceld_nova_events_total", "result", "delivered") == 3
    samples = inventory(db)
    assert sample(samples, "acceld_arqs", state="Bound") == 2
    assert sample(samples, "acceld_arqs", state="BindFailed") == 1
    assert sample(samples, "acceld_attach_handles", resource_class="FPGA", state="in_use") == 2
    assert sample(samples, "acceld_attach_handles", resource_class="FPGA", state="free") == 4


@pytest.mark.parametrize("reason, label", [
    ("The agent of host n1 was unavailable and the bind could not complete within "
     "[conductor] bind_timeout (240 s): refused", "unavailable"),
    ("device d on host n is quarantined for its health (health unhealthy: AER); no new bind "
     "until it recovers", "device_unhealthy"),
    ("device d is disabled (status maintaining)", "device_disabled"),
    ("device d is no longer reported by host n", "device_gone"),
    ("no free attach handle on deployable n_x: all are in use", "no_free_handle"),
    ("preparing attach handle h of deployable d on n failed: boom", "attach_failed"),
    ("instance i has no Placement allocation on resource provider r (it holds {})",
     "placement"),
    ("deployable d lacks trait CUSTOM_X, which the profile group requires", "profile_mismatch"),
    ("something nobody foresaw", "other"),
    (None, "other"),
])
def test_failure_reasons_fall_into_a_bounded_set(reason, label):
    assert record.failure_reason(reason) == label


def test_repeated_notify_of_the_same_job_counts_once():
    import datetime as dt
    from types import SimpleNamespace

    created = dt.datetime(2026, 1, 1, 12, 0, 0)
    row = SimpleNamespace(id=987654, created_at=created, state="Bound", bind_failure_reason=None,
                          db_now=created + dt.timedelta(seconds=3))
    before = conductor_value("acceld_binds_total", outcome="bound")
    record.binds_resolved([row])
    record.binds_resolved([row])
    assert conductor_value("acceld_binds_total", outcome="bound") - before == 1
    # A later job that SQLite gave the same id is a new bind.
    record.binds_resolved([SimpleNamespace(**{**vars(row), "created_at": created
                                              + dt.timedelta(minutes=1)})])
    assert conductor_value("acceld_binds_total", outcome="bound") - before == 2


def test_api_requests_counted_by_route_template_method_and_status(tmp_path, sqlite_db):
    conf = make_conf(str(tmp_path), metrics__api_enabled=True)
    client = testing.TestClient(build_app(conf, sqlite_db))
    registry = families.registry_for("api")

    def count(route: str, method: str, status: str) -> float:
        return registry.get_sample_value("acceld_api_requests_total",
                                         {"route": route, "method": method,
                                          "status": status}) or 0.0
    before = [count("/v2/devices/{uuid}", "GET", "404"), count("/v2/devices", "GET", "200"),
              count("unmatched", "GET", "404"), count("/v2/devices", "other", "400")]
    for n in range(3):  # three different raw paths, one template
        client.simulate_get(f"/accelerator/v2/devices/{n:08d}-0000-4000-8000-000000000000",
                            headers=ADMIN)
    client.simulate_get("/v2/devices", headers=ADMIN)
    client.simulate_get("/nowhere/at/all", headers=ADMIN)
    client.simulate_request("PURGE", "/v2/devices", headers=ADMIN)  # a method nobody knows
    after = [count("/v2/devices/{uuid}", "GET", "404"), count("/v2/devices", "GET", "200"),
             count("unmatched", "GET", "404"), count("/v2/devices", "other", "400")]
    assert [x - y for x, y in zip(after, before)] == [3, 1, 1, 1]
    labels = {s.labels.get("route") for f in registry.collect() for s in f.samples}
    assert not any(label and "0000" in label for label in labels)  # no raw path as a label
    assert (registry.get_sample_value("acceld_api_request_duration_seconds_count",
                                      {"route": "/v2/devices", "method": "GET"}) or 0) >= 1


def test_api_counts_nothing_with_metrics_off(tmp_path, sqlite_db):
    conf = make_conf(str(tmp_path))
    registry = families.registry_for("api")
    labels = {"route": "/v2/attributes", "method": "GET", "status": "200"}
    before = registry.get_sample_value("acceld_api_requests_total", labels) or 0.0
    testing.TestClient(build_app(conf, sqlite_db)).simulate_get("/v2/attributes",
                                                                 headers=ADMIN)
    assert (registry.get_sample_value("acceld_api_requests_total", labels) or 0.0) == before


def test_inventory_scrape_survives_a_database_that_is_gone(tmp_path):
    from acceld.db.engine import Database

    missing = Database(f"sqlite:///{tmp_path}/nothing-here.sqlite")  # no tables
    registry = CollectorRegistry()
    registry.register(InventoryCollector(missing))
    samples = scrape(registry)
    assert sample(samples, "acceld_inventory_up") == 0
    assert not any(n == "acceld_devices" for n, _ in samples)
    missing.dispose()


def test_listener_serves_metrics_only(sqlite_db):
    server = MetricsServer(families.registry_for("agent"), "127.0.0.1", 0).start()
    try:
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        assert "# TYPE acceld_discovery_duration_seconds histogram" in text
        assert "acceld_api_requests" not in text  # each service its own families
        base = server.url.rsplit("/", 1)[0]
        for url, method, status in ((base + "/", "GET", 404), (base + "/v2", "GET", 404),
                                    (server.url, "POST", 405)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, method=method, data=b""
                                                              if method == "POST" else None),
                                       timeout=5)
            assert refused.value.code == status
    finally:
        server.stop()


def test_agent_discovery_is_timed_per_driver():
    class Driver:
        name = "flaky"

        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def discover(self):  # type: ignore[no-untyped-def]
            if self.fail:
                raise OSError("sysfs went away")
            yield {"record": 1}

    registry = families.registry_for("agent")
    ok = registry.get_sample_value("acceld_discoveries_total",
                                   {"driver": "flaky", "outcome": "ok"}) or 0
    assert record.discover(Driver(False)) == [{"record": 1}]
    with pytest.raises(OSError):
        record.discover(Driver(True))
    assert registry.get_sample_value("acceld_discoveries_total",
                                     {"driver": "flaky", "outcome": "ok"}) == ok + 1
    assert registry.get_sample_value("acceld_discoveries_total",
                                     {"driver": "flaky", "outcome": "error"}) >= 1
    assert registry.get_sample_value("acceld_discovery_duration_seconds_count",
                                     {"driver": "flaky"}) >= 2


def test_placement_passes_count_writes_refusals_repairs_and_reachability():
    from acceld.clients.placement import PlacementUnavailable
    from acceld.conductor.placement.audit import AuditResult
    from acceld.conductor.placement.sync import PassResult

    reg = families.registry_for("conductor")

    def get(name: str, **labels: str) -> float:
        return reg.get_sample_value(name, labels) or 0.0

    outcomes: list = []

    @record.placement_pass
    def sync_once() -> PassResult:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    @record.placement_audit
    def audit_step() -> AuditResult | None:
        return AuditResult(repaired={"n1": ["a", "b"], "n2": ["c"]}, failed=["rp"])

    before = (get("acceld_placement_writes_total", operation="write"),
              get("acceld_placement_writes_total", operation="delete"),
              get("acceld_placement_errors_total", kind="refused"),
              get("acceld_placement_errors_total", kind="unreachable"),
              get("acceld_placement_drift_repairs_total"))
    outcomes[:] = [PassResult(written=["r1", "r2"], deleted=["r3"], failed=["r4"]),
                   PlacementUnavailable("Placement unreachable", None), ValueError("a bug")]
    sync_once()
    assert get("acceld_placement_up") == 1
    with pytest.raises(PlacementUnavailable):
        sync_once()
    assert get("acceld_placement_up") == 0
    with pytest.raises(ValueError):  # a bug is not an outage: not counted as one
        sync_once()
    audit_step()
    after = (get("acceld_placement_writes_total", operation="write"),
             get("acceld_placement_writes_total", operation="delete"),
             get("acceld_placement_errors_total", kind="refused"),
             get("acceld_placement_errors_total", kind="unreachable"),
             get("acceld_placement_drift_repairs_total"))
    assert [a - b for a, b in zip(after, before)] == [2, 1, 2, 1, 3]


def test_programs_and_reconciles_are_timed_with_their_outcome():
    from types import SimpleNamespace

    reg = families.registry_for("conductor")

    def get(name: str, **labels: str) -> float:
        return reg.get_sample_value(name, labels) or 0.0

    class Programmer:
        @record.program
        def program(self, deployable_uuid: str, kind: str, *, image_id: str | None = None
                    ) -> str:
            if image_id is None:
                raise RuntimeError("refused")
            return image_id

    @record.reconcile
    def apply_report(problems: list) -> SimpleNamespace:
        return SimpleNamespace(problems=problems)

    before = (get("acceld_programs_total", kind="bitstream", outcome="succeeded"),
              get("acceld_programs_total", kind="other", outcome="failed"),
              get("acceld_program_duration_seconds_count", kind="bitstream"),
              get("acceld_reconciles_total", outcome="ok"),
              get("acceld_reconciles_total", outcome="refused_records"))
    assert Programmer().program("d", "bitstream", image_id="img") == "img"
    with pytest.raises(RuntimeError):
        Programmer().program("d", "no-such-kind")  # an unknown kind is "other", not a label
    apply_report([])
    apply_report(["a refused record"])
    after = (get("acceld_programs_total", kind="bitstream", outcome="succeeded"),
             get("acceld_programs_total", kind="other", outcome="failed"),
             get("acceld_program_duration_seconds_count", kind="bitstream"),
             get("acceld_reconciles_total", outcome="ok"),
             get("acceld_reconciles_total", outcome="refused_records"))
    assert [a - b for a, b in zip(after, before)] == [1, 1, 1, 1, 1]


def test_a_failed_scrape_is_a_log_line_not_a_traceback_on_stderr(caplog, capfd):
    """wsgiref prints a failed request's traceback to standard error, outside the
    service's log (oslo.log's file, journal or JSON): the listener logs it instead."""
    import logging

    class Broken:
        def collect(self):
            raise RuntimeError("collector broke")

    registry = CollectorRegistry()
    registry.register(Broken())
    server = MetricsServer(registry, "127.0.0.1", 0).start()
    try:
        with caplog.at_level(logging.ERROR, logger="acceld.metrics.http"):
            with pytest.raises(urllib.error.HTTPError) as failed:
                urllib.request.urlopen(server.url, timeout=10)
            assert failed.value.code == 500
    finally:
        server.stop()
    # The listener's INFO line at start is captured too where an earlier test of this
    # process set logging up at INFO: only the errors count.
    (line,) = [r.getMessage() for r in caplog.records
               if r.name == "acceld.metrics.http" and r.levelno >= logging.ERROR]
    assert line.startswith("A metrics scrape failed: Traceback") and "collector broke" in line
    assert "collector broke" not in capfd.readouterr().err
