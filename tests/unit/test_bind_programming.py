"""Binding programs the FPGA first when the profile group names a bitstream or a function.

The bind worker runs in process; it reaches the agent (fake driver) through
the real conductor programming client over loopback, as in a running cloud.
"""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import select, update

from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.programming import Programmer
from acceld.db.models import attach_handles, deployables
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE
from tests.support.programming import DATA, HOST, IMAGE, Chain

ARQ_URL = "/accelerator/v2/accelerator_requests"
OTHER = str(uuid.uuid4())


@pytest.fixture
def chain(tmp_path, sqlite_db):
    directory = tmp_path / "bitstreams"
    directory.mkdir()
    (directory / IMAGE).write_bytes(DATA)
    (directory / f"{IMAGE}.json").write_text(json.dumps({"accel:function_id": "crypto-v1"}))
    (directory / OTHER).write_bytes(b"other")
    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(directory),
                     conductor__program_timeout=5)
    built = Chain(conf, sqlite_db, handles=4)
    yield built
    built.stop()


def bind(chain, group: dict[str, str], name: str | None = None) -> dict:
    """One ARQ of a one-group profile (made here unless ``name`` names one), bound to the
    fake deployable; the bind completed."""
    arq_uuid = request_bind(chain, group, name)
    run_binds(chain)
    return show(chain, arq_uuid)


def run_binds(chain) -> None:
    worker = BindWorker(chain.conf, chain.db)
    while worker.run_once():
        pass


def show(chain, arq_uuid: str) -> dict:
    return chain.client.simulate_get(f"{ARQ_URL}/{arq_uuid}", headers={
        **SERVICE, "OpenStack-API-Version": "accelerator 2.4"}).json


def request_bind(chain, group: dict[str, str], name: str | None = None) -> str:
    """An ARQ of a one-group profile, its bind asked for (the job pending); its uuid."""
    client = chain.client
    if name is None:
        name = f"dp-{uuid.uuid4().hex[:8]}"
        assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
            {"name": name, "groups": [{"resources:FPGA": "1", **group}]}]).status_code == 201
    [arq] = client.simulate_post(ARQ_URL, json={"device_profile_name": name},
                                 headers=SERVICE).json["arqs"]
    ops = [{"op": "add", "path": "/hostname", "value": HOST},
           {"op": "add", "path": "/device_rp_uuid", "value": chain.dep["rp_uuid"]},
           {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
    assert client.simulate_patch(ARQ_URL, json={arq["uuid"]: ops},
                                 headers=SERVICE).status_code == 202
    return arq["uuid"]


def programmed_at(chain) -> str | None:
    record = chain.fake.programmed("FakeDevice").get("bitstream")
    return record and record["programmed_at"]


def test_bitstream_id_programs_before_binding(chain):
    arq = bind(chain, {"accel:bitstream_id": IMAGE})
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    assert chain.bitstream() == IMAGE
    assert chain.fake.programmed("FakeDevice")["bitstream"]["size"] == len(DATA)


def test_function_id_is_resolved_by_the_agent(chain):
    arq = bind(chain, {"accel:function_id": "crypto-v1"})
    assert arq["state"] == "Bound", arq.get("bind_failure_reason")
    assert chain.bitstream() == IMAGE


def test_a_deployable_holding_the_image_is_not_programmed_again(chain):
    assert bind(chain, {"accel:bitstream_id": IMAGE})["state"] == "Bound"
    first = programmed_at(chain)
    assert bind(chain, {"accel:function_id": "crypto-v1"})["state"] == "Bound"
    assert programmed_at(chain) == first


def test_no_reprogramming_under_bound_users(chain):
    assert bind(chain, {"accel:bitstream_id": IMAGE})["state"] == "Bound"
    arq = bind(chain, {"accel:bitstream_id": OTHER})
    assert arq["state"] == "BindFailed"
    assert "in use" in arq["bind_failure_reason"]
    assert chain.bitstream() == IMAGE


def test_reprogrammed_when_free(chain):
    assert bind(chain, {"accel:bitstream_id": IMAGE})["state"] == "Bound"
    with chain.db.write() as conn:
        conn.execute(update(attach_handles).values(in_use=False))
    assert bind(chain, {"accel:bitstream_id": OTHER})["state"] == "Bound"
    assert chain.bitstream() == OTHER


def bound_while_waiting_for_the_lease(chain, monkeypatch, group: dict[str, str]) -> None:
    """Make the next program wait for its lease while another bind of IMAGE runs to
    Bound: as when two conductors bind to one deployable and the other one was first."""
    original = Programmer._lease

    def other_bind_first(self, deployable_uuid, name):  # type: ignore[no-untyped-def]
        monkeypatch.setattr(Programmer, "_lease", original)
        assert bind(chain, group)["state"] == "Bound"
        return original(self, deployable_uuid, name)

    monkeypatch.setattr(Programmer, "_lease", other_bind_first)


def test_no_reprogramming_under_a_user_bound_while_waiting_for_the_lease(chain, monkeypatch):
    waiting = request_bind(chain, {"accel:bitstream_id": OTHER})
    bound_while_waiting_for_the_lease(chain, monkeypatch, {"accel:bitstream_id": IMAGE})
    run_binds(chain)
    arq = show(chain, waiting)
    assert arq["state"] == "BindFailed"
    assert "in use" in arq["bind_failure_reason"]
    assert chain.bitstream() == IMAGE


def test_image_programmed_while_waiting_for_the_lease_is_not_programmed_again(
        chain, monkeypatch):
    waiting = request_bind(chain, {"accel:bitstream_id": IMAGE})
    bound_while_waiting_for_the_lease(chain, monkeypatch, {"accel:bitstream_id": IMAGE})
    programs: list[str] = []
    original = Programmer._call_agent

    def counted(self, url, hostname, request, path="/program"):  # type: ignore[no-untyped-def]
        programs.append(path)
        return original(self, url, hostname, request, path)

    monkeypatch.setattr(Programmer, "_call_agent", counted)
    run_binds(chain)
    assert show(chain, waiting)["state"] == "Bound"
    assert programs == ["/program"]  # the other bind's; the waiting one skipped
    assert chain.bitstream() == IMAGE


@pytest.mark.parametrize("group, words", [
    ({"accel:bitstream_id": str(uuid.uuid4())}, "not found"),
    ({"accel:function_id": "nothing"}, "No image"),
    ({"accel:bitstream_id": IMAGE, "accel:function_id": "crypto-v1"}, "both"),
])
def test_failed_programming_fails_the_bind(chain, group, words):
    arq = bind(chain, group)
    assert arq["state"] == "BindFailed"
    assert words in arq["bind_failure_reason"]
    assert chain.bitstream() is None
    with chain.db.read() as conn:
        assert not conn.execute(select(attach_handles.c.id).where(
            attach_handles.c.in_use == True)).first()  # noqa: E712


def test_disabled_device_is_neither_programmed_nor_bound(chain):
    with chain.db.write() as conn:
        from acceld.db.models import devices

        conn.execute(update(devices).values(status="maintaining"))
    arq = bind(chain, {"accel:bitstream_id": IMAGE})
    assert arq["state"] == "BindFailed"
    assert "disabled" in arq["bind_failure_reason"]
    assert chain.fake.programmed("FakeDevice") == {}


def test_unreachable_agent_leaves_the_bind_to_retry(chain):
    chain.agent.stop()
    arq = bind(chain, {"accel:bitstream_id": IMAGE})
    assert arq["state"] == "BindStarted"
    with chain.db.read() as conn:
        assert conn.execute(select(deployables.c.bitstream_id)).scalar() is None


def test_groups_without_programming_keys_bind_as_before(chain):
    arq = bind(chain, {})
    assert arq["state"] == "Bound"
    assert chain.fake.programmed("FakeDevice") == {}


def test_agent_marked_down_holds_the_bind_without_programming(chain):
    """The bind waits for the agent (tests/db/test_bind_agent_down.py) and programs nothing
    meanwhile."""
    from acceld.db.models import agents

    with chain.db.write() as conn:
        conn.execute(update(agents).values(state="down"))
    arq = bind(chain, {"accel:bitstream_id": IMAGE})
    assert arq["state"] == "BindStarted"
    assert chain.fake.programmed("FakeDevice") == {}


def test_wrong_resource_class_is_refused_without_programming(chain):
    name = f"dp-{uuid.uuid4().hex[:8]}"
    assert chain.client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": name, "groups": [{"resources:PGPU": "1",
                                   "accel:bitstream_id": IMAGE}]}]).status_code == 201
    arq = bind(chain, {}, name=name)
    assert arq["state"] == "BindFailed"
    assert "PGPU" in arq["bind_failure_reason"]
    assert chain.fake.programmed("FakeDevice") == {}
