"""Bind checks against Placement, for clouds where ``[placement]`` is configured.

Nova binds an ARQ to ``device_rp_uuid``, the provider it allocated for the
ARQ's group. Besides the database checks of :mod:`acceld.conductor.bind_target`,
acceld asks Placement that this provider sits in the tree of the compute node
named ``hostname`` and (``[placement] check_allocations``, default on) that the
instance's allocation includes it, so that a bind can never take a device that
Placement did not give to that instance.

These are network calls: run :func:`check_bind` before the bind's database
transaction, never inside it (a SQLite write lock must not wait on HTTP). It
raises :class:`~acceld.conductor.bind_target.BindRefused` for a wrong target,
and lets :class:`~acceld.clients.placement.PlacementUnavailable` through so the
caller can retry the bind job later instead of failing a boot on a blip.
"""

from __future__ import annotations

from oslo_config import cfg

from acceld.clients import placement as pl
from acceld.conductor.bind_target import BindRefused


def check_bind(client: pl.PlacementClient | None, conf: cfg.ConfigOpts, hostname: str,
               device_rp_uuid: str, instance_uuid: str) -> None:
    """Refuse a bind whose provider is not the host's, or not allocated to the instance.

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
    if not conf.placement.check_allocations:
        return
    allocations = client.consumer_allocations(instance_uuid)
    if device_rp_uuid not in allocations:
        held = ", ".join(sorted(allocations)) or "nothing"
        raise BindRefused(f"instance {instance_uuid} has no Placement allocation on resource "
                          f"provider {device_rp_uuid} (it holds {held})")
