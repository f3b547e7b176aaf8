"""The periodic purge of old device events ([conductor] device_event_retention).

One conductor at a time runs it (an exclusive task): a DELETE by the ``created_at`` index,
judged by the database's clock, in batches so that a long backlog (a first run after the
retention was lowered) never holds one huge transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from oslo_config import cfg

from acceld.conductor.service import PeriodicTask
from acceld.db import device_events
from acceld.db.engine import Database

LOG = logging.getLogger(__name__)
BATCH = 5000


class DeviceEventPurge:
    """Conductor component: no routes, one exclusive periodic task."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db

    def routes(self) -> dict[str, dict[str, Any]]:
        return {}

    def periodic_tasks(self) -> list[PeriodicTask]:
        return [PeriodicTask("device-event-purge",
                             self.conf.conductor.device_event_purge_interval, self.purge,
                             exclusive=True)]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def purge(self) -> int:
        """Delete the events older than the retention, a batch per transaction; how many."""
        removed = 0
        while True:
            with self.db.write() as conn:
                count = device_events.purge(conn, self.conf.conductor.device_event_retention,
                                            BATCH)
            removed += count
            if count < BATCH:
                break
        if removed:
            LOG.info("Purged %d device event(s) older than %d s", removed,
                     self.conf.conductor.device_event_retention)
        return removed
