"""A project's ARQ count is limited ([quota] arqs_per_project): 403 naming the limit, all or
nothing, and two racing creates cannot both pass on one count. On every backend.

Keystone's unified limits (oslo.limit) are tested against the real Keystone in
tests/integration/test_unified_limits.py.
"""

from __future__ import annotations

import threading

from falcon import testing
from sqlalchemy import func, select

from acceld.api import arq_limits
from acceld.api.app import build_app
from acceld.db.models import accelerator_requests
from tests.conftest import make_conf
from tests.helpers import ADMIN, fault, member

URL = "/accelerator/v2/accelerator_requests"
DP_URL = "/accelerator/v2/device_profiles"
A = member("project-a")


def _client(tmp_path, db, cap: int) -> testing.TestClient:
    client = testing.TestClient(build_app(make_conf(str(tmp_path), quota__arqs_per_project=cap),
                                          db))
    for profile in ({"name": "one", "groups": [{"resources:FPGA": "1"}]},
                    {"name": "two", "groups": [{"resources:FPGA": "2"}]},
                    # Several groups: one create makes 1 + 2 ARQs.
                    {"name": "mixed", "groups": [{"resources:FPGA": "1"},
                                                 {"resources:PGPU": "2"}]},
                    {"name": "none", "groups": [{"trait:CUSTOM_X": "required"}]}):
        made = client.simulate_post(DP_URL, headers=ADMIN, json=[profile])
        assert made.status_code in (201, 409), made.text  # 409: made by an earlier client
    return client


def _create(client, name: str, headers=A):  # type: ignore[no-untyped-def]
    return client.simulate_post(URL, json={"device_profile_name": name}, headers=headers)


def _count(db, project: str = "project-a") -> int:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(accelerator_requests).where(
            accelerator_requests.c.project_id == project)).scalar_one()


def test_default_limit_is_generous_and_finite(conf):
    assert conf.quota.driver == "local"
    assert conf.quota.arqs_per_project == 10000


def test_over_the_limit_is_403_naming_it_and_creates_nothing(tmp_path, db):
    client = _client(tmp_path, db, cap=4)
    assert _create(client, "two").status_code == 201
    assert _create(client, "one").status_code == 201
    resp = _create(client, "two")
    assert resp.status_code == 403
    assert fault(resp) == ("Quota exceeded for accelerator_requests: project project-a may hold "
                           "4 ([quota] arqs_per_project), holds 3 and asked for 2 more.")
    assert _count(db) == 3
    # Up to the limit exactly is allowed; one more is not.
    assert _create(client, "one").status_code == 201
    assert _create(client, "one").status_code == 403
    assert _count(db) == 4
    # Other projects have their own count.
    assert _create(client, "two", member("project-b")).status_code == 201


def test_a_profile_of_several_groups_is_refused_whole(tmp_path, db):
    client = _client(tmp_path, db, cap=4)
    assert _create(client, "two").status_code == 201
    resp = _create(client, "mixed")  # 3 ARQs in two groups: 2 + 3 > 4
    assert resp.status_code == 403
    assert "holds 2 and asked for 3 more" in fault(resp)
    assert _count(db) == 2


def test_deleting_gives_the_room_back(tmp_path, db):
    client = _client(tmp_path, db, cap=2)
    made = _create(client, "two").json["arqs"]
    assert _create(client, "one").status_code == 403
    gone = client.simulate_delete(f"{URL}/{made[0]['uuid']}", headers=A)
    assert gone.status_code == 204
    assert _create(client, "one").status_code == 201


def test_zero_and_unlimited(tmp_path, db):
    frozen = _client(tmp_path / "zero", db, cap=0)
    assert _create(frozen, "one").status_code == 403
    assert _create(frozen, "none").status_code == 201  # no accelerator, no ARQ
    unlimited = testing.TestClient(build_app(make_conf(str(tmp_path),
                                                       quota__arqs_per_project=-1), db))
    for _ in range(3):
        assert _create(unlimited, "two").status_code == 201
    assert _count(db) == 6


def test_racing_creates_cannot_both_pass_on_one_count(tmp_path, db, monkeypatch):
    """The first create counts and then waits; the second must not count before the first
    commits (the project's lock), so it sees 2 ARQs and is refused."""
    client = _client(tmp_path, db, cap=3)
    real_count = arq_limits.db.count_for_project
    first_counted, second_counted = threading.Event(), threading.Event()
    calls: list[int] = []

    def count(conn, project_id):  # type: ignore[no-untyped-def]
        usage = real_count(conn, project_id)
        calls.append(usage)
        if len(calls) == 1:
            first_counted.set()
            # Without the lock the second create counts now (0), long before this ends;
            # with it, it cannot count until this transaction has committed.
            second_counted.wait(timeout=1.5)
        else:
            second_counted.set()
        return usage

    monkeypatch.setattr(arq_limits.db, "count_for_project", count)
    results: dict[str, int] = {}

    def first() -> None:
        results["first"] = _create(client, "two").status_code

    runner = threading.Thread(target=first)
    runner.start()
    assert first_counted.wait(timeout=30)
    results["second"] = _create(client, "two").status_code
    runner.join(timeout=60)
    assert calls == [0, 2]
    assert results == {"first": 201, "second": 403}
    assert _count(db) == 2


def test_unreadable_keystone_limits_are_503_and_create_nothing(tmp_path, db):
    """unified_limits without a usable [oslo_limit] (here: no credentials at all): the
    limit is unknown, so nothing is created, and the answer is a clean 503, not a 500."""
    client = testing.TestClient(build_app(make_conf(str(tmp_path),
                                                    quota__driver="unified_limits"), db))
    _client(tmp_path, db, cap=-1)  # the profiles
    resp = _create(client, "one")
    assert resp.status_code == 503
    assert fault(resp) == ("The accelerator_requests limit of project project-a could not be "
                           "read from Keystone; retry later.")
    assert _count(db) == 0
