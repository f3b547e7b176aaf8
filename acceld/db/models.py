"""The whole schema: upstream Cyborg's v2 tables plus what acceld adds.

Queries use these tables through SQLAlchemy Core (``Model.__table__``), not ORM
sessions: list endpoints turn rows into JSON directly, which is several times
cheaper per row. Alembic migrations in ``migrations/`` create exactly this
schema; a test compares the two on every backend.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import (BigInteger, Boolean, DateTime, ForeignKey, Index, Integer, String,
                        Text, UniqueConstraint, false)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Microsecond timestamps everywhere (MySQL/MariaDB default to whole seconds).
Timestamp = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def utcnow() -> dt.datetime:
    """Naive UTC now: every timestamp column stores UTC without a zone."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class TimestampMixin:
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)
    updated_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, nullable=True,
                                                           onupdate=utcnow)


class Device(TimestampMixin, Base):
    """A physical accelerator on a node, found by its control path (PCI address)."""

    __tablename__ = "devices"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    type: Mapped[str] = mapped_column(String(30), nullable=False)
    vendor: Mapped[str] = mapped_column(String(255), nullable=False)
    model: Mapped[str] = mapped_column(String(255), nullable=False)
    std_board_info: Mapped[str | None] = mapped_column(Text)
    vendor_board_info: Mapped[str | None] = mapped_column(Text)
    hostname: Mapped[str] = mapped_column(String(255), nullable=False)
    # 'enabled' or 'maintaining' (disabled by an operator, or held while in use but gone).
    status: Mapped[str] = mapped_column(String(16), nullable=False, default="enabled")
    status_reason: Mapped[str | None] = mapped_column(Text)
    # The seed's hardware readiness: 'ready', 'setup_required' or 'reboot_required'.
    acc_status: Mapped[str] = mapped_column(String(32), nullable=False, default="ready")
    # Set when the driver no longer reports the device but a handle is still in use.
    vanished: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # Health as the driver last reported it (acceld.drivers.health), since when (the
    # database's clock) and how many healthy reports in a row since it was last not healthy.
    # Quarantine is its own dimension beside the operator's ``status``: set by the
    # conductor on an unhealthy report, cleared after [conductor] health_recovery_reports
    # healthy ones (or by an operator); docs/devices.md "Health".
    health: Mapped[str] = mapped_column(String(16), nullable=False, default="unknown",
                                        server_default="unknown")
    health_reason: Mapped[str | None] = mapped_column(Text)
    health_since: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    health_ok_reports: Mapped[int] = mapped_column(Integer, nullable=False, default=0,
                                                   server_default="0")
    quarantined: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False,
                                              server_default=false())
    quarantined_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    __table_args__ = (
        Index("ix_devices_health", "health"),
        Index("ix_devices_hostname", "hostname"),
        Index("ix_devices_type", "type"),
        Index("ix_devices_vendor", "vendor"),
    )


class DeviceEvent(Base):
    """One thing that happened to a device (health change, operator enable/disable, program,
    vanish/return), kept [conductor] device_event_retention and shown newest first.

    Keyed by the device's uuid, not a foreign key: a device's history outlives its row.
    """

    __tablename__ = "device_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    device_uuid: Mapped[str] = mapped_column(String(36), nullable=False)
    hostname: Mapped[str | None] = mapped_column(String(255))
    # The database's clock (acceld.db.clock), so events from several conductors order.
    created_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    detail: Mapped[str | None] = mapped_column(Text)
    # Who: "conductor", or the operator's user id from the API request.
    actor: Mapped[str | None] = mapped_column(String(255))
    __table_args__ = (
        Index("ix_device_events_device_uuid_id", "device_uuid", "id"),
        Index("ix_device_events_created_at", "created_at"),
    )


class ControlpathId(TimestampMixin, Base):
    """How the host reaches a device (a PCI address, as JSON text)."""

    __tablename__ = "controlpath_ids"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"),
                                           nullable=False)
    cpid_type: Mapped[str] = mapped_column(String(16), nullable=False)
    cpid_info: Mapped[str] = mapped_column(String(255), nullable=False)
    __table_args__ = (
        Index("ix_controlpath_ids_device_id", "device_id"),
        Index("ix_controlpath_ids_info", "cpid_info"),
    )


class Deployable(TimestampMixin, Base):
    """A unit of a device that can be offered (one Placement resource provider)."""

    __tablename__ = "deployables"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("deployables.id"))
    root_id: Mapped[int | None] = mapped_column(ForeignKey("deployables.id"))
    name: Mapped[str] = mapped_column(String(255), nullable=False, unique=True)
    num_accelerators: Mapped[int] = mapped_column(Integer, nullable=False)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id", ondelete="CASCADE"),
                                           nullable=False)
    driver_name: Mapped[str | None] = mapped_column(String(100))
    rp_uuid: Mapped[str | None] = mapped_column(String(36))
    bitstream_id: Mapped[str | None] = mapped_column(String(36))
    # The last program asked through the API (shown from microversion 2.5): PROGRAMMING,
    # SUCCEEDED or FAILED, why it failed, which request it is (a later request's result
    # is not overwritten by an earlier one's) and when it began (one left PROGRAMMING by
    # a conductor that stopped is failed after program_timeout; acceld.conductor.programming).
    program_status: Mapped[str | None] = mapped_column(String(16))
    program_reason: Mapped[str | None] = mapped_column(Text)
    program_request_id: Mapped[str | None] = mapped_column(String(36))
    program_started_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # Set while a program (a bind's or the API's) is rewriting the device: who runs it and
    # until when it counts (a crashed holder's lapses). No bind takes a handle meanwhile
    # (acceld.conductor.binding.target.lock_deployable; docs/architecture.md).
    programming_owner: Mapped[str | None] = mapped_column(String(64))
    programming_until: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    # Grows by one with each claim that may make the agent rewrite the device (a program);
    # the agent refuses a token older than the newest it has seen (fencing, migration 0010).
    fence_token: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0,
                                             server_default="0")
    # The token a bind's fence last told the agent (NULL: never): a bind of a handle with no
    # host step fences only while the agent lacks ``fence_token`` (migration 0016). A row
    # starting at token 0 (imported) follows no earlier row's tokens: nothing to tell, 0;
    # discovery's rows start at fences.first_token, untold (acceld.db.inventory).
    fence_told: Mapped[int | None] = mapped_column(BigInteger, default=0)
    __table_args__ = (
        Index("ix_deployables_device_id", "device_id"),
        Index("ix_deployables_rp_uuid", "rp_uuid"),
    )


class Attribute(TimestampMixin, Base):
    """A key/value fact about a deployable: ``rc`` (resource class), ``trait<N>``, ..."""

    __tablename__ = "attributes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    deployable_id: Mapped[int] = mapped_column(
        ForeignKey("deployables.id", ondelete="CASCADE"), nullable=False)
    key: Mapped[str] = mapped_column(String(255), nullable=False)
    value: Mapped[str] = mapped_column(String(255), nullable=False)
    # Created through the API: reconciliation neither updates nor removes it (docs/devices.md).
    operator_owned: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    __table_args__ = (
        UniqueConstraint("deployable_id", "key", name="uq_attributes_deployable_id_key"),
        Index("ix_attributes_key", "key"),
    )


class AttachHandle(TimestampMixin, Base):
    """What a VM gets attached to: a PCI function, an mdev, ... Taken by one ARQ at a time."""

    __tablename__ = "attach_handles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    deployable_id: Mapped[int] = mapped_column(
        ForeignKey("deployables.id", ondelete="CASCADE"), nullable=False)
    cpid_id: Mapped[int | None] = mapped_column(
        ForeignKey("controlpath_ids.id", ondelete="SET NULL"))
    attach_type: Mapped[str] = mapped_column(String(16), nullable=False)
    # JSON text of the address parts, e.g. {"domain": "0000", "bus": "af", ...}.
    attach_info: Mapped[str] = mapped_column(String(255), nullable=False)
    in_use: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # Grows by one with each claim that may make the agent change the handle on the host
    # (prepare, release); the agent refuses an older token (fencing, migration 0010).
    fence_token: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0,
                                             server_default="0")
    __table_args__ = (
        Index("ix_attach_handles_deployable_id_in_use", "deployable_id", "in_use"),
    )


class DeviceProfile(TimestampMixin, Base):
    """A named request for accelerators, in request groups (JSON text)."""

    __tablename__ = "device_profiles"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    name: Mapped[str] = mapped_column(String(255), nullable=False, unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    profile_json: Mapped[str] = mapped_column(Text, nullable=False)


class AcceleratorRequest(TimestampMixin, Base):
    """An ARQ: one accelerator of one profile group, bound to an instance by Nova."""

    __tablename__ = "accelerator_requests"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), nullable=False, unique=True)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    device_profile_id: Mapped[int] = mapped_column(ForeignKey("device_profiles.id"),
                                                   nullable=False)
    device_profile_group_id: Mapped[int] = mapped_column(Integer, nullable=False)
    project_id: Mapped[str | None] = mapped_column(String(255))
    hostname: Mapped[str | None] = mapped_column(String(255))
    device_rp_uuid: Mapped[str | None] = mapped_column(String(36))
    instance_uuid: Mapped[str | None] = mapped_column(String(36))
    attach_handle_id: Mapped[int | None] = mapped_column(
        ForeignKey("attach_handles.id", ondelete="SET NULL"))
    deployable_id: Mapped[int | None] = mapped_column(
        ForeignKey("deployables.id", ondelete="SET NULL"))
    bind_failure_reason: Mapped[str | None] = mapped_column(Text)
    # A standalone claim (API 2.8, no Nova instance): the Placement consumer acceld writes
    # the allocation for (claim_consumers); NULL for Nova's ARQs.
    consumer_uuid: Mapped[str | None] = mapped_column(String(36))
    __table_args__ = (
        Index("ix_accelerator_requests_instance_uuid", "instance_uuid"),
        Index("ix_accelerator_requests_consumer_uuid", "consumer_uuid"),
        Index("ix_accelerator_requests_project_id", "project_id"),
        Index("ix_accelerator_requests_device_profile_id", "device_profile_id"),
        Index("ix_accelerator_requests_attach_handle_id", "attach_handle_id"),
    )


class BindJob(TimestampMixin, Base):
    """A bind (or Nova notification) still to finish; survives a conductor crash."""

    __tablename__ = "bind_jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    arq_id: Mapped[int] = mapped_column(
        ForeignKey("accelerator_requests.id", ondelete="CASCADE"), nullable=False, unique=True)
    instance_uuid: Mapped[str | None] = mapped_column(String(36))
    # 'pending' (bind to do) or 'notify' (bind resolved, Nova event still to send).
    phase: Mapped[str] = mapped_column(String(16), nullable=False, default="pending")
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # The global request id (req-<uuid>) of the API call that started the bind: the
    # conductor's log lines for the job carry it, so one grep follows a boot end to end.
    global_request_id: Mapped[str | None] = mapped_column(String(64))
    __table_args__ = (Index("ix_bind_jobs_phase_lease", "phase", "lease_expires_at"),)


class HandleRelease(TimestampMixin, Base):
    """An attach handle whose host step (mdev removal, ...) the conductor still has to run.

    Written by the API in the unbind or delete transaction; the handle stays ``in_use``
    until the conductor released it through the node's agent (docs/arqs.md).
    """

    __tablename__ = "handle_releases"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attach_handle_id: Mapped[int] = mapped_column(
        ForeignKey("attach_handles.id", ondelete="CASCADE"), nullable=False, unique=True)
    hostname: Mapped[str] = mapped_column(String(255), nullable=False)
    driver_name: Mapped[str | None] = mapped_column(String(100))
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    __table_args__ = (Index("ix_handle_releases_lease", "lease_expires_at"),)


class ClaimConsumer(TimestampMixin, Base):
    """A Placement consumer whose allocation acceld writes for standalone claims (API 2.8).

    Its allocation is always the sum of its claimed ARQs that are BindStarted or Bound
    (acceld.db.claims.desired): ``due`` marks it to be written again (a claim refused, an ARQ
    released), in the transaction that made the change; a conductor claims due rows with a
    lease, writes Placement, and clears ``due`` (or deletes the row once no ARQ names it), so
    an allocation removal survives a conductor crash (acceld.conductor.placement.claim_allocations).
    """

    __tablename__ = "claim_consumers"
    consumer_uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    project_id: Mapped[str | None] = mapped_column(String(255))
    user_id: Mapped[str | None] = mapped_column(String(255))
    due: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(Timestamp)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    __table_args__ = (Index("ix_claim_consumers_due_lease", "due", "lease_expires_at"),)


class Agent(TimestampMixin, Base):
    """A node agent the conductor has heard from, and whether it is alive."""

    __tablename__ = "agents"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), nullable=False, unique=True)
    endpoint: Mapped[str] = mapped_column(String(255), nullable=False)
    # 'up' or 'down'.
    state: Mapped[str] = mapped_column(String(8), nullable=False, default="up")
    hardware_digest: Mapped[str | None] = mapped_column(String(64))
    heartbeat_interval: Mapped[int] = mapped_column(Integer, nullable=False, default=10)
    # The agent's discovery count its last hello carried: a hello with a new one is one
    # more health report of the node's devices (acceld.quarantine).
    last_discovery: Mapped[int | None] = mapped_column(BigInteger)
    last_seen_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class Lease(Base):
    """A named lease so that one conductor among several runs each periodic sweep."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), nullable=False)
    expires_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False)


class Conductor(Base):
    """A conductor sharing the database: live while its heartbeat is fresh (by the
    database's clock); the live ones form the hash ring that divides per-host work."""

    __tablename__ = "conductors"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    url: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False)
    heartbeat_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False)
    # Every heartbeat this conductor had read before this time (the database's clock) is
    # written to its agent's row: the liveness sweep judges silence only up to the oldest
    # of these among the live conductors (acceld.conductor.fleet.liveness). NULL: heartbeat_at.
    heard_through: Mapped[dt.datetime | None] = mapped_column(Timestamp)


class InternalNonce(Base):
    """A nonce of an internal credential a conductor accepted, until the credential
    expires: every conductor on the database refuses it again (acceld.db.nonces)."""

    __tablename__ = "internal_nonces"
    nonce: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False)
    __table_args__ = (Index("ix_internal_nonces_expires_at", "expires_at"),)


class NodeKeyGeneration(Base):
    """A node whose key was rotated or revoked: only ``generation`` is accepted (none while
    ``revoked``). A node without a row is at generation 0 (acceld.db.node_keys)."""

    __tablename__ = "node_key_generations"
    hostname: Mapped[str] = mapped_column(String(255), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    revoked: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    changed_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False, default=utcnow)


class PlacementSync(Base):
    """What was last written to Placement per deployable provider, to write only changes."""

    __tablename__ = "placement_sync"
    rp_uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), nullable=False)
    digest: Mapped[str | None] = mapped_column(String(64))
    # Set when the provider must be written again (changed, or a previous write failed).
    dirty: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    generation: Mapped[int | None] = mapped_column(BigInteger)
    updated_at: Mapped[dt.datetime | None] = mapped_column(Timestamp, onupdate=utcnow)
    # What is acceld's and what the operator's (acceld.conductor.placement.ownership):
    # the inventory's reserved as acceld last wrote or read it, the operator's part of it,
    # and the traits acceld wrote (space-separated). NULL: never written by this version.
    reserved: Mapped[int | None] = mapped_column(Integer)
    operator_reserved: Mapped[int | None] = mapped_column(Integer)
    traits: Mapped[str | None] = mapped_column(Text)


class SchemaMigration(Base):
    """Each migration applied, with its phase: lets a service of the previous release,
    which does not have the newer migrations' files, tell an expanded schema (which it
    can run on) from a contracted one (acceld.db.migrate.check_current)."""

    __tablename__ = "schema_migrations"
    revision: Mapped[str] = mapped_column(String(64), primary_key=True)
    phase: Mapped[str] = mapped_column(String(8), nullable=False)
    applied_at: Mapped[dt.datetime] = mapped_column(Timestamp, nullable=False)


class ProjectLock(Base):
    """One row per project that ever created under a limit: each limited create updates
    it first in its transaction, so creates for one project commit one at a time on every
    backend, Galera included (acceld.db.project_lock)."""

    __tablename__ = "project_locks"
    project_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    writes: Mapped[int] = mapped_column(BigInteger, nullable=False)


devices = Device.__table__
device_events = DeviceEvent.__table__
controlpath_ids = ControlpathId.__table__
deployables = Deployable.__table__
attributes = Attribute.__table__
attach_handles = AttachHandle.__table__
device_profiles = DeviceProfile.__table__
accelerator_requests = AcceleratorRequest.__table__
bind_jobs = BindJob.__table__
handle_releases = HandleRelease.__table__
claim_consumers = ClaimConsumer.__table__
agents = Agent.__table__
leases = Lease.__table__
conductors = Conductor.__table__
internal_nonces = InternalNonce.__table__
node_key_generations = NodeKeyGeneration.__table__
placement_sync = PlacementSync.__table__
schema_migrations = SchemaMigration.__table__
project_locks = ProjectLock.__table__
