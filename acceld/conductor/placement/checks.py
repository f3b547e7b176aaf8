"""Bind checks against Placement, for clouds where ``[placement]`` is configured.

Nova binds an ARQ to ``device_rp_uuid``, the provider it allocated for the
ARQ's group. Besides the database checks of :mod:`acceld.conductor.binding.target`,
acceld asks Placement that this provider sits in the tree of the compute node
named ``hostname`` and (``[placement] check_allocations``, default on) that the
instance's allocation includes it, so that a bind can never take a device that
Placement did not give to that instance.

These are network calls: run :func:`check_bind` before the bind's database
transaction, never inside it (a SQLite write lock must not wait on HTTP). It
raises :class:`~acceld.conductor.binding.target.BindRefused` for a wrong target,
and lets :class:`~acceld.clients.placement.PlacementUnavailable` through so the
caller can retry the bind job later instead of failing a boot on a blip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oslo_config import cfg
from sqlalchemy import select

from acceld.clients import placement as pl
from acceld.conductor.placement import claim_allocations
from acceld.conductor.binding.target import BindRefused, target_of
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests


def check_bind(client: pl.PlacementClient | None, conf: cfg.ConfigOpts, hostname: str,
               device_rp_uuid: str, instance_uuid: str | None) -> None:
    """Refuse a bind whose provider is not the host's, or not allocated to the instance
    (no instance: a standalone claim, whose allocation acceld writes itself).

    Does nothing when Placement is not configured (``client`` is None).
    """
    if client is None:
        return
    provider = client.get_provider(device_rp_uuid)
    if provider is None:
        raise BindRefused(f"device_rp_uuid {device_rp_uuid} is not a resource provider in "
                          "Placement")
    compute = client.find_provider_by_name(hostname)
    if compute is None:
        raise BindRefused(f"host {hostname} has no compute-node resource provider in Placement")
    if provider.root_uuid != compute.uuid:
        raise BindRefused(f"resource provider {device_rp_uuid} ({provider.name}) is not a "
                          f"provider of host {hostname} (compute node provider {compute.uuid})")
    if instance_uuid is None or not conf.placement.check_allocations:
        return
    allocations = client.consumer_allocations(instance_uuid)
    if device_rp_uuid not in allocations:
        held = ", ".join(sorted(allocations)) or "nothing"
        raise BindRefused(f"instance {instance_uuid} has no Placement allocation on resource "
                          f"provider {device_rp_uuid} (it holds {held})")


@dataclass(frozen=True)
class Verdict:
    """The outcome of the Placement checks for one bind target."""

    hostname: str | None
    device_rp_uuid: str | None
    instance_uuid: str | None
    refusal: str | None  # None: Placement agrees


class BindPlacementCheck:
    """What the bind worker calls: check before the transaction, enforce inside it."""

    def __init__(self, conf: cfg.ConfigOpts, client: pl.PlacementClient | None = None) -> None:
        self.conf = conf
        self.client = client if client is not None else pl.from_conf(conf)

    def before(self, db: Database, arq_id: int) -> Verdict | None:
        """Check the ARQ's target in Placement (None when not configured or no ARQ).

        Reads the ARQ outside any transaction; raises PlacementUnavailable (retry later).
        """
        if self.client is None:
            return None
        with db.read() as conn:
            arq = conn.execute(select(
                accelerator_requests.c.hostname, accelerator_requests.c.device_rp_uuid,
                accelerator_requests.c.instance_uuid, accelerator_requests.c.consumer_uuid,
                accelerator_requests.c.state).where(
                accelerator_requests.c.id == arq_id)).first()
        if arq is None or not (arq.hostname and arq.device_rp_uuid
                               and (arq.instance_uuid or arq.consumer_uuid)):
            return None
        try:
            check_bind(self.client, self.conf, arq.hostname, arq.device_rp_uuid,
                       arq.instance_uuid)
            if arq.consumer_uuid and arq.state == "BindStarted":
                # A standalone claim: acceld allocates, as Nova's scheduler would have, so
                # that Placement refuses a provider already full (claim_allocations).
                claim_allocations.write(self.client, db, arq.consumer_uuid)
        except BindRefused as refused:
            return Verdict(arq.hostname, arq.device_rp_uuid, arq.instance_uuid, refused.reason)
        return Verdict(arq.hostname, arq.device_rp_uuid, arq.instance_uuid, None)

    def enforce(self, verdict: Verdict | None, arq: Any) -> None:
        """Inside the bind transaction: refuse what Placement refused.

        ``arq`` is the locked ARQ row. A target that changed since :meth:`before` (an
        unbind and a new bind in between) was not checked: raise, so the job is retried.
        """
        if self.client is None:
            return
        if verdict is None or target_of(verdict) != target_of(arq):
            raise RuntimeError(f"bind target of ARQ {arq.uuid} changed during the Placement "
                               "check; the bind is retried")
        if verdict.refusal:
            raise BindRefused(verdict.refusal)
