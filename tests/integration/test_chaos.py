"""Chaos: binds keep arriving while a conductor, Placement and an agent die, and a device
is disabled; at the end every ARQ, Nova event, handle and Placement provider is right.

Real processes on loopback (issue 11 item 12, issue 15's Done-when): two ``acceld
conductor`` processes sharing the hosts by the hash ring, two ``acceld agent`` processes
with the fake driver (several devices each) that know both conductors and fail over, a
real Placement (tests.support.placement), a recording Nova (tests.support.nova) and two
public API replicas (one in process, one ``acceld api`` process; binds alternate between
them, as behind a load balancer), all on one PostgreSQL database the test creates. The
conductors' ring names are picked so that each owns one host. The test plays Nova: for each
instance it creates an ARQ, claims the device in Placement, asks the bind and, once Nova
heard the outcome, unbinds or deletes it and gives the allocation back.

The chaos steps happen at fixed points of that loop, never at random times:

1. after the warm-up binds, six binds are asked at once, with ``cond-b`` frozen (SIGSTOP)
   so that ``cond-a`` (which the API wakes) claims them, and ``cond-a`` is killed with
   SIGKILL while it holds some (frozen first and looked at, so that the kill lands on
   pending claims and not between Nova's receipt of an event and its job's deletion, where
   delivery is at least once: docs/arqs.md); ``cond-b`` is thawed and takes the dead one's
   claims over once their lease lapses while binds go on; it drops ``cond-a`` from the
   ring and owns its host within the liveness bound, and the agent that reported to
   ``cond-a`` fails over to ``cond-b`` (and back once ``cond-a`` is started again);
2. Placement is stopped (SIGTERM by PID) for OUTAGE seconds (30, the issue's figure),
   while binds keep arriving (instances Placement had allocated before it went away);
   it is started again on the same port and database;
3. agent ``chaos-2`` is killed with SIGKILL; once its host is marked down, the binds
   asked for it (allocated before the kill) wait the outage out (no event while it is
   away; it is marked down by the conductor the ring gives its host, and only that one;
   away) and end Bound once it is back, and an instance with an mdev (a host step) is
   deleted: its handle stays in use, its release queued, until the agent is started again
   and has removed the mdev;
4. a device is disabled through the API: a bind asked right before may go either way,
   binds asked after the disable answered must fail naming the disable;
5. ``cond-a`` (the owner of ``chaos-2``, the vGPU host, and the conductor the in-process API
   asks for programs) is frozen (SIGSTOP) for FREEZE seconds, longer than every lease and
   mark it may hold (bind jobs, releases, the programming mark), once it holds one, while
   an mdev release, mdev binds and a program of ``FpgaD`` with a bind racing it run, then
   thawed (SIGCONT): it resumes with stale claims, which fencing (docs/architecture.md,
   "Fencing") must make harmless: no mdev removed under a Bound ARQ, no program written
   under one, each ARQ resolved once;
6. Nova hangs (tests.support.nova.RecordingNova.silenced: every connection accepted, no
   request answered) for NOVA_SILENCE seconds while binds arrive one PATCH each, more than
   both conductors' bind workers together: every one is Bound while Nova is still silent
   (no worker is held by a call to Nova past [nova] deadline), none is heard, and each is
   heard once Nova answers again; a conductor that met the hang logged it once when it
   began and once when it ended.

Every ARQ ends ``Bound`` or ``BindFailed`` with the reason its step explains (no other
failure is accepted), Nova hears exactly one event per ARQ with the matching status, no
handle is shared, the handles in use are exactly the Bound ARQs' (and the mdevs on the
node exactly the Bound ARQs' mdevs), and Placement holds what
the database says (providers, inventories, reserved, traits). Every wait is bounded.
"""

from __future__ import annotations

import json
import time
import uuid
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from falcon import testing
from sqlalchemy import select

from acceld.api.app import build_app
from acceld.clients.conductor import FailoverClient
from acceld.conductor.fleet.hashring import HashRing
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arq_table
from acceld.db.models import attach_handles, bind_jobs, deployables, devices, handle_releases
from acceld.runtime.secrets import ensure_secret_file
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE, version
from tests.support.chaos import (AcceldProcess, HttpApi, freeze_holding_claims,
                                 kill_holding_claims, wait_until, write_conf)
from tests.support.databases import private_database
from tests.support.net import free_port
from tests.support.nova import RecordingNova
from tests.support.placement import PlacementServer, assert_placement_matches_db, ensure_venv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARQS = "/accelerator/v2/accelerator_requests"
READ = {**ADMIN, **version("2.4")}  # 2.4 shows bind_failure_reason
HOSTS = ("chaos-1", "chaos-2")
# chaos-1: three FPGAs; chaos-2: two FPGAs and a vGPU-style device whose handles are mdevs
# the agent prepares on bind and removes after unbind (a host step). Four handles
# (Placement units) each.
DEVICES = {"chaos-1": {"FpgaA": "FPGA", "FpgaB": "FPGA", "FpgaC": "FPGA"},
           "chaos-2": {"FpgaD": "FPGA", "FpgaE": "FPGA", "VgpuF": "GPU"}}
RESOURCE_CLASS = {"FPGA": "FPGA", "GPU": "PGPU"}  # acceld.drivers.fake.TYPES
HANDLES = 4
PROFILES = {"FPGA": "chaos-fpga", "PGPU": "chaos-vgpu"}  # by resource class
OUTAGE = 30.0  # seconds Placement is away (issue 11 item 12)
LEASE = 5  # [conductor] bind_lease_seconds: how long a killed conductor's claims wait
BIND_TIMEOUT = 90  # [conductor] bind_timeout: well above OUTAGE
HEARTBEAT = 1
DOWN_AFTER = 4  # heartbeats: margin for cond-b's short freeze in step 1
LIVE = 6  # instances kept bound at once outside the chaos steps
SETTLE = 60.0  # the most the end may take to settle after the last step
RING_BEAT = 0.5  # [conductor] member_heartbeat_interval
RING_DEAD = 3.0  # [conductor] member_dead_after: a killed conductor's hosts move after this
FAILBACK = 5  # [conductor] failback_interval of the agents and the API process
ATTACH_TIMEOUT = 4  # [conductor] attach_timeout: a release claim's lease is 9 x this + 10 s
PROGRAM_TIMEOUT = 5  # [conductor] program_timeout: a programming mark is this + 30 s
FREEZE = max(LEASE, ATTACH_TIMEOUT * 9 + 10, PROGRAM_TIMEOUT + 30) + 3  # step 5's SIGSTOP
IMAGE = str(uuid.uuid4())  # the bitstream step 5 programs
NOVA_DEADLINE = 2.0  # [nova] deadline: under the bind job's lease (LEASE), so that it and
# not the lease cuts off a send to a Nova that hangs (only the former is Nova's outage).
# [nova] timeout is left at its default, as an operator would.
NOVA_SILENCE = 3 * LEASE  # step 6: seconds Nova accepts connections and never answers
SILENT_BINDS = 6  # step 6's binds: more than the bind workers of both conductors (2 each)

# Why a bind may fail, by the step that asked it.
DISABLED = "device {device} is disabled"


@dataclass
class Device:
    host: str
    name: str
    uuid: str
    rp_uuid: str
    rc: str  # its resource class


@dataclass
class Instance:
    """One instance the test (as Nova) scheduled, with one ARQ, and what may become of it."""

    uuid: str
    arq: str
    device: Device
    step: str
    allowed: set[str]  # "Bound", or the start of an acceptable bind_failure_reason
    state: str | None = None
    reason: str | None = None
    retired: bool = False


def ring_names() -> dict[str, str]:
    """Ring names for cond-a and cond-b under which each owns one of HOSTS."""
    for i in range(100):
        names = {"cond-a": f"cond-a-{i}", "cond-b": "cond-b"}
        ring = HashRing(names.values())
        if {ring.owner(host) for host in HOSTS} == set(names.values()):
            return names
    raise AssertionError("no names split the hosts")


def preferring(first: str, urls: list[str], host: str) -> list[str]:
    """``urls`` in an order whose client for ``host`` starts at ``first``."""
    for order in (urls, urls[::-1]):
        client = FailoverClient(order, b"-", prefer=host)
        client.close()
        if client.urls[0] == first:
            return order
    raise AssertionError(first)


@pytest.fixture
def chaos_db_url(tmp_path) -> Iterator[str]:
    with private_database("postgresql", tmp_path) as url:
        yield url


@pytest.fixture
def nova() -> Iterator[RecordingNova]:
    server = RecordingNova().start()
    yield server
    server.stop()


@pytest.fixture
def chaos_placement(tmp_path) -> Iterator[PlacementServer]:
    """Placement of this test alone: it is stopped and started again in the middle."""
    ensure_venv()
    server = PlacementServer(tmp_path / "placement").start()
    yield server
    server.stop()


class Cloud:
    """The services of the test and what the test, as Nova, did with them."""

    def __init__(self, tmp_path: Path, db_url: str, placement: PlacementServer,
                 nova: RecordingNova) -> None:
        self.dir = tmp_path
        self.placement = placement
        self.nova = nova
        self.state = tmp_path / "state"
        ensure_secret_file(str(self.state))
        (tmp_path / "bitstreams").mkdir()
        (tmp_path / "bitstreams" / IMAGE).write_bytes(b"\x55\xaa chaos bitstream" * 64)
        self.db = Database(db_url)
        ports = {name: free_port() for name in ("cond-a", "cond-b", "api-2", *HOSTS)}
        self.ports = ports
        self.names = ring_names()
        # Agents know both conductors: chaos-1 reports to cond-a (and fails over to cond-b
        # when it is killed), chaos-2 to cond-b. The in-process API wakes cond-a only (and
        # falls back on the conductors' polling while cond-a is dead); the API process knows
        # both. Both conductors work the same bind jobs.
        self.urls = {name: f"http://127.0.0.1:{ports[name]}" for name in ("cond-a", "cond-b")}
        both = [self.urls["cond-a"], self.urls["cond-b"]]
        conductor_url = self.urls["cond-b"]
        api_conductor_url = self.urls["cond-a"]
        common: dict[str, dict[str, object]] = {
            "DEFAULT": {"state_path": self.state},
            "database": {"connection": db_url},
            "conductor": {"url": conductor_url, "bind_poll_interval": 0.2,
                          "bind_workers": 2, "bind_lease_seconds": LEASE,
                          "bind_timeout": BIND_TIMEOUT, "agent_check_interval": 0.25,
                          "agent_down_intervals": DOWN_AFTER,
                          "member_heartbeat_interval": RING_BEAT,
                          "member_dead_after": RING_DEAD, "failback_interval": FAILBACK,
                          "attach_timeout": ATTACH_TIMEOUT,
                          "program_timeout": PROGRAM_TIMEOUT},
            "agent": {"heartbeat_interval": HEARTBEAT, "discovery_interval": 2,
                      "enabled_drivers": "fake", "bitstream_dir": tmp_path / "bitstreams"},
            "nova": {"auth_type": "none", "endpoint_override": nova.url,
                     "retry_initial_delay": 0.05, "deadline": NOVA_DEADLINE},
        }
        placement_section = dict(line.split(" = ", 1) for line in
                                 placement.config_lines().splitlines()[1:])
        placement_section.update({"sync_interval": 0.3, "full_sync_interval": 5,
                                  "retry_max_delay": 2, "audit_interval": 5})
        self.processes: dict[str, AcceldProcess] = {}
        for name in ("cond-a", "cond-b"):
            sections = {k: dict(v) for k, v in common.items()}
            sections["conductor"]["port"] = ports[name]
            sections["conductor"]["name"] = self.names[name]
            # cond-a lingers before each bind transaction, so that a kill finds it
            # holding claims (tests.support.chaos.kill_holding_claims).
            if name == "cond-a":
                sections["conductor"]["bind_delay_for_tests"] = 0.5
            sections["placement"] = placement_section
            conf = write_conf(tmp_path / f"{name}.conf", sections)
            self.processes[name] = AcceldProcess(
                name, ["conductor", "--config-file", conf, "--port", str(ports[name])],
                tmp_path, ports[name])
        for host in HOSTS:
            spec = tmp_path / f"{host}.json"
            spec.write_text(json.dumps([
                {"type": kind, "name": name, "attach_handles": HANDLES,
                 "attach_type": "MDEV" if kind == "GPU" else "TEST_PCI"}
                for name, kind in DEVICES[host].items()]))
            sections = {k: dict(v) for k, v in common.items()}
            sections["DEFAULT"]["host"] = host
            sections["agent"]["port"] = ports[host]
            sections["conductor"]["url"] = ",".join(preferring(
                self.urls["cond-a" if host == "chaos-1" else "cond-b"], both, host))
            sections["fake_driver"] = {"spec_file": spec,
                                       "state_dir": tmp_path / f"{host}-fake"}
            conf = write_conf(tmp_path / f"{host}.conf", sections)
            self.processes[host] = AcceldProcess(host, ["agent", "--config-file", conf],
                                                 tmp_path, ports[host])
        self.api = testing.TestClient(build_app(make_conf(
            str(self.state), database__connection=db_url,
            conductor__url=api_conductor_url),
            self.db))
        sections = {k: dict(v) for k, v in common.items()}
        sections["conductor"]["url"] = ",".join(both)
        sections["api"] = {"workers": 1}
        conf = write_conf(tmp_path / "api-2.conf", sections)
        self.processes["api-2"] = AcceldProcess(
            "api-2", ["api", "--config-file", conf, "--port", str(ports["api-2"])], tmp_path,
            ports["api-2"])
        self.api_2 = HttpApi(f"http://127.0.0.1:{ports['api-2']}")
        self.binds = 0
        self.devices: dict[str, Device] = {}
        self.instances: list[Instance] = []
        self.disabled: set[str] = set()

    # -- what the operator and Nova see ---------------------------------------------------

    def explain(self) -> str:
        """Logs and states for a failure message."""
        parts = [f"---- {name} ----\n{proc.log(3000)}" for name, proc in
                 self.processes.items()]
        parts.append("---- placement ----\n" + self.placement.log_tail(1500))
        parts.append("---- instances ----\n" + "\n".join(
            f"{i.step} {i.arq} {i.device.name} {i.state} {i.reason}" for i in self.instances))
        return "\n".join(parts)

    def host_states(self) -> dict[str, str]:
        result = self.api.simulate_get("/accelerator/v2/hosts", headers=READ)
        assert result.status_code == 200, result.text
        return {h["hostname"]: h["state"] for h in result.json["hosts"]}

    def read_devices(self) -> dict[str, Device]:
        with self.db.read() as conn:
            rows = conn.execute(select(
                devices.c.hostname, devices.c.uuid, deployables.c.name,
                deployables.c.rp_uuid).select_from(deployables.join(
                    devices, devices.c.id == deployables.c.device_id))).all()
        found = {}
        for row in rows:
            host, name = row.name.split("_", 1)
            found[name] = Device(host, name, row.uuid, row.rp_uuid,
                                 RESOURCE_CLASS[DEVICES[host][name]])
        return found

    def reserved(self, device: Device) -> int | None:
        inv = self.placement.get(f"/resource_providers/{device.rp_uuid}/inventories")
        if inv.status_code != 200:
            return None
        return inv.json()["inventories"].get(device.rc, {}).get("reserved")

    def arq(self, arq: str) -> dict:
        result = self.api.simulate_get(f"{ARQS}/{arq}", headers=READ)
        assert result.status_code == 200, result.text
        return result.json

    # -- Nova's part -------------------------------------------------------------------------

    def handle_of(self, instance: Instance) -> int:
        with self.db.read() as conn:
            handle = conn.execute(select(arq_table.c.attach_handle_id).where(
                arq_table.c.uuid == instance.arq)).scalar_one()
        assert handle is not None, instance
        return handle

    def prepared_mdevs(self, host: str) -> set[str]:
        """The mdevs the fake driver of ``host`` created and did not remove."""
        path = self.dir / f"{host}-fake" / "attach_handles.json"
        if not path.exists():
            return set()
        return set(json.loads(path.read_text()).get("prepared", {}))

    def live(self) -> list[Instance]:
        return [i for i in self.instances if not i.retired]

    def pick(self, host: str | None = None, exclude: set[str] = frozenset()) -> Device:
        """The usable device with the most free units (by name on ties): deterministic."""
        used: dict[str, int] = {}
        for inst in self.live():
            used[inst.device.name] = used.get(inst.device.name, 0) + 1
        usable = [d for d in self.devices.values() if d.name not in self.disabled
                  and d.name not in exclude and (host is None or d.host == host)]
        best = max(usable, key=lambda d: (HANDLES - used.get(d.name, 0), -ord(d.name[-1])))
        assert HANDLES - used.get(best.name, 0) > 0, f"no free unit on {host or 'any host'}"
        return best

    def schedule(self, device: Device, step: str, allowed: set[str]) -> Instance:
        """What Nova's scheduler and conductor do before a bind: an ARQ and an allocation."""
        created = self.api.simulate_post(ARQS, json={
            "device_profile_name": PROFILES[device.rc]},
                                         headers=SERVICE)
        assert created.status_code == 201, created.text
        (arq,) = created.json["arqs"]
        instance = Instance(str(uuid.uuid4()), arq["uuid"], device, step, allowed)
        resp = self.placement.put(f"/allocations/{instance.uuid}", {
            "allocations": {device.rp_uuid: {"resources": {device.rc: 1}}},
            "project_id": "chaos-project", "user_id": "chaos-user",
            "consumer_generation": None, "consumer_type": "INSTANCE"})
        assert resp.status_code == 204, resp.text
        self.instances.append(instance)
        return instance

    def bind(self, *instances: Instance, via: object = None) -> None:
        """One PATCH asking the binds of ``instances``, through ``via`` or else each API
        replica in turn (as a load balancer would)."""
        body = {i.arq: [
            {"op": "add", "path": "/hostname", "value": i.device.host},
            {"op": "add", "path": "/device_rp_uuid", "value": i.device.rp_uuid},
            {"op": "add", "path": "/instance_uuid", "value": i.uuid}] for i in instances}
        self.binds += 1
        api = via or (self.api, self.api_2)[self.binds % 2]
        resp = api.simulate_patch(ARQS, json=body, headers=SERVICE)  # type: ignore[attr-defined]
        assert resp.status_code == 202, resp.text

    def boot(self, step: str, host: str | None = None) -> Instance:
        """Schedule and bind one instance that must end Bound."""
        instance = self.schedule(self.pick(host), step, {"Bound"})
        self.bind(instance)
        return instance

    def heard(self, instance: Instance) -> bool:
        return any(e.get("tag") == instance.arq for e in self.nova.events())

    def resolve(self, instance: Instance, timeout: float) -> None:
        """Wait for Nova to hear the instance's outcome, and record it (once)."""
        if instance.state is not None:
            return
        wait_until(lambda: self.heard(instance), timeout,
                   f"Nova's event for {instance.step} ARQ {instance.arq}", self.explain)
        arq = self.arq(instance.arq)
        instance.state, instance.reason = arq["state"], arq.get("bind_failure_reason")

    def retire(self, instance: Instance) -> None:
        """As Nova deleting the instance once it heard: unbind (every other one) then
        delete the ARQ, and give the allocation back."""
        self.resolve(instance, 30)
        if len([i for i in self.instances if i.retired]) % 2 == 0:
            resp = self.api.simulate_patch(ARQS, headers=SERVICE, json={instance.arq: [
                {"op": "remove", "path": p}
                for p in ("/hostname", "/device_rp_uuid", "/instance_uuid")]})
            assert resp.status_code == 202, resp.text
        resp = self.api.simulate_delete(ARQS, params={"arqs": instance.arq},
                                        headers=SERVICE)
        assert resp.status_code == 204, resp.text
        resp = self.placement.delete(f"/allocations/{instance.uuid}")
        assert resp.status_code == 204, resp.text
        instance.retired = True

    def make_room(self, keep: int) -> None:
        """Retire the oldest live instances until at most ``keep`` are left."""
        while len(self.live()) > keep:
            self.retire(self.live()[0])

    def steady(self, count: int, step: str, host: str | None = None) -> None:
        """``count`` ordinary boots, retiring the oldest beyond LIVE."""
        for _ in range(count):
            self.make_room(LIVE - 1)
            self.boot(step, host)

    # -- processes ---------------------------------------------------------------------------

    def start(self) -> None:
        for host in HOSTS:
            self.placement.create_compute_node(host)
        # The conductors listen before any agent says hello: an agent whose first hello
        # found cond-a not yet listening failed over to cond-b, and was still there when
        # step 1 killed cond-a, so it never saw that outage (a failure under load).
        for name in ("cond-b", "cond-a"):
            self.processes[name].launch()
        for name in ("cond-b", "cond-a"):
            self.processes[name].wait_ready()
        for name in ("api-2", *HOSTS):
            self.processes[name].launch()
        for name in ("api-2", *HOSTS):
            self.processes[name].wait_ready()
        for rc, name in PROFILES.items():  # one profile per request
            resp = self.api.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                                          json=[{"name": name,
                                                 "groups": [{f"resources:{rc}": "1"}]}])
            assert resp.status_code == 201, resp.text
        wanted = {n for names in DEVICES.values() for n in names}
        self.devices = wait_until(lambda: (lambda d: d if set(d) == wanted else None)(
            self.read_devices()), 30, "every device in the database", self.explain)
        wait_until(lambda: all(self.reserved(d) == 0 for d in self.devices.values()), 30,
                   "every device provider in Placement", self.explain)

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            proc.stop()
        self.api_2.close()
        self.db.dispose()

    def ring_lines(self, name: str) -> list[str]:
        """The ring changes a conductor logged (acceld.conductor.fleet.membership)."""
        return [line for line in self.processes[name].log_path.read_text(
            errors="replace").splitlines() if "Conductor ring of " in line]

    def deployable_uuid(self, device: Device) -> str:
        with self.db.read() as conn:
            return conn.execute(select(deployables.c.uuid).where(
                deployables.c.rp_uuid == device.rp_uuid)).scalar_one()

    def programmed_at(self, device: Device) -> dt.datetime | None:
        """When the fake driver of the device's host last wrote a bitstream into it."""
        path = self.dir / f"{device.host}-fake" / f"{device.name}.json"
        if not path.exists():
            return None
        return dt.datetime.fromisoformat(json.loads(path.read_text())["bitstream"]
                                         ["programmed_at"])

    def log_size(self, name: str) -> int:
        return self.processes[name].log_path.stat().st_size

    def log_since(self, name: str, since: int, until: int | None = None) -> str:
        """A process's log from byte ``since`` on (up to byte ``until``)."""
        with open(self.processes[name].log_path, "rb") as log:
            log.seek(since)
            data = log.read() if until is None else log.read(until - since)
            return data.decode(errors="replace")

    def conductor_outages(self, name: str, since: int = 0,
                          until: int | None = None) -> list[str]:
        """What a process logged of conductors going away and coming back (from byte
        ``since`` of its log on, up to byte ``until``)."""
        return [line.split(" acceld.clients.conductor ")[-1]
                for line in self.log_since(name, since, until).splitlines()
                if "Conductor http" in line and ("unavailable" in line or "again" in line)]


@pytest.fixture
def cloud(tmp_path, chaos_db_url, chaos_placement, nova) -> Iterator[Cloud]:
    cloud = Cloud(tmp_path, chaos_db_url, chaos_placement, nova)
    try:
        cloud.start()
        yield cloud
    finally:
        cloud.stop()


def test_chaos_binds_through_crashes_outages_and_a_disable(cloud: Cloud) -> None:
    started = time.monotonic()
    figures: dict[str, float] = {}

    # Warm-up: ordinary binds on both hosts, through both conductors.
    cloud.steady(6, "warm-up")

    # 1. cond-a killed -9 while it holds claims of six binds asked at once. cond-b is frozen
    # meanwhile, so that the claims are cond-a's (woken by the API) whatever the timing.
    cloud.make_room(2)
    batch = [cloud.schedule(cloud.pick(), "conductor-kill", {"Bound"}) for _ in range(6)]
    wait_until(lambda: any("2 member(s)" in line for line in cloud.ring_lines("cond-b")),
               10, "cond-b to see both conductors in the ring", cloud.explain)
    agent_log_at_kill = {host: cloud.log_size(host) for host in HOSTS}
    cloud.processes["cond-b"].freeze()
    try:
        cloud.bind(*batch, via=cloud.api)
        died_with = kill_holding_claims(cloud.processes["cond-a"], cloud.db, timeout=20)
        killed = time.monotonic()
    finally:
        cloud.processes["cond-b"].thaw()
    assert died_with >= 1
    # cond-b drops the dead conductor from the ring and owns its host too, within the
    # liveness bound (plus a heartbeat, plus the time cond-b itself was frozen).
    dead_name = cloud.names["cond-a"]
    wait_until(lambda: any(f"gone: {dead_name}" in line and "owns 2 of 2 hosts" in line
                           for line in cloud.ring_lines("cond-b")),
               RING_DEAD + 2 * RING_BEAT + 10, "cond-b to take the dead conductor's host",
               cloud.explain)
    figures["ownership_moved_s"] = time.monotonic() - killed
    cloud.steady(3, "conductor-down")
    for inst in batch:  # its claims are taken over once their lease lapsed
        cloud.resolve(inst, LEASE + 30)
    cloud.processes["cond-a"].start()
    wait_until(lambda: any(f"joined: {dead_name}" in line and "owns 1 of 2 hosts" in line
                           for line in cloud.ring_lines("cond-b")),
               10, "cond-a back in the ring with its host", cloud.explain)
    cloud.steady(3, "conductor-back")

    # 2. Placement away for OUTAGE seconds while binds keep arriving.
    cloud.make_room(3)
    waiting = [cloud.schedule(cloud.pick(), "placement-outage", {"Bound"}) for _ in range(6)]
    cloud.placement.stop()
    stopped = time.monotonic()
    for index, inst in enumerate(waiting):
        while time.monotonic() < stopped + index * OUTAGE / len(waiting):
            time.sleep(0.1)
        cloud.bind(inst)
    while time.monotonic() < stopped + OUTAGE:
        # Nothing resolves while Placement is away: every bind waits.
        assert not any(cloud.heard(i) for i in waiting), cloud.explain()
        time.sleep(0.2)
    cloud.placement.start()
    figures["placement_outage_s"] = time.monotonic() - stopped
    for inst in waiting:
        cloud.resolve(inst, 30)
    figures["placement_back_to_all_bound_s"] = time.monotonic() - stopped - \
        figures["placement_outage_s"]

    # 3. Agent chaos-2 killed -9: binds asked once its host is down wait for it (an outage,
    # up to bind_timeout) and bind once it is back; an mdev given back meanwhile keeps its
    # handle in use until the agent has removed it.
    cloud.make_room(3)
    vgpu = cloud.schedule(cloud.devices["VgpuF"], "vgpu-retired-while-agent-down", {"Bound"})
    cloud.bind(vgpu)
    cloud.resolve(vgpu, 30)
    agent_waiting = [cloud.schedule(cloud.pick("chaos-2"), "agent-down", {"Bound"})
                     for _ in range(2)]
    conductor_logs_at_kill = {name: cloud.log_size(name) for name in ("cond-a", "cond-b")}
    cloud.processes["chaos-2"].kill9()
    wait_until(lambda: cloud.host_states()["chaos-2"] == "down",
               HEARTBEAT * DOWN_AFTER + 10, "chaos-2 marked down", cloud.explain)
    # By the conductor the ring gives chaos-2, and by no other.
    owner = HashRing(cloud.names.values()).owner("chaos-2")
    marked_by = [name for name in ("cond-a", "cond-b") if "Agent of host chaos-2 is down"
                 in cloud.log_since(name, conductor_logs_at_kill[name])]
    assert [cloud.names[name] for name in marked_by] == [owner], cloud.explain()
    mdev_handle = cloud.handle_of(vgpu)
    cloud.retire(vgpu)
    cloud.bind(*agent_waiting)
    cloud.steady(2, "agent-down-elsewhere", host="chaos-1")
    assert not any(cloud.heard(i) for i in agent_waiting), cloud.explain()
    with cloud.db.read() as conn:  # the agent is still dead: nothing could remove the mdev
        assert conn.execute(select(attach_handles.c.in_use).where(
            attach_handles.c.id == mdev_handle)).scalar_one() is True
        assert conn.execute(select(handle_releases.c.id).where(
            handle_releases.c.attach_handle_id == mdev_handle)).first() is not None
    cloud.processes["chaos-2"].start()
    wait_until(lambda: cloud.host_states()["chaos-2"] == "up", 20, "chaos-2 back up",
               cloud.explain)
    for inst in agent_waiting:
        cloud.resolve(inst, 30)
    # Its devices are offered again once the sync has lifted the down host's reservation.
    wait_until(lambda: all(cloud.reserved(d) == 0 for d in cloud.devices.values()
                           if d.host == "chaos-2"), 20, "chaos-2's devices unreserved",
               cloud.explain)
    cloud.steady(2, "agent-back", host="chaos-2")

    # 4. A device disabled through the API while binds on it arrive.
    cloud.make_room(2)
    target = cloud.pick("chaos-1")
    disabled_reason = DISABLED.format(device=target.uuid)
    racer = cloud.schedule(target, "disable-race", {"Bound", disabled_reason})
    late = [cloud.schedule(target, "after-disable", {disabled_reason}) for _ in range(2)]
    cloud.bind(racer)
    resp = cloud.api.simulate_post(f"/accelerator/v2/devices/{target.uuid}/disable",
                                   headers=ADMIN)
    assert resp.status_code == 200, resp.text
    cloud.disabled.add(target.name)
    cloud.bind(*late)
    cloud.steady(3, "after-disable-elsewhere")

    # 5. cond-a frozen past its leases and marks while binds, a release and a program run.
    agent_log_at_stall = {host: cloud.log_size(host) for host in HOSTS}
    stall = _stall_a_conductor(cloud)
    figures["stall_s"] = stall.pop("stall_s")

    # 6. Nova hangs while binds arrive.
    figures.update(_hang_nova(cloud))

    # The end: every ARQ resolved, Nova heard each once, nothing queued.
    settle_from = time.monotonic()
    for inst in cloud.instances:
        if not inst.retired:
            cloud.resolve(inst, SETTLE)

    def quiet() -> bool:
        with cloud.db.read() as conn:
            return not conn.execute(select(bind_jobs.c.id)).first() and \
                not conn.execute(select(handle_releases.c.id)).first()

    wait_until(quiet, SETTLE, "no bind job or handle release left", cloud.explain)
    figures["settle_s"] = time.monotonic() - settle_from

    # Every ARQ ended as its step explains, with a true reason.
    wrong = []
    for inst in cloud.instances:
        outcome = "Bound" if inst.state == "Bound" else inst.reason or ""
        if inst.state not in ("Bound", "BindFailed") or not any(
                outcome.startswith(allowed) for allowed in inst.allowed):
            wrong.append((inst.step, inst.arq, inst.device.name, inst.state, inst.reason))
    assert wrong == [], f"{wrong}\n{cloud.explain()}"
    assert all(i.state == "Bound" for i in agent_waiting)
    assert all(i.state == "BindFailed" for i in late)
    # Exactly one Nova event per ARQ, its status the outcome's.
    events = cloud.nova.events()
    by_tag: dict[str, list[dict]] = {}
    for event in events:
        by_tag.setdefault(event["tag"], []).append(event)
    assert set(by_tag) == {i.arq for i in cloud.instances}
    for inst in cloud.instances:
        assert by_tag[inst.arq] == [{
            "name": "accelerator-request-bound", "server_uuid": inst.uuid, "tag": inst.arq,
            "status": "completed" if inst.state == "Bound" else "failed"}], by_tag[inst.arq]

    # The ARQs still there are as recorded; no handle shared, none leaked.
    live = {i.arq: i for i in cloud.live()}
    with cloud.db.read() as conn:
        rows = conn.execute(select(
            arq_table.c.uuid, arq_table.c.state, arq_table.c.attach_handle_id,
            arq_table.c.device_rp_uuid)).all()
        handles = {row.id: row for row in conn.execute(select(
            attach_handles.c.id, attach_handles.c.in_use, deployables.c.rp_uuid).select_from(
            attach_handles.join(deployables,
                                deployables.c.id == attach_handles.c.deployable_id)))}
    assert {row.uuid: row.state for row in rows} == {a: i.state for a, i in live.items()}
    bound = [row for row in rows if row.state == "Bound"]
    assert all(row.attach_handle_id in handles for row in bound)
    assert all(handles[row.attach_handle_id].rp_uuid == row.device_rp_uuid for row in bound)
    assert len({row.attach_handle_id for row in bound}) == len(bound)
    assert {h for h, row in handles.items() if row.in_use} == {
        row.attach_handle_id for row in bound}
    assert all(row.attach_handle_id is None for row in rows if row.state != "Bound")
    # On the node too: the mdevs that exist are exactly the Bound ARQs' (none leaked).
    with cloud.db.read() as conn:
        mdevs = {json.loads(info)["uuid"] for info in conn.execute(
            select(attach_handles.c.attach_info).where(
                attach_handles.c.attach_type == "MDEV",
                attach_handles.c.id.in_([row.attach_handle_id for row in bound]))).scalars()}
    assert cloud.prepared_mdevs("chaos-2") == mdevs
    # No program under a Bound ARQ: step 5's device was last written before each of its
    # ARQs still Bound was bound (a stalled program resumed after would be later).
    programmed = cloud.devices["FpgaD"]
    written = cloud.programmed_at(programmed)
    with cloud.db.read() as conn:
        bound_at = conn.execute(select(arq_table.c.updated_at).where(
            arq_table.c.state == "Bound",
            arq_table.c.device_rp_uuid == programmed.rp_uuid)).scalars().all()
    assert written is None or all(written < at.replace(tzinfo=dt.timezone.utc)
                                  for at in bound_at), (written, bound_at, stall)

    # Placement holds what the database says (the sync and its audit run every few s).
    for host in HOSTS:
        wait_until(lambda: assert_placement_matches_db(cloud.placement, cloud.db, host)
                   is None, 30, f"Placement to match the database for {host}", cloud.explain)
    assert cloud.reserved(target) == HANDLES  # the disabled device is fully reserved

    # No service logged a traceback through all of it, and each conductor process that met
    # the Placement outage logged it once when it started and once when it ended (binding
    # and the Placement sync share one record per process).
    for name, proc in cloud.processes.items():
        text = proc.log_path.read_text(errors="replace")
        assert "Traceback" not in text, f"{name} logged a traceback:\n" + _tracebacks(text)
    outage_logs: dict[str, list[str]] = {}
    for name in ("cond-a", "cond-b"):
        for line in cloud.processes[name].log_path.read_text(errors="replace").splitlines():
            if " Placement is unavailable" in line or " Placement is available again" in line:
                pid = line.split()[2]
                outage_logs.setdefault(pid, []).append(
                    "again" if "available again" in line else "start")
    assert outage_logs and all(v == ["start", "again"] for v in outage_logs.values()), \
        outage_logs

    # The agent of cond-a's host failed over when cond-a was killed and came back to it
    # after it returned, logging the outage once when it began and once when it ended
    # (its hello and host-step clients share one log); cond-b never went away for it, and the
    # other agent (chaos-2, on cond-b, started again in step 3) never lost its conductor.
    # (Step 5's freeze of cond-a is another outage for chaos-1: looked at below.)
    lines = cloud.conductor_outages("chaos-1", agent_log_at_kill["chaos-1"],
                                    agent_log_at_stall["chaos-1"])
    of_a = [line for line in lines if cloud.urls["cond-a"] in line]
    went = [line for line in of_a if "is unavailable" in line]
    back = [line for line in of_a if "is available again" in line]
    assert len(went) == len(back) == 1, lines
    assert not any("is unavailable" in line for line in lines if line not in of_a), lines
    assert not any("is unavailable" in line for line in cloud.conductor_outages(
        "chaos-2", agent_log_at_kill["chaos-2"])), cloud.processes["chaos-2"].log()
    # Frozen in step 5, cond-a was away for chaos-1 once, and back once (it fails back).
    wait_until(lambda: any("available again" in line and cloud.urls["cond-a"] in line
                           for line in cloud.conductor_outages(
                               "chaos-1", agent_log_at_stall["chaos-1"])),
               FAILBACK + 20, "chaos-1 back on cond-a after the freeze", cloud.explain)
    lines = cloud.conductor_outages("chaos-1", agent_log_at_stall["chaos-1"])
    assert [("unavailable" in line, "available again" in line) for line in lines
            if cloud.urls["cond-a"] in line] == [(True, False), (False, True)], lines

    figures["total_s"] = time.monotonic() - started
    print(f"\nchaos: {len(cloud.instances)} binds, "
          f"{sum(i.state == 'Bound' for i in cloud.instances)} Bound, "
          f"{sum(i.state == 'BindFailed' for i in cloud.instances)} BindFailed, "
          f"cond-a died holding {died_with} claims, was frozen holding {stall}; "
          + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))


def _stall_a_conductor(cloud: Cloud) -> dict[str, object]:
    """Step 5: ask at once (through cond-a) the release of an mdev, a program of FpgaD and
    binds on FpgaD and the vGPU; freeze cond-a as soon as it holds one of those claims (or
    the programming mark), for FREEZE seconds; thaw it. What it held is returned."""
    vgpu, fpga = cloud.devices["VgpuF"], cloud.devices["FpgaD"]
    cloud.make_room(0)
    before = [cloud.schedule(vgpu, "stall-before", {"Bound"}) for _ in range(2)]
    cloud.bind(*before, via=cloud.api)
    for inst in before:
        cloud.resolve(inst, 30)
    busy = f"deployable {fpga.host}_{fpga.name} is being programmed"
    racers = [cloud.schedule(fpga, "stall-program-race", {"Bound", busy}),
              cloud.schedule(vgpu, "stall-mdev", {"Bound"}),
              cloud.schedule(vgpu, "stall-mdev", {"Bound"})]
    cloud.retire(before[0])  # its mdev's release: cond-a's (chaos-2 is its host)
    deployable = cloud.deployable_uuid(fpga)
    program = cloud.api_2.simulate_patch(  # the API process: it has the internal secret
        f"/accelerator/v2/deployables/{deployable}/program",
        headers={**ADMIN, **version("2.5")},
        json=[{"path": "/program", "op": "replace", "value": [{"image_uuid": IMAGE}]}])
    assert program.status_code == 202, program.text
    cloud.bind(*racers, via=cloud.api)
    started = time.monotonic()
    held = freeze_holding_claims(cloud.processes["cond-a"], cloud.db, timeout=10)
    try:
        # The stall itself: cond-b and the agents go on, cond-a's leases and mark lapse.
        time.sleep(FREEZE)
    finally:
        cloud.processes["cond-a"].thaw()
    for inst in racers:
        cloud.resolve(inst, LEASE + 60)
    wait_until(lambda: cloud.api.simulate_get(
        f"/accelerator/v2/deployables/{deployable}", headers={**ADMIN, **version("2.5")}
    ).json.get("program_status") != "PROGRAMMING", 60, "the program to end", cloud.explain)
    return {**held, "stall_s": time.monotonic() - started}


def _hang_nova(cloud: Cloud) -> dict[str, float]:
    """Step 6: SILENT_BINDS binds, one PATCH each, asked while Nova accepts connections and
    never answers, for NOVA_SILENCE seconds. Each must be Bound in the database before Nova
    answers again, none heard until then, each heard after; each conductor's log holds the
    hang's start at most once and its end at most once (nothing if it sent no event
    meanwhile; no end yet if it has called Nova no more since), one conductor both."""
    cloud.make_room(0)
    instances = [cloud.schedule(cloud.pick(), "nova-hangs", {"Bound"})
                 for _ in range(SILENT_BINDS)]
    logs_at = {name: cloud.log_size(name) for name in ("cond-a", "cond-b")}
    with cloud.nova.silenced():
        silenced = time.monotonic()
        for inst in instances:
            cloud.bind(inst)
        wait_until(lambda: all(cloud.arq(i.arq)["state"] == "Bound" for i in instances),
                   NOVA_SILENCE - 2, "every bind Bound while Nova hangs", cloud.explain)
        all_bound_s = time.monotonic() - silenced
        while time.monotonic() < silenced + NOVA_SILENCE:
            assert not any(cloud.heard(i) for i in instances), cloud.explain()
            time.sleep(0.2)
    assert cloud.nova.unanswered >= 1, "no event was sent while Nova hung"
    answered = time.monotonic()
    for inst in instances:
        cloud.resolve(inst, 30)
    heard_s = time.monotonic() - answered
    outage_lines = {}
    for name, since in logs_at.items():
        outage_lines[name] = [
            "start" if "is unavailable" in line else "again"
            for line in cloud.log_since(name, since).splitlines()
            if " Nova is unavailable" in line or " Nova is available again" in line]
    assert any(outage_lines.values()), cloud.explain()
    # Once each way per conductor, never a line per retry. A conductor logs the end at its
    # first call Nova answers: one whose failed events the other conductor delivered (any
    # conductor retries a job whose lease was given up) has made no such call yet, and says
    # so at its next one; at least one conductor must have seen both.
    assert all(lines in ([], ["start"], ["start", "again"])
               for lines in outage_lines.values()), outage_lines
    assert ["start", "again"] in outage_lines.values(), outage_lines
    return {"nova_hang_all_bound_s": all_bound_s, "nova_back_to_all_heard_s": heard_s}


def _tracebacks(text: str) -> str:
    """Each traceback in a log with the lines around it (the whole log is too long for a
    failure message, and its tail rarely holds the traceback)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback" in line]
    return "\n----\n".join("\n".join(lines[max(0, i - 5):i + 40]) for i in starts[:3])
