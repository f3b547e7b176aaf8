"""Explain on a large fleet (issue 30: "within 100 ms on 1,000 hosts"): the public API's
``GET /v2/device_profiles/{name}/explain`` called in process (the WSGI app, no HTTP
server), on a database holding HOSTS hosts, each with one FPGA of 4 handles (one in use by
a Bound ARQ on every tenth host, every seventh host's agent down, every thirteenth
device disabled), so every reason has rows to read. Placement is not configured: what is
timed is acceld's own answer (Placement's candidates add one query per group to
Placement, which is Placement's time).

    .venv/bin/python -m bench.explain_scale [--hosts 1000] [--calls 20] [--url URL]

``--url``: a database to fill (PostgreSQL, MariaDB; it must be empty and is left filled);
default a fresh SQLite file. Prints the median and the worst of the calls and the
queries one call made.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

from falcon import testing
from sqlalchemy import event, insert, select, update

from acceld import config
from acceld.api.app import build_app
from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import (accelerator_requests, agents, attach_handles, device_profiles,
                               devices, utcnow)
from tests.support import inventory

TARGET_MS = 100.0
ADMIN = {"X-User-Id": "bench", "X-Project-Id": "bench", "X-Roles": "admin,member,reader",
         "OpenStack-API-Version": "accelerator 2.7"}


def fill(db: Database, hosts: int, profile_id: int) -> None:
    """The fleet; the Bound ARQs are of profile ``profile_id``."""
    with db.write() as conn:
        for n in range(hosts):
            host = f"bench-{n:05d}"
            status = "disabled" if n % 13 == 0 else "enabled"
            dev = inventory.add_device(conn, hostname=host, status=status)
            dep = inventory.add_deployable(conn, dev["id"], name=f"{host}_fpga",
                                           num_accelerators=4,
                                           attrs={"rc": "FPGA", "trait0": "CUSTOM_BENCH"})
            handles = inventory.add_attach_handles(conn, dep["id"], 4)
            conn.execute(insert(agents).values(
                hostname=host, endpoint=f"127.0.0.{n % 250 + 1}:6668",
                state="down" if n % 7 == 0 else "up", last_seen_at=utcnow()))
            if n % 10 == 0:
                conn.execute(update(attach_handles).where(
                    attach_handles.c.id == handles[0]["id"]).values(in_use=True))
                conn.execute(insert(accelerator_requests).values(
                    uuid=str(uuid.uuid4()), state="Bound", device_profile_id=profile_id,
                    device_profile_group_id=0, project_id="bench", hostname=host,
                    instance_uuid=str(uuid.uuid4()), attach_handle_id=handles[0]["id"],
                    created_at=utcnow()))
        conn.execute(update(devices).where(devices.c.status == "disabled").values(
            status_reason="bench: disabled"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--url", help="an empty database to fill (default: SQLite)")
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="acceld-explain-bench-")
    url = args.url or f"sqlite:///{state}/acceld.sqlite"
    conf = config.load([], config_files=[])
    conf.set_override("state_path", state)
    conf.set_override("connection", url, group="database")
    db = Database(url)
    migrate.upgrade(db)
    client = testing.TestClient(build_app(conf, db))
    made = client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[{
        "name": "bench", "groups": [{"resources:FPGA": "1", "trait:CUSTOM_BENCH": "required"}]}])
    assert made.status_code == 201, made.text
    with db.read() as conn:
        profile_id = conn.execute(select(device_profiles.c.id)).scalar_one()
    started = time.perf_counter()
    fill(db, args.hosts, profile_id)
    print(f"filled {args.hosts} hosts in {time.perf_counter() - started:.1f} s ({url})")
    queries: list[str] = []
    event.listen(db.engine, "before_cursor_execute",
                 lambda *a, **k: queries.append(a[2]))
    times = []
    for i in range(args.calls + 2):  # two warm-up calls (statement caches)
        queries.clear()
        t0 = time.perf_counter()
        answer = client.simulate_get("/accelerator/v2/device_profiles/bench/explain",
                                     headers=ADMIN)
        elapsed = (time.perf_counter() - t0) * 1000
        assert answer.status_code == 200, answer.text
        if i >= 2:
            times.append(elapsed)
    median = statistics.median(times)
    print(f"explain on {args.hosts} hosts: median {median:.1f} ms, worst {max(times):.1f} ms "
          f"over {args.calls} calls, {len(queries)} queries per call; "
          f"target <= {TARGET_MS:g} ms: {'met' if median <= TARGET_MS else 'NOT met'}")
    print(f"verdict: {answer.json['verdict'][:160]}")
    db.dispose()


if __name__ == "__main__":
    main()
