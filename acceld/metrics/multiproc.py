"""prometheus-client's multiprocess mode for the API's gunicorn workers.

Each worker counts into its own memory-mapped files in a per-service directory;
whoever serves ``/metrics`` (the gunicorn master) sums them, so counters add up
across workers and survive a worker's restart. The directory is emptied when the
service starts: a counter restarting at zero is what Prometheus' ``rate()``
expects of a restarted process, whereas stale files of an older run would be
added to the new run's totals.
"""

from __future__ import annotations

import os
import shutil

ENV = "PROMETHEUS_MULTIPROC_DIR"


def directory(state_path: str, service: str) -> str:
    """The service's own directory under the state path (one per service and port, so
    two services sharing a state path never sum each other's files)."""
    return os.path.join(os.path.abspath(state_path), "metrics", service)


def enable(path: str) -> None:
    """Empty ``path``, point prometheus-client at it, and make every metric created from
    now on (in this process and in the processes it forks) count into files there."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.environ[ENV] = path
    from prometheus_client import values

    # Read by each metric when it is created; the value class notices a fork (pid change)
    # and opens the worker's own files.
    values.ValueClass = values.MultiProcessValue()


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def worker_exited(pid: int) -> None:
    """Drop a dead worker's live gauges (its counters and histograms stay in the sums)."""
    if enabled():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
