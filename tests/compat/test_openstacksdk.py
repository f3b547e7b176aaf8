"""openstacksdk's ``conn.accelerator``, every operation, against a running ``acceld all``.

The connection is what an operator without Keystone uses: ``auth_type='none'``
and the catalog endpoint given as ``accelerator_endpoint_override``. The SDK
does its own version discovery first, so every test here also proves that.
"""

from __future__ import annotations

import time
import uuid

import openstack
import pytest
from openstack import exceptions

from tests.compat.conftest import BITSTREAM_ID, HOSTNAME, unique

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def conn(acceld_all) -> openstack.connection.Connection:
    connection = openstack.connection.Connection(
        auth_type="none", accelerator_endpoint_override=acceld_all.url)
    yield connection
    connection.close()


@pytest.fixture
def profile(conn):
    dp = conn.accelerator.create_device_profile(
        name=unique("sdk-dp"), description="made by openstacksdk",
        groups=[{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"}])
    yield dp
    conn.accelerator.delete_device_profile(dp.id, ignore_missing=True)


# ---- device profiles -------------------------------------------------------------------------

def test_device_profile_create_get_list_delete(conn) -> None:
    name = unique("sdk-dp")
    groups = [{"resources:FPGA": "1", "trait:CUSTOM_FAKE_DEVICE": "required"},
              {"resources:CUSTOM_ACCELERATOR_FOO": "2", "accel:bitstream_id": BITSTREAM_ID}]
    dp = conn.accelerator.create_device_profile(name=name, groups=groups, description="two")
    assert dp.name == name
    assert dp.groups == groups
    assert dp.description == "two"
    uuid.UUID(dp.id)
    assert dp.created_at

    got = conn.accelerator.get_device_profile(dp.id)
    assert (got.id, got.name, got.groups) == (dp.id, name, groups)

    listed = {p.name: p for p in conn.accelerator.device_profiles()}
    assert listed[name].id == dp.id
    assert [p.id for p in conn.accelerator.device_profiles(name=name)] == [dp.id]

    conn.accelerator.delete_device_profile(dp.id, ignore_missing=False)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_device_profile(dp.id)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.delete_device_profile(dp.id, ignore_missing=False)
    assert conn.accelerator.delete_device_profile(dp.id, ignore_missing=True) is None


def test_device_profile_create_refusals_carry_the_message(conn, profile) -> None:
    with pytest.raises(exceptions.ConflictException) as exc:
        conn.accelerator.create_device_profile(name=profile.name,
                                               groups=[{"resources:FPGA": "1"}])
    assert profile.name in str(exc.value)
    with pytest.raises(exceptions.BadRequestException) as exc:
        conn.accelerator.create_device_profile(name=unique("sdk-bad"),
                                               groups=[{"resources:FPGA": "zero"}])
    assert "groups" in str(exc.value)


# ---- accelerator requests -------------------------------------------------------------------

def _wait_arq(conn, arq_id: str, states: set[str], timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        arq = conn.accelerator.get_accelerator_request(arq_id)
        if arq.state in states or time.monotonic() > deadline:
            return arq
        time.sleep(0.1)


def test_arq_create_get_list_delete(conn, profile) -> None:
    arq = conn.accelerator.create_accelerator_request(device_profile_name=profile.name)
    assert arq.state == "Initial"
    assert arq.device_profile_name == profile.name
    assert arq.device_profile_group_id == 0
    assert arq.attach_handle_type == "" and arq.attach_handle_info == {}

    got = conn.accelerator.get_accelerator_request(arq.id)
    assert (got.id, got.state, got.device_profile_name) == (arq.id, "Initial", profile.name)
    assert arq.id in {a.id for a in conn.accelerator.accelerator_requests()}

    conn.accelerator.delete_accelerator_request(arq.id, ignore_missing=False)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_accelerator_request(arq.id)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.delete_accelerator_request(arq.id, ignore_missing=False)


def test_arq_list_pages_are_followed_at_2_5(acceld_all, conn, profile) -> None:
    """With the accelerator microversion at 2.5 the SDK sends limit and follows
    arqs_links (Nova's form) to the end; without it the list is whole, as before."""
    made = [conn.accelerator.create_accelerator_request(device_profile_name=profile.name).id
            for _ in range(5)]
    paged = openstack.connection.Connection(
        auth_type="none", accelerator_endpoint_override=acceld_all.url,
        accelerator_default_microversion="2.5")
    try:
        seen = [a.id for a in paged.accelerator.accelerator_requests(limit=2)]
        with pytest.raises(exceptions.BadRequestException):
            list(conn.accelerator.accelerator_requests(limit=2))  # 2.0: unknown parameter
    finally:
        paged.close()
    assert [i for i in seen if i in made] == made
    assert len(seen) == len(set(seen))
    assert set(made) <= {a.id for a in conn.accelerator.accelerator_requests()}
    for arq_id in made:
        conn.accelerator.delete_accelerator_request(arq_id, ignore_missing=False)


def test_arq_for_unknown_profile_is_not_found(conn) -> None:
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.create_accelerator_request(device_profile_name=unique("absent"))


def test_arq_bind_and_unbind_with_per_uuid_patch(conn, profile, fake_deployable) -> None:
    arq = conn.accelerator.create_accelerator_request(device_profile_name=profile.name)
    instance = str(uuid.uuid4())
    conn.accelerator.patch_accelerator_request(arq.id, [
        {"op": "add", "path": "/hostname", "value": HOSTNAME},
        {"op": "add", "path": "/device_rp_uuid", "value": fake_deployable["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": instance},
    ])
    bound = _wait_arq(conn, arq.id, {"Bound", "BindFailed"})
    assert bound.state == "Bound"
    assert bound.instance_uuid == instance
    assert bound.hostname == HOSTNAME
    assert bound.device_rp_uuid == fake_deployable["rp_uuid"]
    assert bound.attach_handle_type and bound.attach_handle_info
    assert {a.id for a in conn.accelerator.accelerator_requests(instance=instance)} == {arq.id}

    conn.accelerator.patch_accelerator_request(arq.id, [
        {"op": "remove", "path": "/hostname"},
        {"op": "remove", "path": "/device_rp_uuid"},
        {"op": "remove", "path": "/instance_uuid"},
    ])
    unbound = _wait_arq(conn, arq.id, {"Unbound", "UnbindFailed"})
    assert unbound.state == "Unbound"
    assert unbound.attach_handle_type == "" and unbound.attach_handle_info == {}
    assert not unbound.instance_uuid

    conn.accelerator.delete_accelerator_request(arq.id, ignore_missing=False)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_accelerator_request(arq.id)


def test_arq_bound_is_deleted_per_uuid(conn, profile, fake_deployable) -> None:
    arq = conn.accelerator.create_accelerator_request(device_profile_name=profile.name)
    conn.accelerator.patch_accelerator_request(arq.id, [
        {"op": "add", "path": "/hostname", "value": HOSTNAME},
        {"op": "add", "path": "/device_rp_uuid", "value": fake_deployable["rp_uuid"]},
        {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())},
    ])
    assert _wait_arq(conn, arq.id, {"Bound", "BindFailed"}).state == "Bound"
    conn.accelerator.delete_accelerator_request(arq.id, ignore_missing=False)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_accelerator_request(arq.id)


def test_arq_bad_patch_is_refused_and_changes_nothing(conn, profile) -> None:
    arq = conn.accelerator.create_accelerator_request(device_profile_name=profile.name)
    with pytest.raises(exceptions.BadRequestException):
        conn.accelerator.patch_accelerator_request(arq.id, [
            {"op": "add", "path": "/hostname", "value": HOSTNAME}])  # two paths missing
    with pytest.raises(exceptions.BadRequestException):
        conn.accelerator.patch_accelerator_request(arq.id, [
            {"op": "replace", "path": "/state", "value": "Bound"}])
    assert conn.accelerator.get_accelerator_request(arq.id).state == "Initial"
    conn.accelerator.delete_accelerator_request(arq.id)


# ---- devices ---------------------------------------------------------------------------------

def test_devices_list_and_get(conn, fake_device) -> None:
    devices = list(conn.accelerator.devices(hostname=HOSTNAME))
    assert fake_device["uuid"] in {d.id for d in devices}
    by_type = list(conn.accelerator.devices(type=fake_device["type"]))
    assert all(d.type == fake_device["type"] for d in by_type) and by_type
    device = conn.accelerator.get_device(fake_device["uuid"])
    assert device.hostname == HOSTNAME
    assert device.type == "FPGA"
    assert device.vendor == fake_device["vendor"]
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_device(str(uuid.uuid4()))


def test_device_disable_and_enable(conn, acceld_all, http, fake_device) -> None:
    def status() -> str:
        resp = http.get(f"{acceld_all.url}/devices/{fake_device['uuid']}",
                        headers={"OpenStack-API-Version": "accelerator 2.3"})
        assert resp.status_code == 200, resp.text
        return resp.json()["status"]

    device = conn.accelerator.get_device(fake_device["uuid"])
    try:
        conn.accelerator.disable_device(device)
        assert status() == "maintaining"
    finally:
        conn.accelerator.enable_device(device)
    assert status() == "enabled"


# ---- deployables -----------------------------------------------------------------------------

def test_deployables_list_and_get(conn, fake_deployable, fake_device) -> None:
    listed = {d.id: d for d in conn.accelerator.deployables()}
    assert fake_deployable["uuid"] in listed
    dep = conn.accelerator.get_deployable(fake_deployable["uuid"])
    assert dep.name == fake_deployable["name"]
    assert dep.name.startswith(f"{HOSTNAME}_")
    assert dep.num_accelerators == fake_deployable["num_accelerators"] >= 1
    assert dep.device_id == fake_deployable["device_id"]
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_deployable(str(uuid.uuid4()))


def test_deployable_program(conn, acceld_all, http, fake_deployable) -> None:
    """The SDK sends PATCH /deployables/{uuid}/program/{uuid}; bitstream_id records it."""
    conn.accelerator.patch_deployable(fake_deployable["uuid"], [
        {"path": "/program", "op": "replace", "value": [{"image_uuid": BITSTREAM_ID}]}])
    resp = http.get(f"{acceld_all.url}/deployables/{fake_deployable['uuid']}")
    assert resp.status_code == 200
    assert resp.json()["bitstream_id"] == BITSTREAM_ID


def test_deployable_program_unknown_image_changes_nothing(conn, acceld_all, http,
                                                          fake_deployable) -> None:
    before = http.get(f"{acceld_all.url}/deployables/{fake_deployable['uuid']}").json()
    with pytest.raises(exceptions.HttpException) as exc:
        conn.accelerator.patch_deployable(fake_deployable["uuid"], [
            {"path": "/program", "op": "replace", "value": [{"image_uuid": str(uuid.uuid4())}]}])
    assert 400 <= exc.value.status_code < 500
    after = http.get(f"{acceld_all.url}/deployables/{fake_deployable['uuid']}").json()
    assert after["bitstream_id"] == before["bitstream_id"]


# ---- attributes ------------------------------------------------------------------------------

def test_attributes_create_get_list_delete(conn, fake_deployable) -> None:
    # The fake driver's own attributes (rc, trait0..) name the deployable as the API does.
    driver_attrs = [a for a in conn.accelerator.attributes() if a.key == "rc"]
    assert driver_attrs, "the fake deployable has no rc attribute"
    deployable_id = driver_attrs[0].deployable_id
    key = unique("sdk_key")
    attr = conn.accelerator.create_attribute(deployable_id=deployable_id, key=key, value="v1")
    assert (attr.key, attr.value, attr.deployable_id) == (key, "v1", deployable_id)
    uuid.UUID(attr.id)
    got = conn.accelerator.get_attribute(attr.id)
    assert (got.key, got.value) == (key, "v1")
    assert key in {a.key for a in conn.accelerator.attributes()}
    assert [a.id for a in conn.accelerator.attributes(key=key)] == [attr.id]
    conn.accelerator.delete_attribute(attr.id, ignore_missing=False)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.get_attribute(attr.id)
    with pytest.raises(exceptions.NotFoundException):
        conn.accelerator.delete_attribute(attr.id, ignore_missing=False)


def test_attribute_create_refusals(conn) -> None:
    with pytest.raises(exceptions.BadRequestException):
        conn.accelerator.create_attribute(key="no-deployable", value="v")
