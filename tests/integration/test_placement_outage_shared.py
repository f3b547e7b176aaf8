"""One Placement outage, one WARNING each way per conductor (issue 11 item 4).

Binding and the inventory sync both call Placement; an outage that both meet used to
be logged twice each way ("Placement is unavailable" from binding, "Placement sync
paused" from the sync, then one "... again" line from each). They now share the
process's outage log (acceld.outages.process_log): whichever notices first logs the
start, whichever sees Placement back first logs the end. A real Placement, stopped by
PID and started again on the same port.
"""

from __future__ import annotations

import logging

import pytest

from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.placement.sync import PlacementSync
from tests.integration.test_placement_audit import conf_for, host, own_placement  # noqa: F401
from tests.integration.test_placement_sync import allocate
from tests.support import inventory
from tests.support.binds import RecordingNotifier, arq_state, make_jobs_due, request_binds

pytestmark = pytest.mark.integration


def _starts(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.INFO
            and r.getMessage().startswith("Placement") and "still" not in r.getMessage()
            and ("unavailable" in r.getMessage() or "paused" in r.getMessage())]


def _ends(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.INFO
            and r.getMessage().startswith("Placement") and "again" in r.getMessage()]


@pytest.mark.parametrize("back_first", ["sync", "binding"])
def test_outage_met_by_binding_and_sync_is_logged_once_each_way(own_placement, tmp_path,
                                                                 sqlite_db, host, caplog,
                                                                 back_first):
    db = sqlite_db
    conf = conf_for(tmp_path, own_placement)
    conf.set_override("timeout", 2, group="placement")
    own_placement.create_compute_node(host)
    fpga = inventory.add_fpga(db, hostname=host, handles=1)
    rp = fpga["deployable"]["rp_uuid"]
    sync = PlacementSync(conf, db)
    sync.sync_once()
    notifier = RecordingNotifier()
    worker = BindWorker(conf, db, notifier=notifier)
    [(instance, [arq])] = request_binds(conf, db, [(host, rp)])
    allocate(own_placement, instance, {rp: {"FPGA": 1}})

    caplog.set_level(logging.DEBUG, logger="acceld")
    own_placement.stop()
    worker.run_once()  # binding meets the outage first
    sync._next_full = 0.0
    assert sync.run() is None  # then the sync
    sync._backoff.next_at = 0  # its backoff delay has passed
    assert sync.run() is None
    assert arq_state(db, arq)[0] == "BindStarted"
    own_placement.start()
    sync._backoff.next_at = 0
    make_jobs_due(db)
    if back_first == "sync":
        assert sync.run() is not None
        worker.run_once()
    else:
        worker.run_once()
        assert sync.run() is not None
    worker.run_once()
    assert arq_state(db, arq) == ("Bound", None)
    assert [(s.arq_uuid, s.status) for s in notifier.sent] == [(arq, "completed")]
    assert len(_starts(caplog.records)) == 1, _starts(caplog.records)
    assert len(_ends(caplog.records)) == 1, _ends(caplog.records)
    assert [r for r in caplog.records if r.exc_info] == []
