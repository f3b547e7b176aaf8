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


def test_calls_arriving_during_a_commit_share_the_next_one_and_keep_the_guarantee(db):
    """Group commit: while one transaction writes a nonce, the calls that arrive queue and
    go in one transaction together; none is answered before its nonce is committed; a
    nonce another conductor took is still refused in a batch."""
    import threading

    guard, other = nonces.DatabaseReplay(db, 60), nonces.DatabaseReplay(db, 60)
    now = time.time()
    assert other.first_use("f" * 24, int(now), now)  # taken by another conductor
    inside, release = threading.Event(), threading.Event()
    real_commit = guard._commit

    def held_commit(batch):  # type: ignore[no-untyped-def]
        if not inside.is_set():
            inside.set()
            assert release.wait(10)
        real_commit(batch)

    guard._commit = held_commit  # type: ignore[method-assign]
    results: dict[str, bool] = {}

    def call(nonce: str) -> None:
        results[nonce] = guard.first_use(nonce, int(now), now)

    first = threading.Thread(target=call, args=("1" * 24,))
    first.start()
    assert inside.wait(10)
    queued = [threading.Thread(target=call, args=(n * 24,)) for n in "2345f"]
    for thread in queued:
        thread.start()
    deadline = time.monotonic() + 10
    while len(guard._batch) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(guard._batch) == 5 and results == {}  # all wait for the commit in flight
    release.set()
    for thread in [first, *queued]:
        thread.join(10)
    assert results == {"1" * 24: True, "2" * 24: True, "3" * 24: True, "4" * 24: True,
                       "5" * 24: True, "f" * 24: False}
    # One statement for the first, one for the five: the nonce taken elsewhere is skipped
    # by it and refused, the others accepted.
    assert guard.transactions == 2
    with db.read() as conn:
        stored = set(conn.execute(select(internal_nonces.c.nonce)).scalars())
    assert {n * 24 for n in "12345f"} <= stored
    assert not other.first_use("3" * 24, int(now), now)  # committed for every conductor


def test_a_batch_without_conflicts_is_one_transaction(db):
    import threading

    guard = nonces.DatabaseReplay(db, 60)
    now = time.time()
    inside, release = threading.Event(), threading.Event()
    real_commit = guard._commit

    def held_commit(batch):  # type: ignore[no-untyped-def]
        if not inside.is_set():
            inside.set()
            assert release.wait(10)
        real_commit(batch)

    guard._commit = held_commit  # type: ignore[method-assign]
    threads = [threading.Thread(target=guard.first_use, args=(n * 24, int(now), now))
               for n in "6789a"]
    threads[0].start()
    assert inside.wait(10)
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 10
    while len(guard._batch) < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    release.set()
    for thread in threads:
        thread.join(10)
    assert guard.transactions == 2
    assert not guard.first_use("8" * 24, int(now), now)
