"""Placement client: the few calls acceld makes, through a keystoneauth adapter.

Configured by the standard keystoneauth options of ``[placement]``: in a cloud,
``auth_type = password`` (or a service user) and the catalog; against a noauth2
Placement (tests, the all-in-one), ``auth_type = admin_token``, ``endpoint`` and
``token = admin``. Every request carries one pinned microversion, so that
responses have one shape (1.39 is the newest that Placement 16.0 serves; acceld
needs 1.20 for create-with-parent bodies, 1.26 for ``reserved == total``,
1.29+ for nested allocation candidates and 1.37 to put back a provider that was
re-parented by hand).

Errors are typed so that callers can tell "try again later" (:class:`PlacementUnavailable`:
no connection, timeout, 5xx) from "Placement refused this" (:class:`PlacementError`).
Writes that carry a provider generation re-read it and retry on a 409 conflict.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable
from urllib.parse import quote

from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from acceld import request_ids
from acceld.clients import deadline as deadlines
from acceld.serving import serving_slot

LOG = logging.getLogger(__name__)

MICROVERSION = "1.39"
DEFAULT_TIMEOUT = 30.0
DEFAULT_DEADLINE = 45.0
# How many times a generation conflict (409) is resolved by re-reading before giving up.
CONFLICT_RETRIES = 5
OWNER_TRAIT = "OWNER_CYBORG"
CUSTOM_PREFIX = "CUSTOM_"


class PlacementError(Exception):
    """Placement answered, and refused the request."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PlacementUnavailable(PlacementError):
    """Placement could not be reached, timed out, or failed (5xx): retry later."""


class GenerationConflict(PlacementError):
    """The provider changed under us more often than :data:`CONFLICT_RETRIES` allows."""


class ConsumerConflict(PlacementError):
    """The consumer's allocations changed since they were read (its generation moved)."""


class ProviderInUse(PlacementError):
    """The provider has allocations (or children), so it cannot be deleted or shrunk."""


@dataclass
class Provider:
    uuid: str
    name: str
    generation: int
    parent_uuid: str | None
    root_uuid: str

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> "Provider":
        return cls(uuid=body["uuid"], name=body["name"], generation=body["generation"],
                   parent_uuid=body.get("parent_provider_uuid"),
                   root_uuid=body.get("root_provider_uuid") or body["uuid"])


@dataclass(frozen=True)
class Consumer:
    """``GET /allocations/{consumer}``: provider uuid -> {resource class: amount}, and, where
    it has allocations, its generation, project, user and consumer type (else None)."""

    allocations: dict[str, dict[str, int]]
    generation: int | None
    project_id: str | None
    user_id: str | None
    consumer_type: str | None


def is_configured(conf: cfg.ConfigOpts) -> bool:
    """Whether ``[placement]`` names an auth plugin: Placement is optional."""
    return bool(conf.placement.auth_type)


def from_conf(conf: cfg.ConfigOpts) -> "PlacementClient | None":
    """A client from the ``[placement]`` options, or None when Placement is not configured."""
    if not is_configured(conf):
        return None
    auth = ks_loading.load_auth_from_conf_options(conf, "placement")
    session = ks_loading.load_session_from_conf_options(
        conf, "placement", auth=auth, timeout=conf.placement.timeout or DEFAULT_TIMEOUT)
    extra: dict[str, Any] = {}
    if not conf.placement.service_type:
        extra["service_type"] = "placement"
    adapter = ks_loading.load_adapter_from_conf_options(
        conf, "placement", session=session, auth=auth, raise_exc=False,
        default_microversion=MICROVERSION, **extra)
    deadlines.watch(session.session)
    return PlacementClient(adapter, deadline=float(conf.placement.deadline))


def _error_of(resp: Any) -> tuple[str, str | None]:
    """The message and Placement error code of an error response."""
    try:
        err = resp.json()["errors"][0]
        return err.get("detail") or err.get("title") or resp.text, err.get("code")
    except Exception:  # noqa: BLE001 - any non-JSON body is just text
        return (resp.text or "")[:500], None


class PlacementClient:
    """Thin, typed calls over a keystoneauth adapter (which carries auth and microversion)."""

    def __init__(self, adapter: Any, deadline: float = DEFAULT_DEADLINE) -> None:
        self.adapter = adapter
        # Each call in all (``timeout`` bounds one attempt's connect and read): a Placement
        # that never answers, or trickles, is unavailable after this (acceld.clients.deadline).
        self.deadline = deadline
        self._known_classes: set[str] = set()
        self._known_traits: set[str] = set()

    # -- transport -------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None,
                 ok: Iterable[int] = (200,)) -> Any:
        # The request (or bind job) this call is made for: Placement's log lines name it.
        kwargs: dict[str, Any] = {"global_request_id": request_ids.current_global_id()}
        if body is not None:
            kwargs["json"] = body
        try:
            # In an API worker, the next request is served while Placement answers.
            with serving_slot.stepped_out(), deadlines.bounded(self.deadline, "Placement"):
                resp = self.adapter.request(path, method, **kwargs)
        except deadlines.DeadlinePassed as exc:
            raise PlacementUnavailable(f"Placement did not answer {method} {path}: "
                                       f"{exc}") from exc
        except ks_exc.ClientException as exc:
            # Unreachable, no endpoint, or the token could not be had (credentials): all
            # fixed outside acceld, so the sync backs off and retries.
            raise PlacementUnavailable(f"Placement unreachable ({method} {path}): {exc}") from exc
        if resp.status_code in ok:
            return resp
        message, code = _error_of(resp)
        text = f"Placement {method} {path}: {resp.status_code} {message}"
        if resp.status_code >= 500 or resp.status_code in (401, 403):
            # 401/403: misconfigured credentials, which an operator fixes without a restart.
            raise PlacementUnavailable(text, resp.status_code, code)
        raise PlacementError(text, resp.status_code, code)

    # -- providers -------------------------------------------------------------------------

    def find_provider_by_name(self, name: str) -> Provider | None:
        """The provider named ``name`` (e.g. a compute node's), or None."""
        resp = self._request("GET", f"/resource_providers?name={quote(name, safe='')}")
        found = resp.json()["resource_providers"]
        return Provider.from_json(found[0]) if found else None

    def get_provider(self, uuid: str) -> Provider | None:
        resp = self._request("GET", f"/resource_providers/{uuid}", ok=(200, 404))
        return None if resp.status_code == 404 else Provider.from_json(resp.json())

    def owned_in_tree(self, root_uuid: str) -> list[Provider]:
        """The providers of ``root_uuid``'s tree that carry OWNER_CYBORG: one call per tree."""
        resp = self._request("GET", f"/resource_providers?in_tree={root_uuid}"
                                    f"&required={OWNER_TRAIT}")
        return [Provider.from_json(p) for p in resp.json()["resource_providers"]]

    def update_provider(self, uuid: str, name: str, parent_uuid: str) -> Provider:
        """Set a provider's name and parent (re-parenting needs microversion 1.37)."""
        resp = self._request("PUT", f"/resource_providers/{uuid}",
                             {"name": name, "parent_provider_uuid": parent_uuid})
        return Provider.from_json(resp.json())

    def ensure_provider(self, uuid: str, name: str, parent_uuid: str) -> Provider:
        """The provider ``uuid``, created as a child of ``parent_uuid`` when missing."""
        existing = self.get_provider(uuid)
        if existing is not None:
            if existing.parent_uuid != parent_uuid:
                LOG.warning("Provider %s (%s) has parent %s, expected %s; leaving it as it is",
                            name, uuid, existing.parent_uuid, parent_uuid)
            return existing
        body = {"uuid": uuid, "name": name, "parent_provider_uuid": parent_uuid}
        resp = self._request("POST", "/resource_providers", body, ok=(200, 409))
        if resp.status_code == 200:  # 1.20+: the body is the new provider
            LOG.info("Created Placement provider %s (%s) under %s", name, uuid, parent_uuid)
            return Provider.from_json(resp.json())
        # Created concurrently (by another conductor) or the name is taken by another uuid.
        again = self.get_provider(uuid)
        if again is not None:
            return again
        message, code = _error_of(resp)
        raise PlacementError(f"Cannot create provider {name} ({uuid}): {message}", 409, code)

    def delete_provider(self, uuid: str) -> bool:
        """Delete the provider; False if it was already gone. ProviderInUse if allocated."""
        resp = self._request("DELETE", f"/resource_providers/{uuid}", ok=(204, 404, 409))
        if resp.status_code == 409:
            message, code = _error_of(resp)
            raise ProviderInUse(f"Provider {uuid} cannot be deleted: {message}", 409, code)
        return resp.status_code == 204

    # -- resource classes and traits -------------------------------------------------------

    def ensure_resource_class(self, name: str) -> None:
        """Create a custom resource class (standard ones exist already)."""
        if not name.startswith(CUSTOM_PREFIX) or name in self._known_classes:
            return
        self._request("PUT", f"/resource_classes/{name}", ok=(201, 204))
        self._known_classes.add(name)

    def ensure_trait(self, name: str) -> None:
        """Create a custom trait (standard ones, like OWNER_CYBORG, are attached, never created)."""
        if not name.startswith(CUSTOM_PREFIX) or name in self._known_traits:
            return
        self._request("PUT", f"/traits/{name}", ok=(201, 204))
        self._known_traits.add(name)

    # -- generation-guarded writes ---------------------------------------------------------

    def _guarded_put(self, uuid: str, path: str, payload: dict[str, Any],
                     generation: int | None, attempts: int = CONFLICT_RETRIES) -> int:
        """PUT ``payload`` with the provider generation; on a 409 conflict re-read and retry
        (``attempts`` in all: 1 for a payload merged from a read, which must be merged again)."""
        for _ in range(attempts):
            if generation is None:
                provider = self.get_provider(uuid)
                if provider is None:
                    raise PlacementError(f"Provider {uuid} does not exist", 404)
                generation = provider.generation
            body = dict(payload, resource_provider_generation=generation)
            resp = self._request("PUT", path, body, ok=(200, 409))
            if resp.status_code == 200:
                return int(resp.json()["resource_provider_generation"])
            message, code = _error_of(resp)
            if code != "placement.concurrent_update":
                raise ProviderInUse(f"Placement PUT {path}: {message}", 409, code)
            LOG.debug("Generation conflict on %s; re-reading", path)
            generation = None
        raise GenerationConflict(f"Provider {uuid} kept changing; gave up after "
                                 f"{attempts} attempt(s)", 409)

    def set_inventory(self, uuid: str, resource_class: str | None, total: int, reserved: int,
                      generation: int | None = None, attempts: int = CONFLICT_RETRIES) -> int:
        """Make the provider's inventory exactly this one class (or none); the new generation."""
        inventories: dict[str, Any] = {}
        if resource_class and total > 0:
            self.ensure_resource_class(resource_class)
            inventories[resource_class] = {
                "total": total, "max_unit": total, "min_unit": 1, "step_size": 1,
                "reserved": max(0, min(reserved, total)), "allocation_ratio": 1.0}
        path = f"/resource_providers/{uuid}/inventories"
        try:
            return self._guarded_put(uuid, path, {"inventories": inventories}, generation,
                                     attempts)
        except PlacementError as exc:
            if exc.status != 400 or resource_class not in self._known_classes:
                raise
            # The class we created is gone (Placement's database wiped or restored): again.
            self._known_classes.discard(resource_class)
            self.ensure_resource_class(resource_class)
            return self._guarded_put(uuid, path, {"inventories": inventories}, generation,
                                     attempts)

    def get_inventories(self, uuid: str) -> dict[str, dict[str, Any]]:
        resp = self._request("GET", f"/resource_providers/{uuid}/inventories")
        return resp.json()["inventories"]

    def get_traits(self, uuid: str) -> list[str]:
        resp = self._request("GET", f"/resource_providers/{uuid}/traits")
        return resp.json()["traits"]

    def read_inventories(self, uuid: str) -> tuple[dict[str, dict[str, Any]], int]:
        """The provider's inventories and its generation as of that read."""
        body = self._request("GET", f"/resource_providers/{uuid}/inventories").json()
        return body["inventories"], int(body["resource_provider_generation"])

    def read_traits(self, uuid: str) -> tuple[set[str], int]:
        """The provider's traits and its generation as of that read."""
        body = self._request("GET", f"/resource_providers/{uuid}/traits").json()
        return set(body["traits"]), int(body["resource_provider_generation"])

    def set_traits(self, uuid: str, traits: Iterable[str], generation: int | None = None,
                   attempts: int = CONFLICT_RETRIES) -> int:
        """Make the provider's traits exactly ``traits`` plus OWNER_CYBORG; the new generation."""
        wanted = sorted(set(traits) | {OWNER_TRAIT})
        for trait in wanted:
            self.ensure_trait(trait)
        path = f"/resource_providers/{uuid}/traits"
        try:
            return self._guarded_put(uuid, path, {"traits": wanted}, generation, attempts)
        except PlacementError as exc:
            if exc.status != 400 or not self._known_traits.intersection(wanted):
                raise
            # Traits we created are gone (Placement's database wiped or restored): again.
            self._known_traits.difference_update(wanted)
            for trait in wanted:
                self.ensure_trait(trait)
            return self._guarded_put(uuid, path, {"traits": wanted}, generation, attempts)

    # -- allocations -----------------------------------------------------------------------

    def provider_allocations(self, uuid: str) -> dict[str, Any]:
        """Allocations against the provider, by consumer ({} when none or no provider)."""
        resp = self._request("GET", f"/resource_providers/{uuid}/allocations", ok=(200, 404))
        return {} if resp.status_code == 404 else resp.json()["allocations"]

    def consumer_allocations(self, consumer_uuid: str) -> dict[str, dict[str, int]]:
        """An instance's allocations: provider uuid -> {resource class: amount}."""
        resp = self._request("GET", f"/allocations/{consumer_uuid}")
        return {rp: alloc["resources"] for rp, alloc in resp.json()["allocations"].items()}

    def consumer(self, consumer_uuid: str) -> Consumer:
        """A consumer's allocations, generation, project and type, as Placement holds them
        (no generation, project or type: Placement has no such consumer, which is the case
        of every consumer without allocations)."""
        body = self._request("GET", f"/allocations/{consumer_uuid}").json()
        return Consumer({rp: dict(alloc["resources"])
                         for rp, alloc in body["allocations"].items()},
                        body.get("consumer_generation"), body.get("project_id"),
                        body.get("user_id"), body.get("consumer_type"))

    def put_allocations(self, consumer_uuid: str, allocations: dict[str, dict[str, int]],
                        project_id: str, user_id: str, generation: int | None,
                        consumer_type: str) -> None:
        """Make the consumer's allocations exactly ``allocations`` (none: removed), if its
        generation is still ``generation``; ConsumerConflict when it moved, PlacementError
        when Placement refuses (not enough capacity, an unknown provider)."""
        body = {"allocations": {rp: {"resources": res} for rp, res in allocations.items()},
                "project_id": project_id, "user_id": user_id,
                "consumer_generation": generation, "consumer_type": consumer_type}
        resp = self._request("PUT", f"/allocations/{consumer_uuid}", body, ok=(204, 409))
        if resp.status_code == 204:
            return
        message, code = _error_of(resp)
        text = f"Placement PUT /allocations/{consumer_uuid}: 409 {message}"
        if code == "placement.concurrent_update":
            raise ConsumerConflict(text, 409, code)
        raise PlacementError(text, 409, code)

    # -- allocation candidates (explain) ---------------------------------------------------

    def allocation_candidates(self, query: str) -> dict[str, Any]:
        """``GET /allocation_candidates?<query>`` as Nova asks it; the answer's body
        (``allocation_requests`` and ``provider_summaries``). ``query`` is encoded already."""
        return self._request("GET", f"/allocation_candidates?{query}").json()
