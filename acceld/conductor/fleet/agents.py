"""Agents as the conductor sees them: registration, heartbeats, inventory pulls, liveness.

``POST /hello`` (the seed's conductor call) is both an agent's registration
and its heartbeat: ``{"status": "READY", "endpoint": "host:port", "hostname":
..., "heartbeat_interval": 10, "hardware_digest": "<sha256>"}``. The conductor
records the contact, and only when the digest differs from the one it stored
with the node's inventory (or it has none, e.g. while a vanished device is
held) does it pull the agent's ``GET /hardware`` and reconcile. So an
unchanged node costs one UPDATE of its agent row per heartbeat.

The answer tells the agent how its report went: 200, or 400 naming the
records refused (the rest of the report was applied), or 502 when the
conductor could not read the agent's hardware (a fixed reason: the details are
in the conductor's log). A hello is refused (400) before anything is recorded
when its endpoint is not at the address it came from (acceld.conductor.fleet.endpoints);
the pull itself is bounded, one per host and a few at once (acceld.conductor.fleet.pulls).

Liveness: a periodic sweep marks ``down``, with a WARNING naming the host and
its last contact, every agent silent for
``[conductor] agent_down_intervals`` of its heartbeat interval, judged up to the
point the live conductors have written the hellos they heard
(acceld.conductor.fleet.liveness). Each conductor sweeps the hosts the ring gives it
(acceld.conductor.fleet.membership); the mark is a compare-and-set, so a host two
conductors sweep during a rebalance is marked once. Its next hello brings it
back ``up``. Binds on a down host are refused
(:func:`host_is_up`, called by acceld.conductor.binding.target).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import falcon
from oslo_config import cfg
from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from acceld import fastcheck
from acceld.db import node_keys
from acceld.clients.internal import internal_url
from acceld import quarantine
from acceld.conductor.fleet import endpoints
from acceld.conductor.fleet.membership import EVERYTHING, Ownership, dead_after
from acceld.conductor.fleet.liveness import Liveness
from acceld.conductor.fleet.pulls import PullFailed, Pulls
from acceld.conductor.reconcile import apply_report
from acceld.conductor.service import PeriodicTask
from acceld.db import agents as agents_db
from acceld.db import conductors as conductors_db
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock
from acceld.internal import versions
from acceld.internal.auth import Signer, node_key
from acceld.internal.server import caller_node, json_body, respond
from acceld.jsonschemas import strict_validator
from acceld.metrics import record as metrics
from acceld.runtime.secrets import internal_secret

LOG = logging.getLogger(__name__)

HELLO_SCHEMA = strict_validator({
    "type": "object",
    "required": ["status", "endpoint"],
    "additionalProperties": False,
    "properties": {
        "status": {"const": "READY"},
        "endpoint": {"type": "string", "pattern": r"^(https?://)?[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$",
                     "maxLength": 255},
        "hostname": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$"},
        "heartbeat_interval": {"type": "integer", "minimum": 1, "maximum": 3600},
        "hardware_digest": {"type": ["string", "null"], "maxLength": 64},
        # How many discoveries the agent has run: a new one is one more health report.
        "discovery": {"type": "integer", "minimum": 0, "maximum": 2 ** 62},
        "drivers": {"type": "array", "items": {"type": "string", "maxLength": 100}},
        "type": {"type": "string"},
        # The internal API version the agent speaks (acceld.internal.versions); none: 1.0.
        "api_version": versions.SCHEMA,
    },
})


def host_is_up(conn: Connection, hostname: str) -> bool:
    """False when the host's agent reported before and is now marked down."""
    return agents_db.is_up(conn, hostname)


def _problem(message: str, status: int) -> falcon.HTTPError:
    return falcon.HTTPError(status, description=message)


class AgentsComponent:
    """The conductor's side of the agents: the hello route and the liveness sweep."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db
        self._secret: bytes | None = None
        self._guard = threading.Lock()
        self.pulls = Pulls(conf)  # one per host, a bounded number at once (its module)
        self._agent_networks = endpoints.networks(conf.conductor.agent_networks)
        self._refused: dict[str, str] = {}  # host -> the endpoint refusal last logged
        self._accepted: dict[str, tuple[str, str]] = {}  # host -> (endpoint, source) checked
        # Unchanged heartbeats are answered from memory and stamped in batches.
        self.liveness = Liveness(db, conf.conductor.heartbeat_flush_interval,
                                 trust_intervals=2 * conf.conductor.agent_down_intervals)
        self.ownership: Ownership = EVERYTHING
        self._behind: str | None = None  # the conductor the sweep waits for, while it does
        self.health_policy = quarantine.HealthPolicy.from_conf(conf)

    # Component protocol

    def use_ownership(self, ownership: Ownership) -> None:
        """Sweep only the hosts the ring gives this conductor; mark this member current in
        the conductors table at each flush."""
        self.ownership = ownership
        self.liveness.member = getattr(ownership, "name", None)

    def routes(self) -> dict[str, dict[str, Any]]:
        return {"/hello": {"POST": self.on_hello}}

    def node_paths(self) -> list[str]:
        """Routes a node's key may call: only its own hello."""
        return ["/hello"]

    def periodic_tasks(self) -> list[PeriodicTask]:
        tasks = [PeriodicTask("agent-liveness", self.conf.conductor.agent_check_interval,
                              self.sweep)]
        if self.liveness.enabled:
            tasks.append(PeriodicTask("heartbeat-flush", self.liveness.flush_interval,
                                      self.liveness.flush))
        return tasks

    def start(self) -> None:
        self._secret = internal_secret(self.conf)

    def stop(self) -> None:
        try:  # the hellos heard since the last flush
            self.liveness.flush()
        except Exception as exc:  # noqa: BLE001 - stopping; the agents hello again
            LOG.warning("Could not record the last heartbeats while stopping: %s", exc)

    # Hello and heartbeat

    def on_hello(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = json_body(req)
        # Every heartbeat is a hello: the compiled check passes a valid one (jsonschema's
        # walk was a fifth of an unchanged heartbeat's CPU); jsonschema words a refusal.
        error = fastcheck.first_error(HELLO_SCHEMA, body)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise falcon.HTTPBadRequest(
                description=f"Invalid hello{f' at {where!r}' if where else ''}: {error.message}")
        try:
            agreed = versions.agree(body)
        except versions.Unsupported as exc:
            raise falcon.HTTPBadRequest(description=str(exc)) from None
        endpoint = body["endpoint"]
        hostname = self._speaker(req, body.get("hostname"))
        # An agent upgraded past fencing gets tokens again now (acceld.conductor.fencing
        # listens).
        versions.heard(hostname, versions.offered(body))
        interval = body.get("heartbeat_interval", self.conf.agent.heartbeat_interval)
        digest = body.get("hardware_digest")
        discovery = body.get("discovery")
        self._check_endpoint(hostname, endpoint, req.remote_addr)
        if (self.liveness.unchanged(hostname, endpoint, interval, digest, discovery)
                or self.liveness.recall(hostname, endpoint, interval, digest, discovery)):
            respond(resp, versions.answer(body, agreed, {
                "status": "OK", "hostname": hostname, "pulled": False,
                "heartbeat_interval": interval}))
            return
        received = time.monotonic()  # a flush revives a host only for a hello after its mark
        try:
            pulled = self._full_hello(hostname, endpoint, interval, digest, discovery)
            respond(resp, versions.answer(body, agreed, {
                "status": "OK", "hostname": hostname, "pulled": pulled,
                "heartbeat_interval": interval}))
        finally:
            self.liveness.learn(hostname, received)

    def _full_hello(self, hostname: str, endpoint: str, interval: int,
                    digest: str | None, discovery: int | None) -> bool:
        """A hello that changes something (or from a host not remembered): recorded in its
        own transaction, hardware pulled when the digest differs; whether it was."""
        beat = self._heartbeat(hostname, endpoint, interval, discovery, digest)
        if beat.new:
            LOG.info("Agent of host %s registered from %s", hostname, endpoint)
        elif beat.previous_state == "down":
            LOG.info("Agent of host %s is back (last contact before this: %s UTC)", hostname,
                     beat.previous_seen)
        pulled = False
        if digest is None or digest != beat.stored_digest:
            pulled = self.pull(hostname, endpoint, counted=beat.new_discovery)
        return pulled

    @staticmethod
    def _speaker(req: falcon.Request, named: str | None) -> str:
        """The host the hello is for: the node whose key signed it, and no other.

        Without this, any node's key could register another host's endpoint and
        draw the conductor's pulls, program and attach calls for it.
        """
        node = caller_node(req)
        if node is None or (named is not None and named != node):
            LOG.warning("Refused a hello for host %s signed with %s from %s", named or "?",
                        f"the key of node {node}" if node else "the cloud's secret",
                        req.remote_addr)
            raise falcon.HTTPUnauthorized(
                title="Unauthorized",
                description="A hello must be signed with the key of the node it names.")
        return node

    @metrics.heartbeat
    def _heartbeat(self, hostname: str, endpoint: str, interval: int,
                   discovery: int | None = None,
                   digest: str | None = None) -> agents_db.Heartbeat:
        """Record the contact; a new discovery of unchanged hardware counts as one more
        health report in the same transaction (under the agent row's lock, which a
        reconcile of the node holds too)."""
        for attempt in (1, 2):
            try:
                with self.db.write() as conn:
                    beat = agents_db.record_heartbeat(conn, hostname, endpoint, interval,
                                                      discovery=discovery)
                    if (not beat.new and beat.new_discovery and digest is not None
                            and digest == beat.stored_digest):
                        quarantine.count_unchanged_report(conn, hostname, self.health_policy)
                    return beat
            except IntegrityError:  # two first hellos of one host raced; the row exists now
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _check_endpoint(self, hostname: str, endpoint: str, source: str) -> None:
        """400, before anything is recorded, for a hello whose endpoint is not where it came
        from (acceld.conductor.fleet.endpoints). Every hello, also one repeating a row recorded
        before the rule: the pair last accepted for the host is remembered, so a heartbeat
        pays one dict lookup."""
        if self._accepted.get(hostname) == (endpoint, source):
            return
        why_not = endpoints.refusal(endpoint, source, self._agent_networks)
        if why_not is not None:
            self._refuse_endpoint(hostname, source, why_not)
        with self._guard:
            self._accepted[hostname] = (endpoint, source)
            self._refused.pop(hostname, None)

    def _refuse_endpoint(self, hostname: str, source: str, why: str) -> None:
        """400 for a hello whose endpoint is not where it came from; logged once per host
        and refusal (the agent repeats it every heartbeat)."""
        with self._guard:
            repeated = self._refused.get(hostname) == why
            self._refused[hostname] = why
        (LOG.debug if repeated else LOG.warning)(
            "Refused the hello of host %s from %s: %s", hostname, source, why)
        raise falcon.HTTPBadRequest(description=f"Invalid hello: {why}.")

    def pull(self, hostname: str, endpoint: str, counted: bool = True) -> bool:
        """GET the node's hardware and reconcile it; HTTP errors for the agent to log.
        False when not pulled now: the host's pull runs in another hello, or every pull
        slot is taken (acceld.conductor.fleet.pulls); its next hello pulls."""
        with self.pulls.turn(hostname) as mine:
            if not mine:
                return False
            try:
                report = self.pulls.read(self._signer(hostname),
                                         internal_url(self.conf, endpoint), hostname)
            except PullFailed as exc:  # the detail is in the log, never in the answer
                raise _problem(f"The agent's hardware could not be read from {endpoint}: "
                               f"{exc.reason}.", 502) from None
            outcome = apply_report(self.db, hostname, report, self.health_policy, counted)
        if outcome.problems:
            raise _problem("Refused hardware record(s), the rest of the report was applied: "
                           + outcome.describe_problems(), 400)
        return True

    def _signer(self, hostname: str) -> Signer:
        """The host's key at its current generation: only that host's agent accepts it."""
        assert self._secret is not None, "component not started"
        try:
            generation = node_keys.generations(
                self.db, self.conf.internal.credential_ttl).signing(hostname)
        except node_keys.KeyRevokedHost as exc:
            raise _problem(str(exc), 401) from None
        return Signer(node_key(self._secret, hostname, generation), hostname, generation)

    # Liveness

    def sweep(self) -> None:
        """Mark down every agent of this conductor's hosts silent for too long.

        Silence is judged only up to the point where every live conductor has written the
        heartbeats it heard (acceld.conductor.fleet.liveness): a conductor whose flushes run late
        would otherwise get its agents marked down for hellos it did answer. That deferral
        is bounded by a dead conductor's bound, and is logged when it starts and ends.
        """
        intervals = self.conf.conductor.agent_down_intervals
        bound = dead_after(self.conf)
        with self.db.read() as conn:  # judged by the database's clock, not this host's
            laggard = conductors_db.furthest_behind(conn, bound)
            behind = min(laggard.written_ago, bound) if laggard else 0.0
            self._note_lag(laggard, behind)
            late = [row for row in agents_db.overdue(conn, intervals, behind=math.ceil(behind))
                    if self.ownership.owns(row.hostname)]
        if late:
            self._mark_down(sorted(late, key=lambda row: row.hostname))  # the flushes' order

    def _mark_down(self, late: list[Any]) -> None:
        for row in self._mark_down_committed(late):  # logged once the marks are kept
            LOG.warning("Agent of host %s is down: last contact %s UTC, %.1f s ago "
                        "(heartbeat every %d s); its devices are not bound until it "
                        "reports again", row.hostname,
                        row.last_seen_at.isoformat(timespec="seconds"),
                        (row.db_now - row.last_seen_at).total_seconds(),
                        row.heartbeat_interval)

    @retry_on_deadlock  # a flush of the same hosts by another conductor
    def _mark_down_committed(self, late: list[Any]) -> list[Any]:
        with self.db.write() as conn:
            return [row for row in late if agents_db.mark_down(conn, row)]

    def _note_lag(self, laggard: conductors_db.Member | None, behind: float) -> None:
        """One WARNING when a conductor falls behind writing its heartbeats, one INFO when
        the conductors are current again (a flush late by a few of its intervals is not)."""
        late_after = max(3 * self.liveness.flush_interval,
                         2 * self.conf.conductor.member_heartbeat_interval)
        late = laggard is not None and laggard.written_ago > late_after
        if late and self._behind is None:
            assert laggard is not None
            self._behind = laggard.name
            LOG.warning("Conductor %s has not written the heartbeats it heard for %.1f s: "
                        "agents' silence is judged %.1f s late until it catches up",
                        laggard.name, laggard.written_ago, behind)
        elif not late and self._behind is not None:
            LOG.info("Conductor %s wrote its heartbeats again: agents' silence is judged "
                     "up to now", self._behind)
            self._behind = None
