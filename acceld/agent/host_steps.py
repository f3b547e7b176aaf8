"""The host steps acceld made on this node: recorded, listed, and reported to the conductor.

A prepared attach handle (an mdev, a vGPU type written to a VF) must be undone when no
ARQ uses it any more; the bind and release paths do that (docs/arqs.md, "No leaked host
step"), and this module is the backstop for what they cannot see. Two sources say which
host resources are acceld's own, so that nothing another tool made is ever touched:

- the driver (:meth:`acceld.drivers.base.Driver.prepared_attach_handles`): e.g. the NVIDIA
  driver's mdevs, whose uuid only acceld derives;
- the agent's journal (:class:`HostStepJournal`): one file per handle, written before a
  prepare reaches the driver and removed after its release succeeded, so that a step the
  driver cannot mark (a VF's vGPU type) is still known to be acceld's.

:class:`HostStepAudit` reports both, at start and every ``[agent] discovery_interval``,
to the conductor (``POST /attach-handles/host-steps``), which decides against the database
which are orphans and queues their release.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Any, Callable

import orjson
import requests
from oslo_config import cfg

from acceld.clients.conductor import failover_client
from acceld.clients.internal import InternalError
from acceld.drivers.base import AttachHandle, Driver

LOG = logging.getLogger(__name__)


def step_key(driver_name: str, handle: AttachHandle) -> str:
    """One handle's identity: driver, attach type and its info (keys sorted)."""
    return orjson.dumps([driver_name, handle.attach_type, handle.attach_info],
                        option=orjson.OPT_SORT_KEYS).decode()


class HostStepJournal:
    """Files under ``directory``, one per handle whose host step may exist."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @classmethod
    def for_agent(cls, conf: cfg.ConfigOpts, hostname: str) -> "HostStepJournal":
        return cls(os.path.join(conf.state_path, "agent", hostname, "host-steps"))

    def _path(self, driver_name: str, handle: AttachHandle) -> str:
        digest = hashlib.sha256(step_key(driver_name, handle).encode()).hexdigest()
        return os.path.join(self.directory, f"{digest}.json")

    def record(self, driver_name: str, handle: AttachHandle) -> bool:
        """Before a prepare: written and flushed to disk. True when it was not recorded yet
        (no earlier prepare of this handle can have left anything). Raises OSError."""
        path = self._path(driver_name, handle)
        if os.path.exists(path):
            return False
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        body = orjson.dumps({"driver_name": driver_name, "attach_type": handle.attach_type,
                             "attach_info": handle.attach_info})
        tmp = f"{path}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        return True

    def forget(self, driver_name: str, handle: AttachHandle) -> None:
        """After a release succeeded (or a first prepare the driver refused)."""
        try:
            os.unlink(self._path(driver_name, handle))
        except FileNotFoundError:
            pass

    def entries(self) -> list[tuple[str, AttachHandle]]:
        """Every recorded (driver name, handle); unreadable files are logged and skipped."""
        found: list[tuple[str, AttachHandle]] = []
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        for name in names:
            try:
                with open(os.path.join(self.directory, name), "rb") as source:
                    data = orjson.loads(source.read())
                found.append((str(data["driver_name"]), AttachHandle(
                    attach_type=str(data["attach_type"]),
                    attach_info={str(k): str(v) for k, v in data["attach_info"].items()})))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                LOG.warning("Host-step journal entry %s is unreadable (skipped): %s",
                            name, exc)
        return found


def host_steps(drivers: list[Driver], journal: HostStepJournal | None = None
               ) -> list[dict[str, Any]]:
    """Every host-step resource of the loaded drivers that is acceld's: what each driver
    recognises as its own plus what the journal recorded, once each, in the report's shape."""
    found: dict[str, dict[str, Any]] = {}

    def add(driver_name: str, handle: AttachHandle) -> None:
        found.setdefault(step_key(driver_name, handle), {
            "driver_name": driver_name, "attach_type": handle.attach_type,
            "attach_info": dict(handle.attach_info)})

    for driver in drivers:
        try:
            handles = driver.prepared_attach_handles()
        except Exception as exc:  # noqa: BLE001 - one driver must not stop the others
            LOG.warning("Driver %s could not list the attach handles it prepared: %s",
                        driver.name, exc)
            continue
        for handle in handles:
            add(driver.name, handle)
    loaded = {d.name for d in drivers}
    for driver_name, handle in (journal.entries() if journal else []):
        if driver_name in loaded:  # another driver's cannot be released here anyway
            add(driver_name, handle)
    return [found[k] for k in sorted(found)]


class HostStepAudit:
    """At start and every ``[agent] discovery_interval``: report the host-step resources
    acceld made on this node to the conductor (``POST /attach-handles/host-steps``).

    The agent does not decide what is an orphan: only the database knows which handles
    are in use. The conductor queues a release for each reported resource whose handle is
    free, and its release worker calls this agent's ``/attach-handles/release`` for it.
    """

    def __init__(self, agent: Any, client: Any, journal: HostStepJournal | None = None
                 ) -> None:
        self.agent = agent
        self.client = client
        self.journal = journal

    def once(self) -> dict[str, Any] | None:
        """One report; the conductor's answer, or None when it could not be sent."""
        steps = host_steps(self.agent.drivers, self.journal)
        if not steps:
            return {"queued": [], "in_use": 0, "unknown": 0}  # nothing to ask about
        try:
            answer = self.client.call("POST", "/attach-handles/host-steps",
                                      {"host_steps": steps}, timeout=60)
        except (InternalError, requests.RequestException) as exc:
            LOG.warning("Could not report this node's %d prepared attach handle(s) to the "
                        "conductor (retried in %s s): %s", len(steps),
                        self.agent.conf.agent.discovery_interval, exc)
            return None
        if isinstance(answer, dict) and answer.get("queued"):
            LOG.warning("The conductor queued the release of %d orphaned attach handle(s) "
                        "of this node (prepared here, used by no ARQ): %s",
                        len(answer["queued"]), ", ".join(answer["queued"]))
        return answer

    def start(self, stop: threading.Event, interval: Callable[[], float]) -> threading.Thread:
        def loop() -> None:
            while True:
                try:
                    self.once()
                except Exception:  # noqa: BLE001 - keep the loop alive
                    LOG.exception("Host-step audit failed; retried at the next interval")
                if stop.wait(interval()):
                    return

        thread = threading.Thread(target=loop, name="host-step-audit", daemon=True)
        thread.start()
        return thread


def start_host_step_audit(agent: Any) -> threading.Thread:
    """The agent's audit loop (called from :meth:`acceld.agent.service.Agent.start`)."""
    client = failover_client(agent.conf, agent.signer, prefer=agent.hostname, timeout=60)
    audit = HostStepAudit(agent, client, HostStepJournal.for_agent(agent.conf, agent.hostname))
    agent.host_step_audit = audit
    return audit.start(agent._stop, lambda: agent.conf.agent.discovery_interval)
