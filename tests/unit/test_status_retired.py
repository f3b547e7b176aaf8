"""`acceld status` once the only host was retired (acceld host delete): it must not claim
that no agent has reported yet, since one did; it says none is registered, and why."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

from sqlalchemy import insert

from acceld.db import migrate
from acceld.db.engine import Database
from acceld.db.models import agents, utcnow

NONE_REGISTERED = ("(no agent registered: none has reported yet, or every host that "
                   "reported was retired with `acceld host delete`)")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "acceld.cmd.main", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ))


def test_status_after_the_last_host_is_retired(tmp_path):
    state = str(tmp_path)
    db = Database(f"sqlite:///{tmp_path / 'acceld.sqlite'}")
    migrate.upgrade(db)
    with db.write() as conn:
        conn.execute(insert(agents).values(hostname="cn-9", endpoint="cn-9:6668", state="down",
                                           heartbeat_interval=10,
                                           last_seen_at=utcnow() - dt.timedelta(minutes=5)))
    db.dispose()
    before = run_cli("status", "--state-path", state)
    assert before.returncode == 1 and "cn-9" in before.stdout  # down: exit 1
    retired = run_cli("host", "delete", "cn-9", "--state-path", state)
    assert retired.returncode == 0, retired.stderr
    after = run_cli("status", "--state-path", state)
    assert after.returncode == 0, after.stderr
    assert after.stdout.splitlines()[1] == NONE_REGISTERED
    assert "has reported yet)" not in after.stdout.replace(NONE_REGISTERED, "")
