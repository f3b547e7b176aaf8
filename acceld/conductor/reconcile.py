"""Turning one node's hardware report into inventory: check, diff, commit, remember.

A report is the agent's ``GET /hardware`` answer, ``{"hardware": [...], "digest": "..."}``.
Each record is checked against the hardware record schema on its own; a bad
one is logged and refused while the others are applied, and the rows the
refused record's driver already had are kept as they were (nothing of the
node's inventory is lost to a bad record). The node's adds, updates and
removals and the new digest commit in one transaction, under a lock on the
agent's row so that two reports of one node never interleave.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from acceld import quarantine
from acceld.db import agents as agents_db
from acceld.db import inventory, placement_flags
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock
from acceld.metrics import record as metrics
from acceld.drivers.health import Health
from acceld.drivers.record_schema import Problem, check_node

LOG = logging.getLogger(__name__)


@dataclass
class Outcome:
    changes: inventory.Changes
    problems: list[Problem]

    def describe_problems(self) -> str:
        return "; ".join(f"record {p.index}"
                         + (f" (driver {p.driver_name})" if p.driver_name else "")
                         + f" {p.message}" for p in self.problems)


@metrics.reconcile
def apply_report(db: Database, hostname: str, report: Any,
                 policy: quarantine.HealthPolicy | None = None, counted: bool = True) -> Outcome:
    """Check and apply one report of ``hostname``; returns what changed and what was refused.

    Each device's health is applied after the diff, in the same transaction
    (acceld.quarantine); ``counted`` says whether the report is a new discovery of
    the node's agent (one more healthy report for a quarantined device's recovery).
    """
    hardware = report.get("hardware") if isinstance(report, dict) else None
    digest = report.get("digest") if isinstance(report, dict) else None
    checked = check_node(hardware)
    for problem in checked.problems:
        LOG.warning("Refused a hardware record from %s: record %s%s %s", hostname,
                    problem.index, f" (driver {problem.driver_name})" if problem.driver_name
                    else "", problem.message)
    keep_all = any(p.driver_name is None for p in checked.problems)
    keep_drivers = {p.driver_name for p in checked.problems if p.driver_name}
    changes = _commit(db, hostname, checked.records, keep_drivers, keep_all, counted,
                      policy or quarantine.HealthPolicy(), digest)
    if changes.writes:
        LOG.info("Inventory of %s reconciled: %s", hostname, changes)
    return Outcome(changes, checked.problems)


@retry_on_deadlock  # another node's commit (Galera) or a deadlock: the diff is read afresh
def _commit(db: Database, hostname: str, records: list, keep_drivers: set[str],
            keep_all: bool, counted: bool, policy: quarantine.HealthPolicy,
            digest: Any) -> inventory.Changes:
    """The report's one transaction: diff, health, Placement flags, digest."""
    with db.write() as conn:
        agent = agents_db.lock_agent(conn, hostname)
        changes = inventory.reconcile_node(conn, hostname, records,
                                           keep_drivers=keep_drivers, keep_all=keep_all)
        dirty = quarantine.apply_reported(
            conn, hostname, [(row, device_id, Health.from_dict(record.health))
                             for row, device_id, record in changes.reported],
            counted, policy, inserted=changes.inserted)
        if dirty:
            placement_flags.flag_providers(conn, hostname, dirty)
        # Held devices wait for a release that no hardware change announces: forget the
        # digest so the next heartbeat pulls again (a diff that writes nothing until then).
        stored = digest if isinstance(digest, str) and not changes.held else None
        if agent is not None and agent.hardware_digest != stored:
            agents_db.set_digest(conn, hostname, stored)
    return changes
