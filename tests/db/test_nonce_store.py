"""The conductors' shared nonce table (acceld.db.nonces): a nonce is refused once any
conductor on the database took it, rows are pruned once no conductor can accept their
credential (by the database's clock), and an unreachable database is a 503, never a
credential called forged nor a 500. Every backend."""

from __future__ import annotations

import datetime as dt
import time

import requests
from sqlalchemy import insert, select

from acceld.db import nonces
from acceld.db.clock import db_now
from acceld.db.engine import Database
from acceld.db.models import internal_nonces
from acceld.internal import auth
from acceld.internal.server import InternalServer, build_app, respond

SECRET = b"nonce-store-test-secret-0123456789abcdef"


def test_two_guards_on_one_database_accept_a_nonce_once(db):
    one, other = nonces.DatabaseReplay(db, 60), nonces.DatabaseReplay(db, 60)
    now = time.time()
    assert one.first_use("a" * 24, int(now), now)
    assert not other.first_use("a" * 24, int(now), now)
    assert not one.first_use("a" * 24, int(now), now)
    assert other.first_use("b" * 24, int(now), now)


def test_used_nonces_are_pruned_once_no_conductor_accepts_them(db):
    with db.write() as conn:
        now = db_now(conn)
        conn.execute(insert(internal_nonces), [
            {"nonce": "old", "expires_at": now - dt.timedelta(seconds=61)},  # past ttl + ttl
            {"nonce": "recent", "expires_at": now - dt.timedelta(seconds=30)},  # within skew
            {"nonce": "live", "expires_at": now + dt.timedelta(seconds=30)},
        ])
    guard = nonces.DatabaseReplay(db, 60)
    assert guard.first_use("c" * 24, int(time.time()), time.time())
    with db.read() as conn:
        left = set(conn.execute(select(internal_nonces.c.nonce)).scalars())
    assert left == {"recent", "live", "c" * 24}


def test_an_unreachable_database_is_503_with_retry_after(tmp_path):
    gone = Database(f"sqlite:///{tmp_path}/missing/dir/acceld.sqlite")  # no such table
    app = build_app(SECRET, 60, {"/x": {"POST": lambda req, resp: respond(resp, {})}},
                    destination=auth.CONDUCTOR, replay=nonces.DatabaseReplay(gone, 60))
    server = InternalServer(app, "127.0.0.1", 0).start()
    try:
        headers = auth.headers(SECRET, "POST", "/x", b"{}", destination=auth.CONDUCTOR)
        answer = requests.post(f"{server.url}/x", data=b"{}", headers=headers, timeout=10)
        assert answer.status_code == 503, answer.text
        assert answer.headers["Retry-After"] == "5"
    finally:
        server.stop()
        gone.dispose()
