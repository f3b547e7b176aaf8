"""With ``[quota] driver = unified_limits`` a create reads the project's limit from Keystone
(oslo.limit) before its write transaction: while Keystone does not answer, no transaction
of the create is open, so other writers go on (on SQLite the create held the database's
one write lock through the call before, and every other writer got ``database is
locked``). On every backend.

Keystone here is a peer that accepts and never answers (tests.support.stalling): the
create's call to it blocks, and the test acts while it does (the peer's ``requested``
event, not a sleep). The peer then closes: the create ends 503, having created nothing.
"""

from __future__ import annotations

import sqlite3
import threading

import keystoneauth1.session
from keystoneauth1 import loading as ks_loading
import pytest
from falcon import testing
from oslo_config import cfg
from oslo_limit import limit as oslo_limit
from oslo_limit import opts as limit_opts
from sqlalchemy import event, func, select, text

from acceld.api import arq_limits
from acceld.api.app import build_app
from acceld.db.models import accelerator_requests
from tests.conftest import make_conf
from tests.helpers import ADMIN, fault, member
from tests.support.stalling import StallingPeer

URL = "/accelerator/v2/accelerator_requests"


@pytest.fixture
def keystone_hung(monkeypatch):
    """oslo.limit pointed at a Keystone that accepts and never answers (its options live
    on oslo.config's global CONF, where oslo.limit reads them)."""
    peer = StallingPeer("silent").start()
    limit_opts.register_opts(cfg.CONF)
    plugin_opts = ks_loading.get_auth_plugin_conf_options("password")
    cfg.CONF.register_opts(plugin_opts, group="oslo_limit")  # oslo.limit registers them
    # as it loads
    settings = {"auth_url": f"{peer.url}/v3", "auth_type": "password", "username": "cyborg",
                "password": "secret", "user_domain_id": "default", "system_scope": "all",
                "endpoint_service_type": "accelerator", "endpoint_region_name": "RegionOne",
                "timeout": 60}
    for name, value in settings.items():
        cfg.CONF.set_override(name, value, group="oslo_limit")
    monkeypatch.setattr(oslo_limit, "_SDK_CONNECTION", None)
    monkeypatch.setattr(arq_limits, "_enforcer", None)
    try:
        yield peer
    finally:
        peer.stop()
        for name in settings:
            cfg.CONF.clear_override(name, group="oslo_limit")
        # The password plugin's options include a required auth_url: left registered on
        # the global CONF, every later in-process load of it (the CLI's tests) would fail.
        cfg.CONF.clear()
        cfg.CONF.unregister_opts(plugin_opts, group="oslo_limit")


@pytest.fixture
def open_transactions(db):
    """How many transactions on ``db``'s engine are open now."""
    count = [0]

    def begin(_conn) -> None:  # type: ignore[no-untyped-def]
        count[0] += 1

    def end(_conn) -> None:  # type: ignore[no-untyped-def]
        count[0] -= 1

    listeners = (("begin", begin), ("commit", end), ("rollback", end))
    for name, fn in listeners:
        event.listen(db.engine, name, fn)
    yield count
    for name, fn in listeners:
        event.remove(db.engine, name, fn)


def _count(db) -> int:  # type: ignore[no-untyped-def]
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(accelerator_requests)).scalar_one()


def test_no_transaction_is_open_while_keystone_is_asked_for_the_limit(
        tmp_path, db, keystone_hung, open_transactions, monkeypatch):
    client = testing.TestClient(build_app(
        make_conf(str(tmp_path), quota__driver="unified_limits"), db))
    made = client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN,
                                json=[{"name": "one", "groups": [{"resources:FPGA": "1"}]}])
    assert made.status_code == 201, made.text

    open_at_call: list[int] = []
    send = keystoneauth1.session.Session.request

    def request(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        open_at_call.append(open_transactions[0])  # at every call to Keystone
        return send(self, *args, **kwargs)

    monkeypatch.setattr(keystoneauth1.session.Session, "request", request)
    answers = []
    creating = threading.Thread(target=lambda: answers.append(client.simulate_post(
        URL, json={"device_profile_name": "one"}, headers=member())))
    creating.start()
    try:
        assert keystone_hung.requested.wait(10), "the create never called Keystone"

        # Another writer, while the create waits on Keystone: never refused.
        if db.backend == "sqlite":
            other = sqlite3.connect(db.url.database, isolation_level=None)
            other.execute("PRAGMA busy_timeout=0")  # refused at once if the lock is held
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE device_profiles SET description = 'changed'")
            other.execute("COMMIT")
            other.close()
        else:
            with db.write() as conn:
                conn.execute(text("UPDATE device_profiles SET description = 'changed'"))
        assert open_at_call and set(open_at_call) == {0}, open_at_call
    finally:
        keystone_hung.stop()  # Keystone goes away: the create ends
        creating.join(30)
    assert not creating.is_alive()
    assert answers[0].status_code == 503, answers[0].text
    assert "could not be read from Keystone" in fault(answers[0])
    assert _count(db) == 0
    assert set(open_at_call) == {0}, open_at_call
