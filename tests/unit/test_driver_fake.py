"""The fake driver: upstream's default report, more simulated devices, recorded programming."""

import hashlib
import json

import pytest

from acceld.drivers import loader
from acceld.drivers.base import DriverError
from acceld.drivers.fake import FakeDriver
from acceld.drivers.record_schema import check_node
from tests.conftest import make_conf


@pytest.fixture
def conf(tmp_path):
    return make_conf(str(tmp_path))


def test_default_is_upstreams_fake_device(conf):
    records = FakeDriver(conf, "host1").discover()
    assert len(records) == 1
    rec = records[0]
    assert (rec.type, rec.vendor, rec.model, rec.driver_name) == \
        ("FPGA", "0xABCD", "miss model info", "fake")
    assert rec.std_board_info == {"device_id": "0xabcd", "class": "Fake class"}
    assert rec.acc_status == "ready"
    (dep,) = rec.deployables
    assert dep.name == "FakeDevice" and dep.num_accelerators == 16
    assert dep.attributes == {"rc": "FPGA", "trait0": "CUSTOM_FAKE_DEVICE"}
    assert len(dep.attach_handles) == 16
    assert {h.attach_type for h in dep.attach_handles} == {"TEST_PCI"}
    # Upstream's: functions 1..16 over device fn // 8, function fn % 8 (0 is the control path).
    assert dep.attach_handles[0].attach_info == {"domain": "0000", "bus": "0c", "device": "0",
                                                 "function": "1"}
    assert dep.attach_handles[9].attach_info == {"domain": "0000", "bus": "0c", "device": "1",
                                                 "function": "2"}
    assert dep.attach_handles[15].attach_info == {"domain": "0000", "bus": "0c", "device": "2",
                                                  "function": "0"}
    assert not check_node([r.to_dict() for r in records]).problems


def test_uuid_is_stable_per_host_and_device(conf):
    first = FakeDriver(conf, "host1").discover()[0].uuid
    assert FakeDriver(conf, "host1").discover()[0].uuid == first
    assert FakeDriver(conf, "host2").discover()[0].uuid != first


def test_more_devices_and_other_types(conf):
    conf.set_override("devices", ["FPGA", "GPU", "QAT", "GPU"], group="fake_driver")
    conf.set_override("attach_handles", 4, group="fake_driver")
    records = FakeDriver(conf, "host1").discover()
    assert [r.type for r in records] == ["FPGA", "GPU", "QAT", "GPU"]
    assert [r.deployables[0].attributes["rc"] for r in records] == \
        ["FPGA", "PGPU", "CUSTOM_QAT", "PGPU"]
    assert len({r.deployables[0].name for r in records}) == 4
    assert len({r.controlpath_id["cpid_info"]["bus"] for r in records}) == 4
    assert all(r.deployables[0].num_accelerators == 4 for r in records)
    assert not check_node([r.to_dict() for r in records]).problems


def test_unknown_type_is_refused(conf):
    conf.set_override("devices", ["TPU"], group="fake_driver")
    with pytest.raises(DriverError, match="TPU"):
        FakeDriver(conf, "host1").discover()


def test_spec_file_is_read_at_each_discovery(conf, tmp_path):
    spec = tmp_path / "fake.json"
    spec.write_text(json.dumps({"devices": [
        {"type": "GPU", "name": "Gpu0", "attach_handles": 2, "traits": ["CUSTOM_A"]},
        {"type": "FPGA", "acc_status": "reboot_required"}]}))
    conf.set_override("spec_file", str(spec), group="fake_driver")
    driver = FakeDriver(conf, "host1")
    gpu, fpga = driver.discover()
    assert gpu.deployables[0].name == "Gpu0"
    assert gpu.deployables[0].attributes == {"rc": "PGPU", "trait0": "CUSTOM_A"}
    assert (fpga.acc_status, fpga.status_reason) == ("reboot_required",
                                                     "simulated: reboot_required")
    spec.write_text(json.dumps([{"type": "QAT"}]))
    assert [r.type for r in driver.discover()] == ["QAT"]
    spec.write_text(json.dumps([{"type": "QAT", "colour": "red"}]))
    with pytest.raises(DriverError, match="colour"):
        driver.discover()
    spec.write_text("{not json")
    with pytest.raises(DriverError, match="cannot read"):
        driver.discover()


def test_program_records_the_image(conf, tmp_path):
    image = tmp_path / "shell.gbs"
    image.write_bytes(b"bitstream-bytes")
    driver = FakeDriver(conf, "host1")
    assert driver.programmed("FakeDevice") == {}
    driver.program("host1_FakeDevice", str(image))
    driver.program("FakeDevice", str(image), kind="firmware")
    done = driver.programmed("FakeDevice")
    assert set(done) == {"bitstream", "firmware"}
    assert done["bitstream"]["sha256"] == hashlib.sha256(b"bitstream-bytes").hexdigest()
    assert done["bitstream"]["size"] == len(b"bitstream-bytes")


def test_program_refuses_what_it_cannot_do(conf, tmp_path):
    image = tmp_path / "x.bin"
    image.write_bytes(b"x")
    driver = FakeDriver(conf, "host1")
    with pytest.raises(DriverError, match="no deployable"):
        driver.program("host1_Other", str(image))
    with pytest.raises(DriverError, match="cannot read image"):
        driver.program("FakeDevice", str(tmp_path / "missing.bin"))
    with pytest.raises(DriverError, match="kind"):
        driver.program("FakeDevice", str(image), kind="microcode")
    assert driver.programmed("FakeDevice") == {}


def test_loader_finds_drivers_by_entry_point(conf):
    assert {"fake", "pci"} <= set(loader.available())
    assert isinstance(loader.load("fake", conf, "h"), FakeDriver)
    with pytest.raises(loader.UnknownDriver, match="nonesuch"):
        loader.driver_class("nonesuch")


def test_schema_document_matches_the_code():
    from pathlib import Path

    from acceld.drivers.record_schema import document

    doc = Path(__file__).resolve().parents[2] / "docs" / "hardware-record.schema.json"
    assert doc.read_text() == document(), \
        "regenerate: python -m acceld.drivers.record_schema > docs/hardware-record.schema.json"
