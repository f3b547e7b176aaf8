"""Replacing a running upstream Cyborg 17 in place, end to end.

Upstream's API, conductor and agent (fake driver) run from .upstream/venv with RabbitMQ, a
real Placement and a minimal Nova (bench/upstream.py's stack; an exchange of this test's
own on the shared broker). Two instances are bound through Nova's sequence (profile, ARQs,
Nova's allocations, the collection PATCH, the resolved poll). Upstream is stopped, its
database imported into acceld's on PostgreSQL or MariaDB, and acceld's conductor, API (on
upstream's port) and agent start from the cyborg.conf upstream ran with plus an acceld.conf
(its [database], [internal] shared_secret, ports). Then, as Nova's client does over HTTP:
the same ARQs are bound to the same instances with the same attach handles; one instance
is torn down (delete by instance) and a new one bound; Placement has exactly the providers
it had and the allocations, less the deleted instance's, plus the new one's.

Nova's calls here are the HTTP requests its client module sends (the same shapes as
tests/compat/test_nova_sequence.py); the module itself, nova.accelerator.cyborg, is driven
against acceld in tests/integration/test_nova_client.py.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any, Callable

import pytest
import requests

from acceld.db import cyborg_import
from acceld.db.engine import Database
from tests.compat.minimal_cloud import MinimalCloud
from tests.support import upstream_cyborg
from tests.support.databases import private_database
from tests.support.net import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROJECT = "0a1b2c3d4e5f46a7b8c9d0e1f2a3b4c5"
NOVA = {"X-User-Id": "5f0c8a8e1b7d4f6c9a2e3b4c5d6e7f80", "X-Project-Id": PROJECT,
        "X-Roles": "admin,member,reader", "X-Service-Roles": "service",
        "X-Service-User-Id": "9e8d7c6b5a4f43e2a1b0c9d8e7f6a5b4"}


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def rabbit_or_skip() -> None:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError:
        pytest.skip("upstream Cyborg needs RabbitMQ on 127.0.0.1:5672 (guest/guest)")


class NovaSide:
    """What Nova does around Cyborg for one instance: allocations and the ARQ calls."""

    def __init__(self, url: str, placement: Any, root: str) -> None:
        self.url, self.placement, self.root = url, placement, root

    def allocate(self, vm: str, rp: str) -> None:
        resp = self.placement.put(f"/allocations/{vm}", {
            "allocations": {self.root: {"resources": {"VCPU": 1, "MEMORY_MB": 512}},
                            rp: {"resources": {"FPGA": 1}}},
            "project_id": PROJECT, "user_id": NOVA["X-User-Id"],
            "consumer_generation": None, "consumer_type": "INSTANCE"})
        assert resp.status_code == 204, resp.text

    def boot(self, vm: str, profile: str, host: str, rp: str) -> list[dict]:
        created = requests.post(f"{self.url}/accelerator_requests", headers=NOVA, timeout=60,
                                json={"device_profile_name": profile})
        assert created.status_code == 201, created.text
        arqs = created.json()["arqs"]
        self.allocate(vm, rp)
        patch = {a["uuid"]: [{"op": "add", "path": "/hostname", "value": host},
                             {"op": "add", "path": "/device_rp_uuid", "value": rp},
                             {"op": "add", "path": "/instance_uuid", "value": vm}]
                 for a in arqs}
        bound = requests.patch(f"{self.url}/accelerator_requests", json=patch, headers=NOVA,
                               timeout=120)
        assert bound.status_code == 202, bound.text
        return self.resolved(vm)

    def resolved(self, vm: str) -> list[dict]:
        def poll() -> list[dict] | None:
            got = requests.get(f"{self.url}/accelerator_requests", headers=NOVA, timeout=60,
                               params={"instance": vm, "bind_state": "resolved"})
            return got.json()["arqs"] if got.status_code == 200 else None
        arqs = wait_for(poll, 90, f"the ARQs of {vm} to resolve")
        assert {a["state"] for a in arqs} == {"Bound"}, arqs
        return arqs

    def arqs(self, vm: str) -> list[dict]:
        got = requests.get(f"{self.url}/accelerator_requests", params={"instance": vm},
                           headers=NOVA, timeout=60)
        assert got.status_code == 200, got.text
        return got.json()["arqs"]

    def delete(self, vm: str) -> None:
        gone = requests.delete(f"{self.url}/accelerator_requests", params={"instance": vm},
                               headers=NOVA, timeout=60)
        assert gone.status_code == 204, gone.text
        assert self.placement.delete(f"/allocations/{vm}").status_code == 204


def bound_view(arqs: list[dict]) -> dict[str, tuple]:
    return {a["uuid"]: (a["state"], a["instance_uuid"], a["hostname"], a["device_rp_uuid"],
                        a["attach_handle_type"], a["attach_handle_uuid"],
                        a["attach_handle_info"], a["device_profile_name"]) for a in arqs}


def placement_view(placement: Any, host: str, instances: list[str]) -> dict[str, Any]:
    providers = {p["uuid"]: (p["name"], p["parent_provider_uuid"])
                 for p in placement.get("/resource_providers").json()["resource_providers"]
                 if p["name"].startswith(host)}
    inventories = {rp: placement.get(f"/resource_providers/{rp}/inventories").json()[
        "inventories"] for rp in providers}
    allocations = {vm: {rp: a["resources"] for rp, a in placement.get(
        f"/allocations/{vm}").json()["allocations"].items()} for vm in instances}
    return {"providers": providers, "inventories": inventories, "allocations": allocations}


def deployables_view(url: str) -> dict[str, tuple]:
    got = requests.get(f"{url}/deployables", headers=NOVA, timeout=60)
    assert got.status_code == 200, got.text
    return {d["uuid"]: (d["name"], d["rp_uuid"], d["num_accelerators"], d["driver_name"])
            for d in got.json()["deployables"]}


def agent_reported(db: Database, host: str) -> bool:
    from sqlalchemy import select

    from acceld.db.models import agents

    with db.read() as conn:
        digest = conn.execute(select(agents.c.hardware_digest).where(
            agents.c.hostname == host)).scalar_one_or_none()
    return digest is not None


class Acceld:
    """acceld's conductor, API and agent as processes, from upstream's cyborg.conf."""

    def __init__(self, files: list[str], workdir: Path) -> None:
        self.files, self.workdir = files, workdir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, service: str, port: int) -> None:
        out = open(self.workdir / f"acceld-{service}.out", "ab")
        self.procs[service] = subprocess.Popen(
            [sys.executable, "-m", "acceld.cmd.main", service, *self.files], stdout=out,
            stderr=out, cwd=self.workdir, start_new_session=True)
        out.close()

        def listening() -> bool:
            assert self.procs[service].poll() is None, self.tail(service)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False
        wait_for(listening, 60, f"acceld {service}")

    def tail(self, service: str) -> str:
        return (self.workdir / f"acceld-{service}.out").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(params=["postgresql", "mysql"])
def acceld_url(request, tmp_path):
    with private_database(request.param, tmp_path) as url:
        yield url


def test_upstream_then_acceld(placement, acceld_url, tmp_path, monkeypatch) -> None:
    upstream_cyborg.require("sqlite")
    rabbit_or_skip()
    from bench import upstream as bench_upstream

    host = f"cn-{uuidlib.uuid4().hex[:10]}"
    monkeypatch.setattr(bench_upstream, "HOSTNAME", host)
    root = placement.create_compute_node(host)
    nova_api = MinimalCloud().start()
    workdir = tmp_path / "cloud"
    up = bench_upstream.UpstreamCyborg(workdir, free_port(), placement.url,
                                       nova_api.compute_url)
    acceld: Acceld | None = None
    try:
        up.configure()
        # An exchange of its own on the shared broker: no other upstream hears this one.
        up.conf.write_text(up.conf.read_text().replace(
            "[DEFAULT]\n", f"[DEFAULT]\ncontrol_exchange = cyborg_{uuidlib.uuid4().hex[:8]}\n"))
        up.start_backend()
        up.start_api()
        rp = up.wait_for_device()["rp_uuid"]
        nova = NovaSide(up.url, placement, root)
        created = requests.post(f"{up.url}/device_profiles", headers=NOVA, timeout=60, json=[
            {"name": "fpga-e2e", "groups": [{"resources:FPGA": "1",
                                              "trait:CUSTOM_FAKE_DEVICE": "required"}]}])
        assert created.status_code == 201, created.text
        vm1, vm2, vm3 = (str(uuidlib.uuid4()) for _ in range(3))
        before = {vm: bound_view(nova.boot(vm, "fpga-e2e", host, rp)) for vm in (vm1, vm2)}
        placement_before = placement_view(placement, host, [vm1, vm2])
        deployables_before = deployables_view(up.url)
        up.stop()

        lines = cyborg_import.run(f"sqlite:///{up.db_path}", Database(acceld_url),
                                  dry_run=False)
        assert lines[-1].startswith("imported into acceld's database: device profiles 1")

        conductor_port, agent_port = free_port(), free_port()
        extra = workdir / "acceld.conf"
        extra.write_text(f"[database]\nconnection = {acceld_url}\n"
                         f"[internal]\nshared_secret = {secrets.token_hex(32)}\n"
                         f"[conductor]\nport = {conductor_port}\n"
                         f"[agent]\nport = {agent_port}\nheartbeat_interval = 1\n"
                         "discovery_interval = 1\n")
        acceld = Acceld(["--config-file", str(up.conf), "--config-file", str(extra)], workdir)
        acceld.start("conductor", conductor_port)
        acceld.start("api", up.api_port)  # where upstream's API listened
        acceld.start("agent", agent_port)
        nova.url = f"http://127.0.0.1:{up.api_port}/accelerator/v2"

        for vm in (vm1, vm2):  # what Nova's client reads: the same, bound the same
            assert bound_view(nova.arqs(vm)) == before[vm]
        target = Database(acceld_url)
        try:  # the agent's report reached the conductor, and changed no row
            wait_for(lambda: agent_reported(target, host), 60, "the agent's report")
        finally:
            target.dispose()
        assert deployables_view(nova.url) == deployables_before
        for vm in (vm1, vm2):
            assert bound_view(nova.arqs(vm)) == before[vm]
        assert placement_view(placement, host, [vm1, vm2]) == placement_before

        nova.delete(vm1)
        assert nova.arqs(vm1) == []
        after_boot = nova.boot(vm3, "fpga-e2e", host, rp)
        assert bound_view(nova.arqs(vm2)) == before[vm2]
        handles = {a["attach_handle_uuid"] for a in after_boot}
        assert not handles & {v[5] for v in before[vm2].values()}
        # Nova is told after the bind commits (the job's notify phase): wait for it.
        wait_for(lambda: any(e["server_uuid"] == vm3 and e["status"] == "completed"
                             for e in nova_api.events), 30, "Nova's event for the new bind")

        now = placement_view(placement, host, [vm1, vm2, vm3])
        assert now["providers"] == placement_before["providers"]  # none added, none gone
        assert now["inventories"] == placement_before["inventories"]
        assert now["allocations"][vm2] == placement_before["allocations"][vm2]
        assert now["allocations"][vm1] == {}
        assert now["allocations"][vm3] == placement_before["allocations"][vm1]  # the same shape
    finally:
        if acceld is not None:
            acceld.stop()
        up.stop()
        nova_api.stop()
