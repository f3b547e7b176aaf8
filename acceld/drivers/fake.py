"""The fake driver: simulated hardware, for demos and for testing every path end to end.

By default it reports what upstream Cyborg's fake driver reports: one FPGA,
deployable ``FakeDevice`` with 16 ``TEST_PCI`` attach handles, vendor
``0xABCD``, attributes ``rc=FPGA`` and ``trait0=CUSTOM_FAKE_DEVICE``.
``[fake_driver] devices`` simulates more devices and other types; a
``spec_file`` (read again at each discovery) lets a running test change the
simulated hardware, mark it not ready, make it vanish, or inject a fault
(``"health": {"state": "unhealthy", "reason": "..."}``, reported as the
device's health; absent: no health, i.e. unknown). Programming is
recorded (one JSON file per deployable under ``state_dir``) so the whole
programming path can be checked without an FPGA.

``[fake_driver] attach_type = MDEV`` (or ``"attach_type": "MDEV"`` per device
in the spec file) simulates vGPU-style handles: each must be prepared on bind
and released after unbind, and both steps are recorded in
``<state_dir>/attach_handles.json`` (idempotent, as a real mdev's). A spec
entry's ``"fail_attach": ["prepare", "release"]`` makes those steps fail.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
import uuid as uuidlib
from typing import Any


from acceld.drivers.base import (AttachHandle, Deployable, Driver, DriverError,
                                 HardwareRecord, hardware_uuid)
from acceld.drivers.health import SCHEMA as HEALTH_SCHEMA
from acceld.drivers.health import Health
from acceld.jsonschemas import strict_validator

VENDOR = "0xABCD"
MODEL = "miss model info"
STD_BOARD_INFO = {"device_id": "0xabcd", "class": "Fake class"}
VENDOR_BOARD_INFO = "fake_vendor_info"
FIRST_BUS = 0x0C
MDEV_TYPE = "fake-vgpu-1"
_ATTACH_LOCK = threading.Lock()

# Device type -> (resource class, extra trait). The FPGA row is upstream's.
TYPES: dict[str, tuple[str, str | None]] = {
    "FPGA": ("FPGA", None),
    "GPU": ("PGPU", "CUSTOM_FAKE_GPU"),
    "QAT": ("CUSTOM_QAT", "CUSTOM_FAKE_QAT"),
    "AICHIP": ("CUSTOM_AICHIP", "CUSTOM_FAKE_AICHIP"),
    "NIC": ("CUSTOM_NIC", "CUSTOM_FAKE_NIC"),
    "SSD": ("CUSTOM_SSD", "CUSTOM_FAKE_SSD"),
}

_SPEC_SCHEMA = strict_validator({
    "type": "array",
    "maxItems": 64,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["type"],
        "properties": {
            "type": {"enum": list(TYPES)},
            "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"},
            "attach_handles": {"type": "integer", "minimum": 1, "maximum": 256},
            "acc_status": {"enum": ["ready", "setup_required", "reboot_required"]},
            "status_reason": {"type": "string"},
            "rc": {"type": "string", "pattern": "^[A-Z0-9_]+$"},
            "traits": {"type": "array", "items": {"type": "string",
                                                  "pattern": "^[A-Z0-9_]+$"}},
            "attach_type": {"enum": ["TEST_PCI", "MDEV"]},
            "fail_attach": {"type": "array", "items": {"enum": ["prepare", "release"]}},
            # Injected health ({"state": "unhealthy", "reason": "..."}), reported as is.
            "health": HEALTH_SCHEMA,
        },
    },
})


class FakeDriver(Driver):
    name = "fake"
    hardware_type = "FPGA"

    def discover(self) -> list[HardwareRecord]:
        return [self._record(index, spec) for index, spec in enumerate(self._specs())]

    def _specs(self) -> list[dict[str, Any]]:
        path = self.conf.fake_driver.spec_file
        if not path:
            return [{"type": t.strip().upper()} for t in self.conf.fake_driver.devices
                    if t.strip()]
        try:
            with open(path, "rb") as handle:
                specs = json.load(handle)
        except (OSError, ValueError) as exc:
            raise DriverError(f"fake driver: cannot read spec file {path}: {exc}") from exc
        if isinstance(specs, dict):
            specs = specs.get("devices")
        error = next(iter(_SPEC_SCHEMA.iter_errors(specs)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise DriverError(f"fake driver: bad spec file {path} at '{where}': {error.message}")
        return specs

    def _record(self, index: int, spec: dict[str, Any]) -> HardwareRecord:
        kind = spec["type"]
        if kind not in TYPES:
            raise DriverError(f"fake driver: unknown device type {kind!r}; "
                              f"choose from {', '.join(TYPES)}")
        rc, extra_trait = TYPES[kind]
        name = spec.get("name") or ("FakeDevice" if index == 0 else f"FakeDevice{index}")
        bus = f"{FIRST_BUS + index:02x}"
        count = spec.get("attach_handles", self.conf.fake_driver.attach_handles)
        traits = spec.get("traits") or ["CUSTOM_FAKE_DEVICE"] + ([extra_trait] if extra_trait
                                                                 else [])
        attributes = {"rc": spec.get("rc", rc)}
        attributes.update({f"trait{i}": trait for i, trait in enumerate(traits)})
        if spec.get("attach_type", self.conf.fake_driver.attach_type) == "MDEV":
            handles = [self._mdev_handle(bus, n) for n in range(count)]
        else:
            # Functions 1..count, 8 to a PCI device, as upstream's: function 0 is the
            # control path.
            handles = [AttachHandle(attach_type="TEST_PCI",
                                    attach_info={"domain": "0000", "bus": bus,
                                                 "device": str(n // 8),
                                                 "function": str(n % 8)})
                       for n in range(1, count + 1)]
        acc_status = spec.get("acc_status", "ready")
        return HardwareRecord(
            uuid=hardware_uuid(self.hostname, self.name, name),
            type=kind,
            vendor=VENDOR,
            model=MODEL,
            driver_name=self.name,
            controlpath_id={"cpid_type": "PCI",
                            "cpid_info": {"domain": "0000", "bus": bus, "device": "00",
                                          "function": "0"}},
            acc_specs={"remote": 0, "num": count, "device_type": kind},
            acc_status=acc_status,
            status_reason=spec.get("status_reason") or (
                None if acc_status == "ready" else f"simulated: {acc_status}"),
            std_board_info=dict(STD_BOARD_INFO),
            vendor_board_info=VENDOR_BOARD_INFO,
            deployables=[Deployable(name=name, num_accelerators=count, attributes=attributes,
                                    attach_handles=handles)],
            health=Health.from_dict(spec["health"]).to_dict() if "health" in spec else None,
        )

    # Programming: recorded, so the path conductor -> agent -> driver can be verified.

    def state_dir(self) -> str:
        return self.conf.fake_driver.state_dir or os.path.join(self.conf.state_path,
                                                               "fake_driver")

    def _local_name(self, deployable_name: str) -> str:
        prefix = f"{self.hostname}_"
        return deployable_name[len(prefix):] if deployable_name.startswith(prefix) \
            else deployable_name

    def program(self, deployable_name: str, image_path: str, kind: str = "bitstream") -> None:
        """Record the image's digest as written to the deployable (bitstream or firmware)."""
        if kind not in ("bitstream", "firmware"):
            raise DriverError(f"fake driver: unknown image kind {kind!r}")
        local = self._local_name(deployable_name)
        names = {d.name for record in self.discover() for d in record.deployables}
        if local not in names:
            raise DriverError(f"fake driver: no deployable {deployable_name!r} on "
                              f"{self.hostname}")
        try:
            with open(image_path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise DriverError(f"fake driver: cannot read image {image_path}: {exc}") from exc
        os.makedirs(self.state_dir(), exist_ok=True)
        entry = {"deployable": local, "kind": kind, "image_path": image_path,
                 "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                 "programmed_at": dt.datetime.now(dt.timezone.utc).isoformat()}
        records = self.programmed(local)
        records[kind] = entry
        path = os.path.join(self.state_dir(), f"{local}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(records, handle)
        os.replace(path + ".tmp", path)

    def programmed(self, deployable_name: str) -> dict[str, Any]:
        """What was last programmed into a deployable, by kind ({} if nothing)."""
        path = os.path.join(self.state_dir(), f"{self._local_name(deployable_name)}.json")
        try:
            with open(path) as handle:
                return json.load(handle)
        except FileNotFoundError:
            return {}

    # Simulated mdev handles: prepare and release are recorded, and idempotent.

    def _mdev_handle(self, bus: str, slot: int) -> AttachHandle:
        parent = f"0000:{bus}:00.0"
        return AttachHandle(attach_type="MDEV", attach_info={
            "parent": parent, "asked_type": MDEV_TYPE, "vgpu_mark": f"{MDEV_TYPE}_{slot}",
            "uuid": str(uuidlib.uuid5(uuidlib.NAMESPACE_URL,
                                      f"acceld-fake/{self.hostname}/{parent}/{slot}"))})

    def _attach_step(self, handle: AttachHandle, step: str) -> None:
        if handle.attach_type != "MDEV":
            return
        info = handle.attach_info
        if "uuid" not in info or "parent" not in info:
            raise DriverError(f"fake driver: MDEV attach handle lacks parent or uuid: {info}")
        specs = self._specs()
        index = next((i for i in range(len(specs))
                      if info["parent"] == f"0000:{FIRST_BUS + i:02x}:00.0"), None)
        if index is None:
            raise DriverError(f"fake driver: no simulated device is parent {info['parent']}")
        if step in specs[index].get("fail_attach", ()):
            raise DriverError(f"fake driver: simulated failure to {step} mdev {info['uuid']}")
        with _ATTACH_LOCK:
            state = self.attach_state()
            prepared = state.setdefault("prepared", {})
            if step == "prepare":
                prepared[info["uuid"]] = dict(info)
            else:
                prepared.pop(info["uuid"], None)
            state.setdefault("log", []).append([step, info["uuid"]])
            os.makedirs(self.state_dir(), exist_ok=True)
            path = os.path.join(self.state_dir(), "attach_handles.json")
            with open(path + ".tmp", "w") as out:
                json.dump(state, out)
            os.replace(path + ".tmp", path)

    def prepare_attach_handle(self, handle: AttachHandle) -> AttachHandle:
        """Create the simulated mdev (already there: nothing to do)."""
        self._attach_step(handle, "prepare")
        return handle

    def release_attach_handle(self, handle: AttachHandle) -> None:
        """Remove the simulated mdev (already gone: nothing to do)."""
        self._attach_step(handle, "release")

    def prepared_attach_handles(self) -> list[AttachHandle]:
        """The simulated mdevs this driver created and did not remove."""
        prepared = self.attach_state().get("prepared", {})
        return [AttachHandle(attach_type="MDEV", attach_info=dict(info))
                for _, info in sorted(prepared.items())]

    def attach_state(self) -> dict[str, Any]:
        """``{"prepared": {mdev uuid: info}, "log": [[step, mdev uuid], ...]}``."""
        try:
            with open(os.path.join(self.state_dir(), "attach_handles.json")) as handle:
                return json.load(handle)
        except FileNotFoundError:
            return {}
