"""Telling Nova that ARQ binds resolved: ``accelerator-request-bound`` server external events;
and asking Nova whether a uuid is an instance (:class:`NovaInstances`, for standalone claims).

Nova's compute waits for one event per ARQ (tag = ARQ uuid) before it spawns
the instance; without it the boot hangs until Nova's timeout. The connection
comes from the ``[nova]`` keystoneauth options (``auth_type``, credentials or
``endpoint_override``). Without ``[nova] auth_type`` binding still works and
each batch logs that no event was sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from keystoneauth1 import exceptions as ksa_exc
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from acceld import outages, request_ids
from acceld.serving import serving_slot
from acceld.clients import deadline as deadlines

LOG = logging.getLogger(__name__)

EVENT_NAME = "accelerator-request-bound"
PATH = "/os-server-external-events"
MICROVERSION = "2.82"  # the first compute version that knows accelerator-request-bound
HEADERS = {"OpenStack-API-Version": f"compute {MICROVERSION}",
           "X-OpenStack-Nova-API-Version": MICROVERSION}

# What became of one event.
DELIVERED = "delivered"  # Nova took it (or there is no Nova to tell)
DROPPED = "dropped"  # Nova refused it for good; logged, not retried
RETRY = "retry"  # Nova could not be reached; the job tries again later

NOVA = "Nova"  # the outage's name in the log
_CONSEQUENCE = "accelerator-request-bound events wait and are sent when it is back"


@dataclass(frozen=True)
class Event:
    server_uuid: str
    arq_uuid: str
    status: str  # "completed" | "failed"

    def to_json(self) -> dict[str, str]:
        return {"name": EVENT_NAME, "server_uuid": self.server_uuid, "tag": self.arq_uuid,
                "status": self.status}


def is_configured(conf: cfg.ConfigOpts) -> bool:
    return bool(conf.nova.auth_type or conf.nova.auth_section)


def adapter_of(conf: cfg.ConfigOpts):  # type: ignore[no-untyped-def]
    """The keystoneauth adapter for Nova from ``[nova]`` (None when not configured)."""
    if not is_configured(conf):
        return None
    auth = ks_loading.load_auth_from_conf_options(conf, "nova")
    session = ks_loading.load_session_from_conf_options(conf, "nova", auth=auth)
    deadlines.watch(session.session)
    return ks_loading.load_adapter_from_conf_options(
        conf, "nova", session=session, auth=auth,
        service_type=conf.nova.service_type or "compute")


class NovaUnavailable(Exception):
    """Nova could not say (unreachable, too slow, or it refused acceld's credentials)."""


class NovaInstances:
    """Whether a uuid is one of Nova's instances, of any project and in any state: a shelved
    and offloaded instance holds nothing in Placement and has no ARQ, so only Nova knows
    it (a standalone claim must not take its uuid as consumer: Nova's unshelve would then
    fail).

    Asked as ``GET /servers?all_tenants=1&uuid=<uuid>``, not ``GET /servers/{uuid}``: to
    credentials that are not an administrator's in Nova's eyes (the ``service`` role alone,
    which the events need), a show of another project's server is 404, the answer for a
    uuid Nova does not know, so such credentials would let any project's instance through.
    ``all_tenants`` is refused to them (403), and so is the claim (NovaUnavailable): the
    ``[nova]`` credentials must be allowed to list every project's servers and filter them
    by uuid (``os_compute_api:servers:index:get_all_tenants`` and ``allow_all_filters``,
    an administrator by default)."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self._adapter = adapter_of(conf)
        self.deadline = float(conf.nova.deadline)

    @property
    def configured(self) -> bool:
        return self._adapter is not None

    def is_instance(self, uuid: str) -> bool:
        """True for an instance of any project, False for a uuid Nova does not know;
        NovaUnavailable, also when the credentials cannot see every project's servers."""
        assert self._adapter is not None
        path = f"/servers?all_tenants=1&uuid={uuid}"
        try:
            # In an API worker, the next request is served while Nova answers.
            with serving_slot.stepped_out(), deadlines.bounded(self.deadline, NOVA):
                resp = self._adapter.get(path, headers=HEADERS, raise_exc=False,
                                         global_request_id=request_ids.current_global_id())
        except (deadlines.DeadlinePassed, ksa_exc.ClientException) as exc:
            raise NovaUnavailable(f"Nova did not answer GET {path}: {exc}") from exc
        if resp.status_code in (401, 403):
            raise NovaUnavailable(
                f"Nova refused acceld's [nova] credentials a list of every project's servers "
                f"(GET {path}: {resp.status_code}); they need "
                "os_compute_api:servers:index:get_all_tenants (an administrator)")
        if resp.status_code != 200:
            raise NovaUnavailable(f"Nova answered GET {path} with {resp.status_code}: "
                                  f"{resp.text[:300]}")
        try:
            ids = {server["id"] for server in resp.json()["servers"]}
        except (ValueError, KeyError, TypeError) as exc:
            raise NovaUnavailable(f"Nova's answer to GET {path} is not a server list: "
                                  f"{resp.text[:300]}") from exc
        if ids - {uuid}:
            # Without allow_all_filters Nova drops the uuid filter and lists every server:
            # a page of them says nothing about this uuid.
            raise NovaUnavailable(
                f"Nova ignored the uuid filter of GET {path} for acceld's [nova] "
                "credentials; they need os_compute_api:servers:allow_all_filters (an "
                "administrator) to see every project's servers")
        return uuid in ids


class NovaNotifier:
    """Posts event batches; returns an outcome per ARQ uuid.

    Retries are keystoneauth's, from ``[nova] connect_retries`` (no connection, timeout)
    and ``status_code_retries`` (the ``retriable_status_codes``, 503 by default), with
    their delays: one retry setting, no loop of acceld's own on top. A batch Nova still
    does not take is left to the bind job (RETRY), which sends it again later; the outage
    is logged once when it starts and once when it ends (acceld.outages)."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self._adapter = adapter_of(conf)
        self._outages = outages.process_log()
        # [nova] timeout bounds each attempt's connect and read; this, the whole send
        # (retries, their delays and the token included), however slowly Nova answers.
        self.deadline = float(conf.nova.deadline)

    @property
    def configured(self) -> bool:
        return self._adapter is not None

    def send(self, events: list[Event]) -> dict[str, str]:
        if not events:
            return {}
        if self._adapter is None:
            LOG.info("Nova is not configured ([nova] auth_type unset): no %s event sent for "
                     "ARQs %s", EVENT_NAME, ", ".join(e.arq_uuid for e in events))
            return {e.arq_uuid: DELIVERED for e in events}
        body = {"events": [e.to_json() for e in events]}
        arqs = ", ".join(e.arq_uuid for e in events)
        try:
            with deadlines.bounded(self.deadline, NOVA):
                # The request (or bind job) these events are for: Nova's log lines name it.
                resp = self._adapter.post(PATH, json=body, headers=HEADERS, raise_exc=False,
                                          global_request_id=request_ids.current_global_id())
        except deadlines.DeadlinePassed as exc:
            if exc.what != NOVA:  # the caller's bound (the bind job's lease) ran out
                LOG.info("%s events for ARQs %s are left for later: %s", EVENT_NAME, arqs, exc)
                return {e.arq_uuid: RETRY for e in events}
            self._outages.down(NOVA, f"it did not answer: {exc}", _CONSEQUENCE, LOG)
            LOG.info("%s events for ARQs %s are left for later: Nova did not answer within "
                     "[nova] deadline (%g s)", EVENT_NAME, arqs, self.deadline)
            return {e.arq_uuid: RETRY for e in events}
        except (ksa_exc.ConnectionError, ksa_exc.RequestTimeout) as exc:
            self._outages.down(NOVA, f"{exc.__class__.__name__}: {exc}", _CONSEQUENCE, LOG)
            LOG.info("%s events for ARQs %s are left for later: Nova unreachable", EVENT_NAME,
                     arqs)
            return {e.arq_uuid: RETRY for e in events}
        except ksa_exc.ClientException as exc:  # no endpoint, auth failure, ...
            LOG.error("Cannot reach Nova to send %s events: %s", EVENT_NAME, exc)
            return {e.arq_uuid: RETRY for e in events}
        if resp.status_code >= 500:
            self._outages.down(NOVA, f"it answered {resp.status_code}: {resp.text[:300]}",
                               _CONSEQUENCE, LOG)
            LOG.info("%s events for ARQs %s are left for later: Nova answered %s", EVENT_NAME,
                     arqs, resp.status_code)
            return {e.arq_uuid: RETRY for e in events}
        self._outages.up(NOVA, LOG)
        return self._outcomes(events, resp)

    def _outcomes(self, events: list[Event], resp) -> dict[str, str]:  # type: ignore[no-untyped-def]
        if resp.status_code == 200:
            LOG.info("Nova took %s events for ARQs %s", EVENT_NAME,
                     ", ".join(f"{e.arq_uuid} ({e.status})" for e in events))
            return {e.arq_uuid: DELIVERED for e in events}
        if resp.status_code == 207:
            return self._per_event(events, resp)
        LOG.error("Nova refused %s events for ARQs %s with %s: %s", EVENT_NAME,
                  ", ".join(e.arq_uuid for e in events), resp.status_code, resp.text[:300])
        return {e.arq_uuid: DROPPED for e in events}

    def _per_event(self, events: list[Event], resp) -> dict[str, str]:  # type: ignore[no-untyped-def]
        """207: Nova answers each event with its own code, in the order sent."""
        try:
            answered = resp.json().get("events") or []
        except ValueError:
            answered = []
        by_tag = {a.get("tag"): a for a in answered if isinstance(a, dict)}
        outcomes: dict[str, str] = {}
        for event in events:
            code = (by_tag.get(event.arq_uuid) or {}).get("code")
            if code == 200:
                outcomes[event.arq_uuid] = DELIVERED
            elif code == 422:
                LOG.warning("Nova could not take the %s event for ARQ %s: instance %s is not "
                            "on a host yet (422); not retried, Nova reads resolved ARQs "
                            "itself", EVENT_NAME, event.arq_uuid, event.server_uuid)
                outcomes[event.arq_uuid] = DROPPED
            else:
                LOG.error("Nova refused the %s event for ARQ %s (instance %s) with code %s",
                          EVENT_NAME, event.arq_uuid, event.server_uuid, code)
                outcomes[event.arq_uuid] = DROPPED
        return outcomes
