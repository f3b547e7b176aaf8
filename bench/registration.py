"""Conductor CPU per node registration, in process: the first hello's heartbeat and the
reconcile of the node's first report (``acceld simulate``'s records, 8 devices each).

No HTTP and no pull: what is left is the conductor's own work per new node on the given
database (SQLite runs in this process, so its CPU is counted; a server database's is not).

    .venv/bin/python -m bench.registration sqlite 305
    .venv/bin/python -m bench.registration postgresql+psycopg://postgres@127.0.0.1:5432/<db> 305
    .venv/bin/python -m bench.registration sqlite 105 prof      # cProfile, top functions

To compare with an older commit: ``git worktree add /tmp/old <commit>`` and run this file
with ``TREE=/tmp/old`` (its modules are imported from that tree). The server database
must be empty and is left filled.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.environ.get("TREE", os.getcwd()))

import orjson  # noqa: E402

from acceld.cmd.simulator import build_agents  # noqa: E402
from acceld.conductor.reconcile import apply_report  # noqa: E402
from acceld.db import agents as agents_db  # noqa: E402
from acceld.db import migrate  # noqa: E402
from acceld.db.engine import Database  # noqa: E402
from tests.conftest import make_conf  # noqa: E402

WARM_UP = 5


def main(argv: list[str]) -> None:
    url, nodes = argv[0], int(argv[1])
    profile = len(argv) > 2 and argv[2] == "prof"
    tmp = tempfile.mkdtemp()
    db = Database(f"sqlite:///{tmp}/bench.sqlite" if url == "sqlite" else url)
    migrate.upgrade(db)
    agents = build_agents(make_conf(tmp), nodes, 8, "sim")
    reports = [orjson.loads(a.body) for a in agents]

    def register(index: int) -> None:
        with db.write() as conn:
            agents_db.record_heartbeat(conn, agents[index].hostname, "127.0.0.1:1", 10,
                                       discovery=1)
        apply_report(db, agents[index].hostname, reports[index])

    for index in range(WARM_UP):
        register(index)
    profiler = cProfile.Profile() if profile else None
    cpu, wall = time.process_time(), time.perf_counter()
    if profiler:
        profiler.enable()
    for index in range(WARM_UP, nodes):
        register(index)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    measured = nodes - WARM_UP
    print(f"{db.backend}: {measured} nodes x 8 devices, conductor CPU per node "
          f"{cpu / measured * 1000:.2f} ms, wall {wall / measured * 1000:.2f} ms")
    db.dispose()


if __name__ == "__main__":
    main(sys.argv[1:])
