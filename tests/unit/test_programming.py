"""Programming in process: API -> conductor -> agent -> fake driver, over real internal HTTP.

The conductor's programming component and the agent's programming route run
on internal servers (signed calls, loopback, free ports); the API app calls
the conductor through its real client; the fake driver records what it was
given. Every failure must leave ``bitstream_id`` as it was.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid

import pytest
from sqlalchemy import select, update

from acceld.agent import images
from acceld.agent.programming import Programming
from acceld.conductor.programming import Programmer, ProgramError
from acceld.db import leases
from acceld.db.models import agents, deployables
from acceld.drivers.fake import FakeDriver
from acceld.drivers.pci import PciDriver
from tests.conftest import make_conf
from tests.helpers import fault
from tests.support.glance import GlanceServer
from tests.support.programming import DATA, FIRMWARE, HOST, IMAGE, SECRET, Chain


@pytest.fixture
def bitstreams(tmp_path):
    directory = tmp_path / "bitstreams"
    directory.mkdir()
    (directory / IMAGE).write_bytes(DATA)
    (directory / FIRMWARE).write_bytes(b"firmware image")
    return directory


def _chain(tmp_path, db, bitstreams):  # type: ignore[no-untyped-def]
    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(bitstreams),
                     conductor__program_timeout=5)
    built = Chain(conf, db)
    yield built
    built.stop()


@pytest.fixture
def chain(tmp_path, sqlite_db, bitstreams):
    """The request path is the same on every database: SQLite keeps these tests quick."""
    yield from _chain(tmp_path, sqlite_db, bitstreams)


@pytest.fixture
def any_db_chain(tmp_path, db, bitstreams):
    """For what the database decides (the program lease): every backend."""
    yield from _chain(tmp_path, db, bitstreams)


def upstream_body(image=IMAGE):
    return [{"path": "/program", "op": "replace", "value": [{"image_uuid": image}]}]


def test_upstream_form_programs_and_records(chain):
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 200, result.text
    assert result.json["uuid"] == chain.dep["uuid"]
    assert result.json["bitstream_id"] == IMAGE
    assert chain.bitstream() == IMAGE
    recorded = chain.fake.programmed("FakeDevice")["bitstream"]
    assert recorded["sha256"] == hashlib.sha256(DATA).hexdigest()


def test_sdk_doubled_path(chain):
    uuid_ = chain.dep["uuid"]
    result = chain.patch(f"{uuid_}/program/{uuid_}", upstream_body())
    assert result.status_code == 200, result.text
    assert chain.bitstream() == IMAGE


@pytest.mark.parametrize("op", ["add", "replace"])
def test_seed_form_bitstream(chain, op):
    result = chain.patch(chain.dep["uuid"], [{"path": "/bitstream", "op": op, "value": IMAGE}])
    assert result.status_code == 204, result.text
    assert result.content == b""
    assert chain.bitstream() == IMAGE


def test_seed_form_firmware_runs_the_driver_and_keeps_bitstream_id(chain):
    result = chain.patch(chain.dep["uuid"], [{"path": "/firmware", "op": "add",
                                              "value": FIRMWARE}])
    assert result.status_code == 204, result.text
    assert chain.bitstream() is None
    recorded = chain.fake.programmed("FakeDevice")
    assert recorded["firmware"]["sha256"] == hashlib.sha256(b"firmware image").hexdigest()
    assert "bitstream" not in recorded


def test_unknown_image_is_400_and_changes_nothing(chain):
    assert chain.patch(f"{chain.dep['uuid']}/program", upstream_body()).status_code == 200
    unknown = str(uuid.uuid4())
    for url, body in [(f"{chain.dep['uuid']}/program", upstream_body(unknown)),
                      (chain.dep["uuid"], [{"path": "/bitstream", "op": "add",
                                            "value": unknown}])]:
        result = chain.patch(url, body)
        assert result.status_code == 400
        assert unknown in fault(result)
    assert chain.bitstream() == IMAGE


def test_driver_failure_is_502_and_changes_nothing(chain):
    db = chain.db
    # The deployable's stored name points at one the fake driver does not have.
    with db.write() as conn:
        conn.execute(update(deployables).where(deployables.c.id == chain.dep["id"])
                     .values(name=f"{HOST}_Missing"))
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 502
    assert "Missing" in fault(result)
    assert chain.bitstream() is None


def test_driver_not_loaded_is_503(chain):
    db = chain.db
    with db.write() as conn:
        conn.execute(update(deployables).where(deployables.c.id == chain.dep["id"])
                     .values(driver_name="intel_fpga"))
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 503
    assert "intel_fpga" in fault(result)
    assert chain.bitstream() is None


def test_driver_that_cannot_program_firmware_is_400(tmp_path, sqlite_db, bitstreams):
    db = sqlite_db
    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(bitstreams),
                     pci_driver__sysfs_root=str(tmp_path / "nosys"))
    built = Chain(conf, db, drivers={"fake": PciDriver(conf, HOST)})
    try:
        result = built.patch(built.dep["uuid"], [{"path": "/firmware", "op": "add",
                                                  "value": FIRMWARE}])
        assert result.status_code == 400
        assert "firmware" in fault(result)
        assert built.bitstream() is None
    finally:
        built.stop()


def test_agent_down_or_unreachable_is_503(chain):
    db = chain.db
    with db.write() as conn:
        conn.execute(update(agents).values(state="down"))
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 503
    assert "down" in fault(result)
    chain.agent.stop()
    with db.write() as conn:
        conn.execute(update(agents).values(state="up"))
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 503
    assert "could not be reached" in fault(result)
    assert chain.bitstream() is None


def test_no_agent_registered_is_503(chain):
    db = chain.db
    with db.write() as conn:
        conn.execute(agents.delete())
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 503
    assert HOST in fault(result)


def test_wrong_internal_secret_is_502(chain):
    chain.component.programmer = Programmer(chain.conf, chain.db, b"another secret")
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 502
    assert "shared_secret" in fault(result)


def test_programs_of_one_deployable_are_serialised(any_db_chain, db):
    """A program waits while another holds the deployable's lease, then runs."""
    chain = any_db_chain
    name = f"program:{chain.dep['uuid']}"
    assert leases.acquire(db, name, "someone-else", 60)
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(
        chain.patch(f"{chain.dep['uuid']}/program", upstream_body()).status_code))
    thread.start()
    time.sleep(0.6)
    assert done == [] and chain.bitstream() is None  # still waiting for the lease
    assert leases.release(db, name, "someone-else")
    thread.join(10)
    assert done == [200]
    assert chain.bitstream() == IMAGE


def test_lease_not_given_back_in_time_is_409(chain):
    db = chain.db
    chain.conf.set_override("program_timeout", 1, group="conductor")
    assert leases.acquire(db, f"program:{chain.dep['uuid']}", "someone-else", 60)
    started = time.monotonic()
    result = chain.patch(f"{chain.dep['uuid']}/program", upstream_body())
    assert result.status_code == 409
    assert time.monotonic() - started >= 1  # program_timeout
    assert chain.bitstream() is None


def test_agent_lock_serialises_programs(tmp_path, bitstreams):
    """Two programs of one deployable never overlap inside the agent."""
    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(bitstreams))
    fake = FakeDriver(conf, HOST)
    active, overlaps = [0], [0]
    original = fake.program

    def slow_program(name, path, kind="bitstream"):  # type: ignore[no-untyped-def]
        active[0] += 1
        overlaps[0] = max(overlaps[0], active[0])
        time.sleep(0.2)
        original(name, path, kind)
        active[0] -= 1

    fake.program = slow_program  # type: ignore[method-assign]
    routes = Programming(conf, {"fake": fake}.get)
    request = {"driver_name": "fake", "deployable_name": "FakeDevice", "kind": "bitstream",
               "image_id": IMAGE}
    threads = [threading.Thread(target=routes.program, args=(request,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert overlaps[0] == 1
    assert fake.programmed("FakeDevice")["bitstream"]["size"] == len(DATA)


def test_function_id_resolves_through_glance(tmp_path, sqlite_db):
    db = sqlite_db
    glance = GlanceServer().start()
    try:
        glance.store.add(IMAGE, DATA, **{"accel:function_id": "crypto-v1"})
        conf = make_conf(str(tmp_path), glance__auth_type="none",
                         glance__endpoint_override=glance.url)
        built = Chain(conf, db)
        try:
            programmer = Programmer(conf, db, SECRET)
            assert programmer.program(built.dep["uuid"], "bitstream",
                                      function_id="crypto-v1") == IMAGE
            assert built.bitstream() == IMAGE
            with pytest.raises(ProgramError) as info:
                programmer.program(built.dep["uuid"], "bitstream", function_id="nothing")
            assert info.value.status == 400
            assert built.bitstream() == IMAGE
            # Through the API with a Glance image: downloaded, programmed, recorded.
            glance.store.add(FIRMWARE, b"second", **{"accel:function_id": "x"})
            result = built.patch(f"{built.dep['uuid']}/program", upstream_body(FIRMWARE))
            assert result.status_code == 200 and result.json["bitstream_id"] == FIRMWARE
            assert ("GET", f"/v2/images/{FIRMWARE}/file") in [
                r[:2] for r in glance.store.requests]
        finally:
            built.stop()
    finally:
        glance.stop()


@pytest.mark.parametrize("request_body, words", [
    ([], "JSON object"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "kind": "x", "image_id": IMAGE},
     "kind"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": "../etc"}, "uuid"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice"}, "exactly one"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": IMAGE,
      "function_id": "f"}, "exactly one"),
    ({"deployable_name": "FakeDevice", "image_id": IMAGE}, "driver_name"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": IMAGE, "x": 1},
     "Unknown"),
])
def test_agent_refuses_malformed_requests(tmp_path, bitstreams, request_body, words):
    from acceld.agent.programming import ProgramFailed

    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(bitstreams))
    routes = Programming(conf, {"fake": FakeDriver(conf, HOST)}.get)
    with pytest.raises(ProgramFailed) as info:
        routes.program(request_body)
    assert info.value.status == 400
    assert words in info.value.message


def test_image_source_is_chosen_by_config(tmp_path):
    assert isinstance(images.from_config(make_conf(str(tmp_path))), images.NoSource)


# Microversion 2.5: programs started asynchronously (202) and followed on the deployable.

V25 = {"OpenStack-API-Version": "accelerator 2.5"}


def _patch_25(chain, body):  # type: ignore[no-untyped-def]
    from tests.helpers import ADMIN

    return chain.client.simulate_patch(
        f"/accelerator/v2/deployables/{chain.dep['uuid']}/program", json=body,
        headers={**ADMIN, **V25})


def _program_status(chain) -> tuple:  # type: ignore[no-untyped-def]
    with chain.db.read() as conn:
        return tuple(conn.execute(select(deployables.c.program_status,
                                         deployables.c.program_reason)
                                  .where(deployables.c.id == chain.dep["id"])).one())


def test_at_2_5_an_agent_that_is_down_is_503_at_once_and_nothing_starts(chain):
    with chain.db.write() as conn:
        conn.execute(update(agents).values(state="down"))
    result = _patch_25(chain, upstream_body())
    assert result.status_code == 503
    assert "down" in fault(result)
    assert _program_status(chain) == (None, None)


def test_at_2_5_a_driver_failure_is_recorded_on_the_deployable(chain):
    with chain.db.write() as conn:
        conn.execute(update(deployables).where(deployables.c.id == chain.dep["id"])
                     .values(name=f"{HOST}_Missing"))
    result = _patch_25(chain, upstream_body())
    assert result.status_code == 202, result.text
    deadline = time.monotonic() + 10
    while _program_status(chain)[0] == "PROGRAMMING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status, reason = _program_status(chain)
    assert status == "FAILED" and reason.startswith("502: ") and "Missing" in reason
    assert chain.bitstream() is None


def _device_events(chain) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    from sqlalchemy import select as sa_select

    from acceld.db.models import device_events, devices

    with chain.db.read() as conn:
        device_uuid = conn.execute(sa_select(devices.c.uuid).join(
            deployables, deployables.c.device_id == devices.c.id).where(
            deployables.c.id == chain.dep["id"])).scalar_one()
        return [(r.kind, r.detail) for r in conn.execute(
            sa_select(device_events).where(device_events.c.device_uuid == device_uuid)
            .order_by(device_events.c.id))]


def test_programs_are_device_events_success_and_failure(chain):
    """Issue 13: a program's outcome is in the device's history (success and failure)."""
    assert chain.patch(f"{chain.dep['uuid']}/program", upstream_body()).status_code == 200
    with chain.db.write() as conn:
        conn.execute(update(deployables).where(deployables.c.id == chain.dep["id"])
                     .values(name=f"{HOST}_Missing"))
    assert chain.patch(f"{chain.dep['uuid']}/program", upstream_body()).status_code == 502
    events = _device_events(chain)
    assert [kind for kind, _ in events] == ["program_succeeded", "program_failed"]
    assert IMAGE in events[0][1] and "bitstream" in events[0][1]
    assert "Missing" in events[1][1]
