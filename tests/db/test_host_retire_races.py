"""Retiring a host while a bind runs there or its agent says hello, each interleaving forced
at the exact point, on SQLite, PostgreSQL and MariaDB (issue 11 item 8).

Guarantees under test (acceld.db.host_retire):

* no ARQ is left ``Bound`` without its handle: a bind that committed before the retire saw
  its handle is refused (409) or, forced, ends ``BindFailed`` with the retire's reason,
  even when its ARQ was not yet bound when the retire read the host's ARQs;
* a bind that reaches the device after the retire locked it finds the device gone and
  ends ``BindFailed``; Nova hears ``failed``;
* an agent's hello that committed first makes an unforced retire a 409 (the agent is up);
  a hello that waited for the retire registers the agent anew, so its hardware is pulled.

On SQLite every write transaction holds the database's only write lock from its ``BEGIN
IMMEDIATE``, so the second one waits for the first: the tests check that it did and that
the outcome follows that order. On PostgreSQL and MariaDB the forced order really happens
(checked too) and the locks must decide.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from acceld.conductor.binding import target as bind_target
from acceld.db import agents as agents_db
from acceld.db import host_retire
from acceld.db.models import agents
from tests.support.interleave import Background
from tests.support.nova import RecordingNova
from tests.support.retire import HostRig


@pytest.fixture
def nova():
    server = RecordingNova().start()
    yield server
    server.stop()


def _retire(rig: HostRig, force: bool):  # type: ignore[no-untyped-def]
    return lambda: host_retire.retire(rig.db, rig.host, force=force)


def _agent(rig: HostRig):  # type: ignore[no-untyped-def]
    with rig.db.read() as conn:
        return conn.execute(select(agents).where(agents.c.hostname == rig.host)).first()


# ------------------------------------------------------------------ a bind in flight

@pytest.mark.parametrize("force", [False, True])
def test_bind_holding_a_handle_decides_first(db, tmp_path, monkeypatch, force):
    """A bind took a handle (not committed; the agent went down meanwhile) -> a retire
    starts -> the bind commits Bound. The retire waited, then saw the bound ARQ."""
    rig = HostRig(db, tmp_path, agent_state="up")
    arq, instance = rig.start_bind()
    real_take = bind_target.take_handle
    seen: dict[str, object] = {}

    def take_then_retire(conn, target):  # type: ignore[no-untyped-def]
        real_take(conn, target)
        conn.execute(update(agents).values(state="down"))  # it dies right after the checks
        retirer = Background(db, _retire(rig, force), name="retire")
        seen["retire"] = retirer.finished_or_blocked()
        seen["retirer"] = retirer

    monkeypatch.setattr(bind_target, "take_handle", take_then_retire)
    rig.run_binds()
    monkeypatch.setattr(bind_target, "take_handle", real_take)
    retirer = seen["retirer"]
    assert seen["retire"] == "blocked"  # on the ARQ's lock (SQLite: the write lock)
    if not force:
        with pytest.raises(host_retire.HostInUse) as refused:
            retirer.join()  # type: ignore[attr-defined]
        assert arq in refused.value.message and instance in refused.value.message
        result = rig.arq(arq)
        assert result["state"] == "Bound" and result["attach_handle_info"]
        assert rig.counts()["handles"] == 2
        return
    retired = retirer.join()  # type: ignore[attr-defined]
    assert retired.failed_arqs == [(arq, instance)]
    result = rig.arq(arq)
    assert result["state"] == "BindFailed"
    assert result["bind_failure_reason"] == host_retire.reason(rig.host)
    assert rig.handles_without_owner() == 0
    assert rig.counts()["devices"] == 0


def test_bind_committed_after_the_retire_read_the_arqs_is_seen(db, tmp_path, monkeypatch):
    """A forced retire read the host's ARQs (none bound) -> a whole bind runs and commits
    Bound -> the retire locks the devices. It must not delete the handle under the new
    Bound ARQ: it starts again and fails that ARQ like any other."""
    rig = HostRig(db, tmp_path, agent_state="up")
    real_lock = host_retire.lock_arqs
    seen: dict[str, object] = {}
    made: dict[str, tuple[str, str]] = {}

    def bind_whole() -> None:
        made["arq"] = rig.start_bind()
        rig.run_binds()

    def read_then_bind(conn, hostname):  # type: ignore[no-untyped-def]
        rows = real_lock(conn, hostname)
        if "bind" not in seen:
            binder = Background(db, bind_whole, name="bind")
            seen["bind"] = binder.finished_or_blocked()
            seen["binder"] = binder
        return rows

    monkeypatch.setattr(host_retire, "lock_arqs", read_then_bind)
    retired = host_retire.retire(db, rig.host, force=True)
    monkeypatch.setattr(host_retire, "lock_arqs", real_lock)
    seen["binder"].join()  # type: ignore[attr-defined]
    arq, instance = made["arq"]
    result = rig.arq(arq)
    assert rig.handles_without_owner() == 0
    assert rig.counts()["devices"] == 0
    if db.is_sqlite:
        # The retire held the write lock: the bind came after it and found no device.
        assert seen["bind"] == "blocked"
        assert result["state"] == "BindFailed"
        assert "not the resource provider of any deployable" in result["bind_failure_reason"]
        return
    assert seen["bind"] == "finished"  # the forced order happened: Bound before the locks
    assert retired.failed_arqs == [(arq, instance)]
    assert result["state"] == "BindFailed"
    assert result["bind_failure_reason"] == host_retire.reason(rig.host)


def test_bind_reaching_the_device_after_the_retire_locked_it_fails(db, tmp_path, monkeypatch,
                                                                    nova):
    """A forced retire locked the host's devices -> a bind (its ARQ new to the retire)
    reaches the device -> the retire commits. The bind finds the device gone."""
    rig = HostRig(db, tmp_path, nova=nova, agent_state="up")
    real_lock = host_retire.lock_inventory
    seen: dict[str, object] = {}
    made: dict[str, tuple[str, str]] = {}

    def bind_whole() -> None:
        made["arq"] = rig.start_bind()
        rig.run_binds()

    def lock_then_bind(conn, hostname):  # type: ignore[no-untyped-def]
        locked = real_lock(conn, hostname)
        if "bind" not in seen:
            binder = Background(db, bind_whole, name="bind")
            seen["bind"] = binder.finished_or_blocked()
            seen["binder"] = binder
        return locked

    monkeypatch.setattr(host_retire, "lock_inventory", lock_then_bind)
    retired = host_retire.retire(db, rig.host, force=True)
    monkeypatch.setattr(host_retire, "lock_inventory", real_lock)
    seen["binder"].join()  # type: ignore[attr-defined]
    assert seen["bind"] == "blocked"  # on the device (SQLite: the write lock)
    arq, _ = made["arq"]
    assert retired.failed_arqs == []
    result = rig.arq(arq)
    assert result["state"] == "BindFailed", result
    assert rig.nova_heard(arq) == ["failed"]
    assert rig.handles_without_owner() == 0


# ------------------------------------------------------------------ the agent says hello

def test_hello_committed_first_makes_the_retire_a_conflict(db, tmp_path):
    """The agent's hello marks it up (not committed) -> a retire starts -> the hello
    commits. The retire waited for the agent's row and found it up: 409."""
    rig = HostRig(db, tmp_path, agent_state="down")
    with db.write() as conn:
        beat = agents_db.record_heartbeat(conn, rig.host, f"{rig.host}:6668", 10)
        retirer = Background(db, _retire(rig, False), name="retire")
        state = retirer.finished_or_blocked()
    assert beat.previous_state == "down"
    assert state == "blocked"
    with pytest.raises(host_retire.HostInUse) as refused:
        retirer.join()
    assert "is up" in refused.value.message
    assert _agent(rig).state == "up"
    assert rig.counts()["devices"] == 1


def test_hello_waiting_for_the_retire_registers_the_agent_anew(db, tmp_path, monkeypatch):
    """A retire holds the agent's row -> the agent's hello arrives -> the retire commits.
    The hello finds no row and registers the agent as new (its hardware is pulled again)."""
    rig = HostRig(db, tmp_path, agent_state="down")
    real_lock = host_retire.lock_arqs
    seen: dict[str, object] = {}

    def hello() -> agents_db.Heartbeat:
        with db.write() as conn:
            return agents_db.record_heartbeat(conn, rig.host, f"{rig.host}:6668", 10)

    def read_then_hello(conn, hostname):  # type: ignore[no-untyped-def]
        rows = real_lock(conn, hostname)
        helloer = Background(db, hello, name="hello")
        seen["hello"] = helloer.finished_or_blocked()
        seen["helloer"] = helloer
        return rows

    monkeypatch.setattr(host_retire, "lock_arqs", read_then_hello)
    retired = host_retire.retire(db, rig.host)
    monkeypatch.setattr(host_retire, "lock_arqs", real_lock)
    beat = seen["helloer"].join()  # type: ignore[attr-defined]
    assert seen["hello"] == "blocked"
    assert retired.agent and retired.devices == 1
    assert beat.new and beat.stored_digest is None
    agent = _agent(rig)
    assert agent.state == "up" and agent.hardware_digest is None
    assert rig.counts()["devices"] == 0  # until the conductor pulls its report



def test_binds_racing_every_try_end_in_a_conflict_not_a_loop(db, tmp_path, monkeypatch,
                                                             caplog):
    """Each try finds a handle holder it did not lock (as if a bind committed between its
    reads every time): after MAX_TRIES it gives up with 409 and has changed nothing."""
    rig = HostRig(db, tmp_path, agent_state="up")
    rig.bind()
    tries = []

    def sees_nothing(conn, hostname):  # type: ignore[no-untyped-def]
        tries.append(hostname)
        return []

    monkeypatch.setattr(host_retire, "lock_arqs", sees_nothing)
    with pytest.raises(host_retire.HostInUse) as refused:
        host_retire.retire(db, rig.host, force=True)
    assert "try again" in refused.value.message
    assert len(tries) == host_retire.MAX_TRIES
    assert rig.counts()["devices"] == 1 and rig.counts()["agent"] == 1
    assert "retired" not in caplog.text
