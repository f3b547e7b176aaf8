"""Device queries: the inventory's physical accelerators and their operator status."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

from sqlalchemy import Connection, Row, select, update

from acceld.db.models import (accelerator_requests, attach_handles, deployables, devices,
                              utcnow)
from acceld.db.rows import driver_batches

# The stored values of the operator status. The seed's 'disabled' is stored as upstream's
# 'maintaining'; bind refuses any device whose status is not ENABLED.
ENABLED = "enabled"
MAINTAINING = "maintaining"

# The API's serializer unpacks rows in this order (acceld.api.handlers.devices).
COLUMNS = (devices.c.id, devices.c.uuid, devices.c.type, devices.c.vendor, devices.c.model,
            devices.c.std_board_info, devices.c.vendor_board_info, devices.c.hostname,
            devices.c.status, devices.c.status_reason, devices.c.acc_status, devices.c.created_at,
            devices.c.updated_at, devices.c.health, devices.c.health_reason,
            devices.c.health_since, devices.c.quarantined)

FILTERS = ("type", "vendor", "hostname")
HEALTH_FILTERS = ("health", "quarantined")  # microversion 2.6


def list_devices(conn: Connection, filters: dict[str, Any]) -> Iterator[list[tuple]]:
    """One query, its driver tuples in batches (in ``COLUMNS`` order; read them before the
    transaction ends); every filter is an indexed equality on its column (``quarantined``
    a boolean, already parsed)."""
    query = select(*COLUMNS).order_by(devices.c.id)
    for name in FILTERS + HEALTH_FILTERS:
        if name in filters:
            query = query.where(devices.c[name] == filters[name])
    return driver_batches(conn, query)


def bound_instances(conn: Connection, device_id: int) -> Sequence[Row]:
    """The ARQs that hold one of the device's attach handles (bound, or binding), with their
    instances: who sits on the device (to move them off an unhealthy one). One query."""
    return conn.execute(select(
        accelerator_requests.c.uuid, accelerator_requests.c.instance_uuid,
        accelerator_requests.c.state, deployables.c.uuid.label("deployable_uuid")).select_from(
        accelerator_requests.join(attach_handles, attach_handles.c.id ==
                                  accelerator_requests.c.attach_handle_id)
        .join(deployables, deployables.c.id == attach_handles.c.deployable_id)).where(
        deployables.c.device_id == device_id).order_by(accelerator_requests.c.id)).all()


def get_by_uuid(conn: Connection, uuid: str) -> Row | None:
    return conn.execute(select(*COLUMNS).where(devices.c.uuid == uuid)).first()


def set_status(conn: Connection, device_id: int, status: str, reason: str | None) -> bool:
    """Compare-and-set the status; False when it already had it (nothing written).

    The reason is replaced whenever it differs: an operator may disable a device
    again to record a better reason. The caller flags the device's Placement
    providers when this returns True (acceld.db.placement_flags.mark_dirty).
    """
    return bool(conn.execute(update(devices).where(
        devices.c.id == device_id,
        (devices.c.status != status) | (devices.c.status_reason.is_distinct_from(reason)),
    ).values(status=status, status_reason=reason, updated_at=utcnow())).rowcount)
