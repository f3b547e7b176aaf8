"""Helpers for bind-worker tests: ask for binds through the API, record Nova events,
and a Placement client that is unavailable for as long as a test says.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

from falcon import testing
from sqlalchemy import select, update

from acceld.api.app import build_app
from acceld.clients import nova
from acceld.clients import placement as pl
from acceld.conductor.programming import ProgramError
from acceld.db.models import deployables
from acceld.db.models import accelerator_requests, bind_jobs
from tests.helpers import ADMIN, SERVICE

ARQS = "/accelerator/v2/accelerator_requests"


def request_binds(conf, db, targets: list[tuple[str, str]], arqs_per_instance: int = 1,  # type: ignore[no-untyped-def]
                  group: dict[str, str] | None = None) -> list[tuple[str, list[str]]]:
    """For each ``(hostname, rp_uuid)``: one instance with ``arqs_per_instance`` ARQs (of a
    one-group profile, plus ``group``'s keys), bind asked for (jobs pending).
    Returns ``[(instance_uuid, [arq uuid, ...]), ...]``."""
    client = testing.TestClient(build_app(conf, db))
    name = f"dp-{uuid.uuid4().hex[:8]}"
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": name, "groups": [{"resources:FPGA": str(arqs_per_instance), **(group or {})}]}]
    ).status_code == 201
    made = []
    for hostname, rp_uuid in targets:
        arqs = client.simulate_post(ARQS, json={"device_profile_name": name},
                                    headers=ADMIN).json["arqs"]
        instance = str(uuid.uuid4())
        body = {a["uuid"]: [
            {"op": "add", "path": "/hostname", "value": hostname},
            {"op": "add", "path": "/device_rp_uuid", "value": rp_uuid},
            {"op": "add", "path": "/instance_uuid", "value": instance}] for a in arqs}
        assert client.simulate_patch(ARQS, json=body, headers=SERVICE).status_code == 202
        made.append((instance, [a["uuid"] for a in arqs]))
    return made


def arq_state(db, arq_uuid: str) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        row = conn.execute(select(accelerator_requests.c.state,
                                  accelerator_requests.c.bind_failure_reason).where(
            accelerator_requests.c.uuid == arq_uuid)).one()
    return row.state, row.bind_failure_reason


def make_jobs_due(db) -> None:  # type: ignore[no-untyped-def]
    """What time does for a job waiting for its retry: its lease is over."""
    with db.write() as conn:
        conn.execute(update(bind_jobs).where(bind_jobs.c.lease_owner.is_(None)).values(
            lease_expires_at=None))


@dataclass(frozen=True)
class Sent:
    server_uuid: str
    arq_uuid: str
    status: str


class RecordingNotifier:
    """A configured Nova notifier that records each event and can be waited on."""

    configured = True

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.posts = 0
        self._cond = threading.Condition()

    def send(self, events: list[nova.Event]) -> dict[str, str]:
        if not events:
            return {}
        with self._cond:
            self.posts += 1
            self.sent += [Sent(e.server_uuid, e.arq_uuid, e.status) for e in events]
            self._cond.notify_all()
        return {e.arq_uuid: nova.DELIVERED for e in events}

    def for_instance(self, instance: str) -> list[Sent]:
        with self._cond:
            return [s for s in self.sent if s.server_uuid == instance]

    def wait_for(self, instance: str, count: int, timeout: float = 20.0) -> list[Sent]:
        """The instance's events once ``count`` arrived (fewer if ``timeout`` passed)."""
        with self._cond:
            self._cond.wait_for(lambda: len(self.for_instance(instance)) >= count, timeout)
            return self.for_instance(instance)


class FlakyPlacement:
    """Placement as the bind checks see it, unavailable for the next ``failures`` calls
    (``failures=None``: until :meth:`restore`), then agreeing with every target."""

    def __init__(self, hostname: str, rp_uuid: str, failures: int | None = 0) -> None:
        self.hostname = hostname
        self.rp_uuid = rp_uuid
        self.compute = str(uuid.uuid4())
        self.failures = failures
        self.calls = 0
        self.refused = 0

    def restore(self) -> None:
        self.failures = 0

    def _call(self) -> None:
        self.calls += 1
        if self.failures is None or self.failures > 0:
            if self.failures is not None:
                self.failures -= 1
            self.refused += 1
            raise pl.PlacementUnavailable(
                "Placement unreachable (GET /resource_providers): Unable to establish "
                "connection to http://127.0.0.1:1/placement", None)

    def get_provider(self, uuid_: str) -> pl.Provider | None:
        self._call()
        return pl.Provider(uuid_, f"{self.hostname}_dev", 1, self.compute, self.compute)

    def find_provider_by_name(self, name: str) -> pl.Provider | None:
        self._call()
        return pl.Provider(self.compute, name, 1, None, self.compute)

    def consumer_allocations(self, consumer: str) -> dict[str, dict[str, int]]:
        self._call()
        return {self.rp_uuid: {"FPGA": 1}}


class FlakyProgrammer:
    """The conductor's programmer as binding uses it: the next ``failures`` programs answer
    503 with ``message`` (what an agent says when it, or the image service behind it, is
    away), then each program succeeds and is recorded as the real one records it."""

    def __init__(self, db, failures: int, message: str) -> None:  # type: ignore[no-untyped-def]
        self.db = db
        self.failures = failures
        self.message = message
        self.programs = 0

    def program(self, deployable_uuid: str, kind: str, *, image_id: str | None = None,
                function_id: str | None = None, precheck=None) -> str:  # type: ignore[no-untyped-def]
        if self.failures > 0:
            self.failures -= 1
            raise ProgramError(503, self.message)
        self.programs += 1
        with self.db.write() as conn:
            conn.execute(update(deployables).where(deployables.c.uuid == deployable_uuid)
                         .values(bitstream_id=image_id))
        return str(image_id)


def bind_through_api(client: testing.TestClient, conf, db, profile: str, host: str,  # type: ignore[no-untyped-def]
                     rp_uuid: str) -> str:
    """Create an ARQ of ``profile``, PATCH it bound to ``rp_uuid`` on ``host`` as Nova does,
    and run a bind worker until no job is left; returns the ARQ's uuid."""
    [arq] = client.simulate_post(ARQS, json={"device_profile_name": profile},
                                 headers=SERVICE).json["arqs"]
    ops = [{"op": "add", "path": "/hostname", "value": host},
           {"op": "add", "path": "/device_rp_uuid", "value": rp_uuid},
           {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
    assert client.simulate_patch(ARQS, json={arq["uuid"]: ops},
                                 headers=SERVICE).status_code == 202
    run_binds(conf, db)
    return arq["uuid"]


def run_binds(conf, db) -> RecordingNotifier:  # type: ignore[no-untyped-def]
    """Run a bind worker until no bind job is left; the Nova events it sent."""
    from acceld.conductor.binding.worker import BindWorker

    notifier = RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)
    while worker.run_once():
        pass
    return notifier


def reconcile_with_a_bind_after_its_read(db, hostname: str, report: dict, bind,  # type: ignore[no-untyped-def]
                                         monkeypatch) -> str:
    """Apply ``report`` for ``hostname`` with ``bind()`` (which returns an ARQ uuid) forced
    between the reconcile's read of the node and its writes; returns the ARQ's uuid. On
    SQLite the reconcile holds the write lock, so the bind waits and runs after it."""
    from acceld.conductor.reconcile import apply_report
    from acceld.db import inventory
    from tests.support.interleave import Background

    real_load = inventory.load_node
    seen: dict[str, object] = {}

    def load_then_bind(conn, name):  # type: ignore[no-untyped-def]
        loaded = real_load(conn, name)
        if "binder" not in seen:
            seen["binder"] = Background(db, bind, name="bind")
            seen["bind"] = seen["binder"].finished_or_blocked()  # type: ignore[attr-defined]
        return loaded

    monkeypatch.setattr(inventory, "load_node", load_then_bind)
    apply_report(db, hostname, report)
    monkeypatch.setattr(inventory, "load_node", real_load)
    arq_uuid = seen["binder"].join()  # type: ignore[attr-defined]
    assert seen["bind"] == ("blocked" if db.is_sqlite else "finished")
    return arq_uuid

