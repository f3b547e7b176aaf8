"""Binding programs the device first when the profile group names a bitstream or a function.

As upstream: a group with ``accel:bitstream_id`` (a Glance image id) or
``accel:function_id`` (resolved by the node's agent to the one image whose
``accel:function_id`` property matches) gets its FPGA programmed before the
ARQ is bound; a failed program fails the bind with the reason. Naming both is
refused.

Programming is a network call of up to ``[conductor] program_timeout``, so it
runs before the bind's write transaction (:meth:`BindProgramming.before`), and
the transaction then checks that the deployable still holds that image
(:meth:`BindProgramming.enforce`). A deployable that already holds the image
is not programmed again; one that holds another image while some of its
attach handles are in use (or being taken) is not reprogrammed under its users
(the bind fails with the reason). Both are decided again once the
per-deployable program lease is held (binds of one deployable wait for each
other there, and the first may have programmed and bound meanwhile), under the
deployable's row lock, and the lease is held from that check until the program
is recorded. The image is checked once more in the bind transaction under the
same row lock (shared), which a program's hold needs exclusively: a bind whose
image was replaced, or that meets another program in progress, ends BindFailed
saying so (acceld.conductor.binding.target.lock_deployable). An unreachable agent
leaves the bind job to be retried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from oslo_config import cfg
from sqlalchemy import func, select, true

from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.target import BindRefused
from acceld.conductor.programming import Programmer, ProgramError
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import attach_handles, deployables, device_profiles, devices

LOG = logging.getLogger(__name__)

BITSTREAM_KEY = "accel:bitstream_id"
FUNCTION_KEY = "accel:function_id"


class ProgrammingUnavailable(Exception):
    """The agent (or the image service behind it) could not be reached: an outage the bind
    waits out (acceld.conductor.binding.outages) rather than a failed boot."""

    def __init__(self, message: str, hostname: str | None = None) -> None:
        super().__init__(message)
        self.hostname = hostname


@dataclass(frozen=True)
class ProgramVerdict:
    """What happened before the transaction, for the target it was decided for."""

    hostname: str
    device_rp_uuid: str
    instance_uuid: str
    image_id: str | None  # the image the deployable must hold; None: not decided (retry)
    refusal: str | None = None


def asks_programming(group: dict[str, str]) -> bool:
    """True when a profile group names an image to program (a bitstream or a function)."""
    return bool(group.get(BITSTREAM_KEY) or group.get(FUNCTION_KEY))


def wanted_image(group: dict[str, str]) -> tuple[str | None, str | None]:
    """(bitstream_id, function_id) the group names; BindRefused if it names both."""
    bitstream, function = group.get(BITSTREAM_KEY), group.get(FUNCTION_KEY)
    if bitstream and function:
        raise BindRefused(f"the profile group names both {BITSTREAM_KEY} and {FUNCTION_KEY}; "
                          "name one")
    return bitstream or None, function or None


class BindProgramming:
    """What the bind worker calls: program before the transaction, check inside it."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database,
                 programmer: Programmer | None = None) -> None:
        self.conf = conf
        self.programmer = programmer if programmer is not None else Programmer(conf, db)

    def before(self, db: Database, arq_id: int, placement_refused: bool = False,
               group: dict[str, str] | None = None) -> ProgramVerdict | None:
        """Program the ARQ's target if its group asks for it. None when it does not ask.

        Skips programming (image_id None) when the bind will be refused anyway: the bind
        checks (provider, host, agent, device status, resource class and traits) are run
        first on a read snapshot, and Placement's verdict is respected.

        ``group``: the ARQ's profile group when the caller has it (the bind job's claim
        read it): one that asks no programming is answered without a transaction, which
        most binds then skip. (A profile's groups never change; :meth:`enforce` reads the
        locked ARQ's group again in the bind transaction regardless.)
        """
        if group is not None and not asks_programming(group):
            return None
        with db.read() as conn:
            arq = conn.execute(select(
                arqs.c.uuid, arqs.c.hostname, arqs.c.device_rp_uuid, arqs.c.instance_uuid,
                arqs.c.device_profile_group_id, device_profiles.c.profile_json).select_from(
                arqs.join(device_profiles, device_profiles.c.id == arqs.c.device_profile_id))
                .where(arqs.c.id == arq_id)).first()
            if arq is None or not (arq.hostname and arq.device_rp_uuid and arq.instance_uuid):
                return None
            group = bind_target.group_of(arq.profile_json, arq.device_profile_group_id)
            if not asks_programming(group):
                return None
            key = (arq.hostname, arq.device_rp_uuid, arq.instance_uuid)
            try:
                bitstream, function = wanted_image(group)
            except BindRefused as refused:
                return ProgramVerdict(*key, image_id=None, refusal=refused.reason)
            if placement_refused or not _passes_checks(conn, bind_target_for(arq)):
                return ProgramVerdict(*key, image_id=None)  # the checks refuse this bind
            dep = conn.execute(select(
                deployables.c.id, deployables.c.uuid, deployables.c.name).where(
                deployables.c.rp_uuid == arq.device_rp_uuid)).one()
            held, in_use = _held_and_in_use(conn, dep.id)
        try:
            image = bitstream or self.programmer.resolve_function(dep.uuid, function)
            if held == image:
                return ProgramVerdict(*key, image_id=image)
            if in_use:
                return ProgramVerdict(*key, image_id=image,
                                      refusal=_in_use_reason(dep.name, held, in_use, image))

            def still_needed(conn: Any, deployable_id: int) -> bool:
                # Under the program lease: another bind may have programmed and bound
                # while this one waited for it. Held already: skip; in use: refuse.
                now_held, busy = _held_and_in_use(conn, deployable_id)
                if now_held == image:
                    return False
                if busy:
                    raise BindRefused(_in_use_reason(dep.name, now_held, busy, image))
                return True

            self.programmer.program(dep.uuid, "bitstream", image_id=image,
                                    precheck=still_needed)
            return ProgramVerdict(*key, image_id=image)
        except BindRefused as refused:
            return ProgramVerdict(*key, image_id=image, refusal=refused.reason)
        except ProgramError as exc:
            if exc.status == 503:
                raise ProgrammingUnavailable(exc.message, arq.hostname) from None
            what = f"bitstream {bitstream}" if bitstream else f"function {function}"
            return ProgramVerdict(*key, image_id=None,
                                  refusal=f"programming {what} into {dep.name} failed: "
                                          f"{exc.message}")

    def enforce(self, verdict: ProgramVerdict | None, conn: Any, arq: Any) -> None:
        """Inside the bind transaction (``arq`` is the locked row with its profile)."""
        group = bind_target.group_of(arq.profile_json, arq.device_profile_group_id)
        if not asks_programming(group):
            return
        if verdict is None or bind_target.target_of(verdict) != bind_target.target_of(arq):
            raise RuntimeError(f"bind target of ARQ {arq.uuid} changed while its device was "
                               "being programmed; the bind is retried")
        if verdict.refusal:
            raise BindRefused(verdict.refusal)
        if verdict.image_id is None:
            # Programming was skipped because the target looked unusable: the checks refuse
            # it now with their reason, or it became usable meanwhile and the job is retried.
            probe = bind_target_for(arq)
            for check in bind_target.CHECKS:
                check(conn, probe)
            raise RuntimeError(f"device of ARQ {arq.uuid} became usable while the bind was "
                               "prepared; the bind is retried to program it")
        # Locked (device, then deployable: the order take_handle keeps) so that the image
        # checked is the one the device holds when the bind commits; refused while another
        # program runs (bind_target.lock_deployable).
        dep = conn.execute(select(
            deployables.c.id, deployables.c.name, devices.c.uuid, devices.c.hostname)
            .join(devices, devices.c.id == deployables.c.device_id)
            .where(deployables.c.rp_uuid == arq.device_rp_uuid)).first()
        if dep is None:
            return  # the checks refuse it with their reason
        bind_target.lock_device(conn, dep.uuid, dep.id, dep.hostname)
        held = bind_target.lock_deployable(conn, dep.id, dep.name).bitstream_id
        if held != verdict.image_id:
            raise BindRefused(f"the deployable of provider {arq.device_rp_uuid} was "
                              f"reprogrammed with {held} while binding needed "
                              f"{verdict.image_id}")


def _held_and_in_use(conn: Any, deployable_id: int) -> tuple[str | None, int]:
    """The deployable's recorded bitstream and how many of its attach handles are in use."""
    held = conn.execute(select(deployables.c.bitstream_id).where(
        deployables.c.id == deployable_id)).scalar()
    in_use = conn.execute(select(func.count()).select_from(attach_handles).where(
        attach_handles.c.deployable_id == deployable_id,
        attach_handles.c.in_use == true())).scalar_one()
    return held, in_use


def _in_use_reason(name: str, held: str | None, in_use: int, image: str) -> str:
    return (f"deployable {name} holds bitstream {held or 'unknown'} and {in_use} of its "
            f"attach handles are in use; it cannot be reprogrammed with {image} under them")


def _passes_checks(conn: Any, probe: bind_target.BindTarget) -> bool:
    try:
        for check in bind_target.CHECKS:
            check(conn, probe)
    except BindRefused:
        return False
    return True


def bind_target_for(arq: Any) -> bind_target.BindTarget:
    return bind_target.BindTarget(
        arq_uuid=arq.uuid, hostname=arq.hostname, device_rp_uuid=arq.device_rp_uuid,
        instance_uuid=arq.instance_uuid,
        group=bind_target.group_of(arq.profile_json, arq.device_profile_group_id))
