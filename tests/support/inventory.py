"""Inventory rows for tests, written through the database layer (no agent, no driver).

Each helper inserts with SQLAlchemy Core and returns the inserted values,
including the integer ``id``, so tests can build devices, deployables,
attributes and attach handles exactly as reconciliation would store them.
"""

from __future__ import annotations

import json
import uuid as uuidlib
from typing import Any

from sqlalchemy import Connection, insert

from acceld.db.engine import Database
from acceld.db.models import (attach_handles, attributes, controlpath_ids, deployables, devices,
                              utcnow)


def _insert(conn: Connection, table, values: dict[str, Any]) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    values = {"created_at": utcnow(), **values}
    values["id"] = conn.execute(insert(table).values(values)).inserted_primary_key[0]
    return values


def add_device(conn: Connection, *, hostname: str = "node1", type: str = "FPGA",
               vendor: str = "0x8086", model: str = "PAC Arria 10", status: str = "enabled",
               std_board_info: dict | None = None, vendor_board_info: dict | None = None,
               uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    return _insert(conn, devices, {
        "uuid": uuid or str(uuidlib.uuid4()), "type": type, "vendor": vendor, "model": model,
        "std_board_info": json.dumps(std_board_info or {"device_id": "0x09c4", "class": "0x120000"}),
        "vendor_board_info": json.dumps(vendor_board_info or {}),
        "hostname": hostname, "status": status, "acc_status": "ready", "vanished": False,
        **extra})


def add_controlpath(conn: Connection, device_id: int, address: str = "0000:5e:00.0"
                    ) -> dict[str, Any]:
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    info = {"domain": domain, "bus": bus, "device": device, "function": function}
    return _insert(conn, controlpath_ids, {
        "uuid": str(uuidlib.uuid4()), "device_id": device_id, "cpid_type": "PCI",
        "cpid_info": json.dumps(info)})


def add_deployable(conn: Connection, device_id: int, *, name: str | None = None,
                   num_accelerators: int = 1, driver_name: str = "fake",
                   rp_uuid: str | None = None, bitstream_id: str | None = None,
                   attrs: dict[str, str] | None = None, uuid: str | None = None,
                   **extra: Any) -> dict[str, Any]:
    """A deployable with its attributes (default ``rc=FPGA``), inserted in the given order."""
    dep_uuid = uuid or str(uuidlib.uuid4())
    values = _insert(conn, deployables, {
        "uuid": dep_uuid, "name": name or f"node1_{dep_uuid[:8]}",
        "num_accelerators": num_accelerators, "device_id": device_id,
        "driver_name": driver_name, "rp_uuid": rp_uuid or str(uuidlib.uuid4()),
        "bitstream_id": bitstream_id, **extra})
    for key, value in (attrs if attrs is not None else {"rc": "FPGA"}).items():
        add_attribute(conn, values["id"], key, value)
    return values


def add_attribute(conn: Connection, deployable_id: int, key: str, value: str) -> dict[str, Any]:
    return _insert(conn, attributes, {"uuid": str(uuidlib.uuid4()),
                                      "deployable_id": deployable_id, "key": key,
                                      "value": value})


def add_attach_handles(conn: Connection, deployable_id: int, count: int = 1, *,
                       attach_type: str = "PCI", bus: str = "5e", cpid_id: int | None = None,
                       in_use: bool = False) -> list[dict[str, Any]]:
    handles = []
    for n in range(count):
        info = {"domain": "0000", "bus": bus, "device": f"{n // 8:02x}", "function": str(n % 8)}
        handles.append(_insert(conn, attach_handles, {
            "uuid": str(uuidlib.uuid4()), "deployable_id": deployable_id, "cpid_id": cpid_id,
            "attach_type": attach_type, "attach_info": json.dumps(info), "in_use": in_use}))
    return handles


def add_fpga(db: Database, *, hostname: str = "node1", name: str = "FakeDevice",
             handles: int = 1, status: str = "enabled", driver_name: str = "fake",
             bitstream_id: str | None = None) -> dict[str, Any]:
    """One device with one deployable (``<hostname>_<name>``) and its handles, committed."""
    with db.write() as conn:
        device = add_device(conn, hostname=hostname, status=status)
        cpid = add_controlpath(conn, device["id"])
        deployable = add_deployable(conn, device["id"], name=f"{hostname}_{name}",
                                    num_accelerators=handles, driver_name=driver_name,
                                    bitstream_id=bitstream_id,
                                    attrs={"rc": "FPGA", "trait0": "CUSTOM_FAKE_DEVICE"})
        found = add_attach_handles(conn, deployable["id"], handles, cpid_id=cpid["id"])
    return {"device": device, "deployable": deployable, "controlpath": cpid, "handles": found}
