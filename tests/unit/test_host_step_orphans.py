"""Orphaned host steps are found and released (issue 11 item 7).

An orphan is a host-step resource acceld made (an mdev) that no handle in use accounts
for: left by a prepare whose bind went away in a way the bind path could not see (a
release that overtook a prepare which then landed after its conductor died, an agent state
restored, a database restored from backup). The agent reports what acceld made on its node,
at start and every discovery interval; the conductor decides against the database and
queues the release of those whose handle is free; the release worker has the agent remove
them. A resource whose handle is in use, or that no handle names, is never touched.
"""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import select, update

from acceld.agent.attach import AttachFailed, AttachSteps
from acceld.agent.host_steps import HostStepJournal, host_steps
from acceld.agent.service import Agent
from acceld.clients.internal import InternalClient, InternalError
from acceld.conductor.fleet.agents import AgentsComponent
from acceld.conductor.binding.handle_release import HandleReleaseComponent, ReleaseWorker
from acceld.conductor.service import Conductor
from acceld.db import handle_releases
from acceld.db.models import agents, attach_handles
from acceld.drivers.base import AttachHandle
from acceld.drivers.fake import FakeDriver
from acceld.internal import auth
from acceld.internal.auth import CONDUCTOR
from acceld.runtime.secrets import ensure_secret_file, internal_secret
from tests.conftest import count_queries, make_conf
from tests.support.sysfs_fixtures import SysfsTree
from tests.unit.test_attach_handles import HOST, Node, mdev_uuid
from tests.unit.test_driver_nvidia_gpu import driver as nvidia_driver

T4 = "0000:06:00.0"
FOREIGN = "5d0a2b44-0000-4000-8000-000000000001"  # an mdev made by Nova or an operator


# --- How acceld recognises its own: the NVIDIA driver on a fixture sysfs ----------------

def test_nvidia_reports_the_mdevs_it_created_and_never_a_foreign_one(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci(T4, "0x10de", "0x1eb8", "0x030200", driver="nvidia")
    tree.add_mdev_type(T4, "nvidia-223", "GRID T4-2B", 8)
    drv = nvidia_driver(tmp_path, tree, use_nvml=False, enabled_vgpu_types=["nvidia-223"])
    assert drv.prepared_attach_handles() == []
    handle = drv.discover()[0].deployables[0].attach_handles[2]
    drv.prepare_attach_handle(handle)
    tree.add_mdev(T4, "nvidia-223", handle.attach_info["uuid"])  # the kernel made it
    tree.add_mdev(T4, "nvidia-223", FOREIGN)
    types = tree.device_dir(T4) / "mdev_supported_types" / "nvidia-223"
    (types / "available_instances").write_text("6\n")
    assert drv.prepared_attach_handles() == [handle]
    # The report names it exactly as discovery does, so the conductor finds its handle.
    assert handle in drv.discover()[0].deployables[0].attach_handles


# --- The conductor's decision, on every backend ------------------------------------------

@pytest.fixture
def node(tmp_path, db):
    built = Node(tmp_path, db, handles=2)
    built.start_agent()
    yield built
    built.stop_agent()


def leak(node: Node) -> str:
    """An mdev prepared on the host for a free handle (what a lost prepare leaves)."""
    with node.db.read() as conn:
        info = conn.execute(select(attach_handles.c.attach_info).where(
            attach_handles.c.in_use.is_(False)).order_by(attach_handles.c.id)).scalars().first()
    node.fake.prepare_attach_handle(AttachHandle("MDEV", json.loads(info)))
    return mdev_uuid(info)


def foreign(node: Node) -> str:
    """An mdev the fake driver made that no handle of the inventory names."""
    [handle] = node.fake.discover()[0].deployables[0].attach_handles[:1]
    info = {**handle.attach_info, "uuid": FOREIGN, "vgpu_mark": "elsewhere"}
    node.fake.prepare_attach_handle(AttachHandle("MDEV", info))
    return FOREIGN


def test_free_handles_are_queued_used_and_unknown_ones_left_alone(node):
    bound = node.bind()
    assert node.arq(bound)["state"] == "Bound"
    [used] = node.prepared()
    orphan = leak(node)
    stranger = foreign(node)
    outcome = handle_releases.queue_orphans(node.db, HOST, [
        (s["driver_name"], s["attach_type"], s["attach_info"]) for s in host_steps([node.fake])])
    assert len(outcome["queued"]) == 1 and len(outcome["in_use"]) == 1
    assert len(outcome["unknown"]) == 1
    assert node.release_all() == 1
    assert node.prepared() == {used, stranger}  # the orphan is gone, the rest untouched
    assert orphan not in node.prepared()
    assert [mdev_uuid(i) for i in node.in_use()] == [used] and node.queue() == []
    assert node.arq(bound)["state"] == "Bound"


def test_a_report_of_handles_in_use_costs_one_select(node):
    """The steady state (every reported mdev belongs to a bound VM), on every node and
    discovery interval: one read, no write transaction, nothing queued."""
    for _ in range(2):
        assert node.arq(node.bind())["state"] == "Bound"
    steps = [(s["driver_name"], s["attach_type"], s["attach_info"])
             for s in host_steps([node.fake])]
    assert len(steps) == 2
    with count_queries(node.db) as statements:
        outcome = handle_releases.queue_orphans(node.db, HOST, steps)
    assert outcome == {"queued": [], "in_use": outcome["in_use"], "unknown": []}
    assert len(outcome["in_use"]) == 2
    assert len(statements) == 1 and statements[0].lstrip().upper().startswith("SELECT"), \
        statements


def test_a_bind_taking_the_handle_after_the_read_wins(node, request):
    """The report was read (the handle free), then a bind took the orphan's handle and
    committed, before the conductor queued it: the compare-and-set sees the handle in use
    and queues nothing (the bind's prepare reuses the mdev)."""
    orphan = leak(node)
    real = handle_releases.host_handles
    taken: list[str] = []

    def read_then_bind(conn, hostname, types):
        known = real(conn, hostname, types)
        taken.append(node.bind())  # another transaction, committed before our update
        return known

    handle_releases.host_handles = read_then_bind
    request.addfinalizer(lambda: setattr(handle_releases, "host_handles", real))
    outcome = handle_releases.queue_orphans(node.db, HOST, [
        (s["driver_name"], s["attach_type"], s["attach_info"]) for s in host_steps([node.fake])])
    assert node.arq(taken[0])["state"] == "Bound"
    assert outcome["queued"] == [] and len(outcome["in_use"]) == 1
    assert node.queue() == [] and orphan in node.prepared()


# --- Agent and conductor in one process: at start and on the discovery interval ----------

@pytest.fixture
def cluster(tmp_path, sqlite_db):
    ensure_secret_file(str(tmp_path))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"type": "FPGA", "attach_type": "MDEV",
                                 "attach_handles": 3}]))
    conf = make_conf(str(tmp_path), conductor__port=0, agent__port=0,
                     agent__heartbeat_interval=3600, agent__discovery_interval=3600,
                     conductor__agent_check_interval=3600, conductor__bind_poll_interval=3600,
                     fake_driver__spec_file=str(spec))
    conf.set_override("connection", str(sqlite_db.url), group="database")
    releases = HandleReleaseComponent(conf, sqlite_db)
    conductor = Conductor(conf, sqlite_db, [AgentsComponent(conf, sqlite_db), releases])
    conductor.start()
    conf.set_override("url", conductor.server.url, group="conductor")
    started: list[Agent] = []

    def agent() -> Agent:
        a = Agent(conf, "node1", drivers=[FakeDriver(conf, "node1")])
        started.append(a)
        return a.start()

    yield conf, sqlite_db, agent
    for a in started:
        a.stop()
    conductor.stop()


def _wait(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def queued(db) -> list:
    with db.read() as conn:
        return list(handle_releases.pending(conn))


def handles_of(db) -> list:
    with db.read() as conn:
        return conn.execute(select(attach_handles.c.attach_info, attach_handles.c.in_use)
                            .order_by(attach_handles.c.id)).all()


def endpoint_of(db, host: str = "node1") -> str | None:
    with db.read() as conn:
        return conn.execute(select(agents.c.endpoint).where(agents.c.hostname == host)).scalar()


def test_agent_reports_orphans_at_start_and_each_interval(cluster):
    conf, db, agent = cluster
    first = agent()
    _wait(lambda: len(handles_of(db)) == 3)
    # A prepare whose bind is gone left an mdev; then the agent restarts.
    fake = first.drivers[0]
    infos = [json.loads(h.attach_info) for h in handles_of(db)]
    fake.prepare_attach_handle(AttachHandle("MDEV", infos[0]))
    first.stop()
    second = agent()
    _wait(lambda: len(queued(db)) == 1)  # reported at start, queued by the conductor
    _wait(lambda: endpoint_of(db) == second.endpoint())  # its hello is in: releases reach it
    assert [h.in_use for h in handles_of(db)] == [True, False, False]
    assert ReleaseWorker(conf, db).run_once() == 1
    assert second.drivers[0].prepared_attach_handles() == []
    assert [h.in_use for h in handles_of(db)] == [False, False, False] and queued(db) == []
    # A handle in use keeps its mdev; a new orphan is found by the next interval's pass.
    with db.write() as conn:
        conn.execute(update(attach_handles).where(
            attach_handles.c.attach_info == json.dumps(infos[1], separators=(",", ":")))
            .values(in_use=True))
    for info in infos[1:]:
        second.drivers[0].prepare_attach_handle(AttachHandle("MDEV", info))
    answer = second.host_step_audit.once()
    assert len(answer["queued"]) == 1 and answer["in_use"] == 1
    assert ReleaseWorker(conf, db).run_once() == 1
    assert second.drivers[0].prepared_attach_handles() == [AttachHandle("MDEV", infos[1])]


def test_report_route_takes_only_a_node_key_and_a_well_formed_body(cluster):
    conf, db, agent = cluster
    agent()
    _wait(lambda: len(handles_of(db)) == 3)
    secret = internal_secret(conf)
    as_node = InternalClient(conf.conductor.url[0], auth.Signer(auth.node_key(secret, "node1"),
                                                             "node1"), destination=CONDUCTOR)
    as_cloud = InternalClient(conf.conductor.url[0], auth.Signer(secret), destination=CONDUCTOR)
    path = "/attach-handles/host-steps"
    with pytest.raises(InternalError) as refused:
        as_cloud.call("POST", path, {"host_steps": []})
    assert refused.value.status == 400 and "key of the node" in refused.value.message
    good = {"driver_name": "fake", "attach_type": "MDEV", "attach_info": {"uuid": "u"}}
    for body in (None, [], {}, {"host_steps": [{**good, "attach_type": "USB"}]},
                 {"host_steps": [{**good, "attach_info": {"uuid": 5}}]},
                 {"host_steps": [{**good, "attach_info": {}}]},
                 {"host_steps": [good], "extra": 1},
                 {"host_steps": [good] * 4097}):
        with pytest.raises(InternalError) as bad:
            as_node.call("POST", path, body)
        assert bad.value.status == 400, body
    assert as_node.call("POST", path, {"host_steps": [good]}) == {
        "queued": [], "in_use": 0, "unknown": 1}
    # Another node's key reports for that node only: node1's handles are not its to free.
    infos = [json.loads(h.attach_info) for h in handles_of(db)]
    other = InternalClient(conf.conductor.url[0], auth.Signer(auth.node_key(secret, "node2"),
                                                           "node2"), destination=CONDUCTOR)
    answer = other.call("POST", path, {"host_steps": [
        {"driver_name": "fake", "attach_type": "MDEV", "attach_info": infos[0]}]})
    assert answer == {"queued": [], "in_use": 0, "unknown": 1} and queued(db) == []


# --- The agent's journal: acceld's own steps, even those a driver cannot mark -------------

def _fake_steps(tmp_path, fail: list[str] | None = None):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"type": "FPGA", "attach_type": "MDEV", "attach_handles": 1,
                                 "fail_attach": fail or []}]))
    fake = FakeDriver(make_conf(str(tmp_path), fake_driver__spec_file=str(spec)), HOST)
    [handle] = fake.discover()[0].deployables[0].attach_handles
    journal = HostStepJournal(str(tmp_path / "journal"))
    body = {"driver_name": "fake", "deployable_name": "FakeDevice", "attach_type": "MDEV",
            "attach_info": handle.attach_info}
    return AttachSteps({"fake": fake}.get, HOST, journal), journal, spec, body, handle


def test_journal_holds_a_step_from_before_its_prepare_until_its_release(tmp_path):
    steps, journal, spec, body, handle = _fake_steps(tmp_path)
    steps.run("prepare", body)
    assert journal.entries() == [("fake", handle)]
    steps.run("prepare", body)  # idempotent: one record
    assert journal.entries() == [("fake", handle)]
    steps.run("release", body)
    assert journal.entries() == []


def test_journal_forgets_a_refused_first_prepare_but_not_an_earlier_success(tmp_path):
    steps, journal, spec, body, handle = _fake_steps(tmp_path, fail=["prepare"])
    with pytest.raises(AttachFailed):
        steps.run("prepare", body)
    assert journal.entries() == []  # the driver's refused prepare left nothing
    spec.write_text(json.dumps([{"type": "FPGA", "attach_type": "MDEV", "attach_handles": 1}]))
    steps.run("prepare", body)
    spec.write_text(json.dumps([{"type": "FPGA", "attach_type": "MDEV", "attach_handles": 1,
                                 "fail_attach": ["prepare", "release"]}]))
    with pytest.raises(AttachFailed):
        steps.run("prepare", body)  # a retry fails, the first one's mdev is still there
    with pytest.raises(AttachFailed):
        steps.run("release", body)
    assert journal.entries() == [("fake", handle)]


def test_a_prepare_that_cannot_be_journaled_is_not_run(tmp_path):
    steps, journal, spec, body, handle = _fake_steps(tmp_path)
    (tmp_path / "journal").write_text("not a directory")
    with pytest.raises(AttachFailed) as refused:
        steps.run("prepare", body)
    assert refused.value.status == 502 and "could not record the host step" in \
        refused.value.message
    assert steps.find_driver("fake").attach_state() == {}


def test_vfio_vgpu_types_are_known_as_acceld_s_from_the_journal_only(tmp_path):
    tree = SysfsTree(tmp_path / "sys")
    tree.add_pci("0000:41:00.0", "0x10de", "0x2335", "0x030200", driver="nvidia")
    vfs = [f"0000:41:00.{i}" for i in range(4, 7)]
    tree.add_vfs("0000:41:00.0", vfs, "0x2335", driver="nvidia", total=16)
    # One 18C vGPU runs (time-sliced, MIG off): the free VFs list only that type now.
    types = {1418: "NVIDIA H200X-18C"}
    tree.add_nvidia_vfio(vfs[0], types)
    tree.add_nvidia_vfio(vfs[1], types)
    tree.add_nvidia_vfio(vfs[2], {}, current=1418)  # set by someone else: never reported
    drv = nvidia_driver(tmp_path, tree, use_nvml=False, enabled_vgpu_types=["NVIDIA H200X-18C"],
                        vgpu_max_instances={"NVIDIA H200X-18C": 7})
    handle = drv.discover()[0].deployables[0].attach_handles[0]
    journal = HostStepJournal(str(tmp_path / "journal"))
    steps = AttachSteps({drv.name: drv}.get, "node1", journal)
    body = {"driver_name": drv.name, "deployable_name": "x", "attach_type": "PCI",
            "attach_info": handle.attach_info}
    steps.run("prepare", body)
    current = tree.device_dir(vfs[0]) / "nvidia" / "current_vgpu_type"
    assert current.read_text() == "1418"
    assert drv.prepared_attach_handles() == []  # a VF's vGPU type carries no mark
    assert host_steps([drv], journal) == [{"driver_name": drv.name, "attach_type": "PCI",
                                           "attach_info": handle.attach_info}]
    steps.run("release", body)
    assert current.read_text() == "0" and host_steps([drv], journal) == []
