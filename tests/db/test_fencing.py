"""Fencing of agent side effects (issue 24 item 2): a conductor that stalls past its claim,
lease or programming mark does nothing when it resumes. On SQLite, PostgreSQL and MariaDB.

Each test stalls conductor A with a hook at the exact point (after its claim, and either
before its re-check of the claim or after it, at the agent call itself), makes A's claim
lapse, lets the others act with newer claims, then resumes A:

* a release whose lease lapsed while B released the handle and a new bind prepared the same
  mdev: A's release is refused by the agent (the mdev stays under the Bound ARQ), or not
  sent at all when the re-check sees the lapse;
* a bind's prepare whose job lease lapsed while a later try bound, the ARQ was unbound and
  the release removed the mdev: A's prepare does not recreate it;
* a program whose mark lapsed while a bind went Bound on the deployable: the device is not
  written.

The agent is the production one (its route factories, with their journal and fence store
under ``state_path``) on a loopback internal server, over the fake driver's simulated mdevs.
"""

from __future__ import annotations

import datetime as dt
import logging
import types
import uuid
from typing import Callable

import pytest
from sqlalchemy import select, update

from acceld.agent import attach as agent_attach
from acceld.agent import programming as agent_programming
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.conductor.programming import Programmer, ProgramError
from acceld.db import handle_releases
from acceld.db.models import agents, bind_jobs, deployables, utcnow
from acceld.db.models import handle_releases as releases_table
from acceld.drivers.fake import FakeDriver
from acceld.internal.auth import agent_destination
from acceld.internal.server import InternalServer, build_app as internal_app
from tests.unit.test_attach_handles import HOST, SECRET, Node, mdev_uuid

IMAGE = str(uuid.uuid4())
PAST = dt.timedelta(minutes=10)


class FencedNode(Node):
    """A Node whose agent is built by the agent's own route factories (attach and program)."""

    def __init__(self, tmp_path, db, handles: int = 1,  # type: ignore[no-untyped-def]
                 attach_type: str = "MDEV") -> None:
        super().__init__(tmp_path, db, attach_type=attach_type, handles=handles, told=False)
        images = tmp_path / "bitstreams"
        images.mkdir()
        (images / IMAGE).write_bytes(b"\x55\xaa bitstream" * 32)
        self.conf.set_override("bitstream_dir", str(images), group="agent")
        self.tmp_path = tmp_path

    def start_agent(self) -> None:
        fake = FakeDriver(self.conf, HOST)
        shell = types.SimpleNamespace(conf=self.conf, hostname=HOST,
                                      find_driver={"fake": fake}.get,
                                      discover_in_background=lambda: None)
        routes = {**agent_attach.agent_routes(shell), **agent_programming.agent_routes(shell)}
        self.agent = InternalServer(internal_app(SECRET, 60, routes,
                                                 destination=agent_destination(HOST)),
                                    "127.0.0.1", 0).start()
        with self.db.write() as conn:
            conn.execute(update(agents).where(agents.c.hostname == HOST).values(
                endpoint=self.agent.url[len("http://"):]))

    def releases_logged(self) -> int:
        return sum(1 for step, _ in self.fake.attach_state().get("log", []) if step == "release")


@pytest.fixture
def node(tmp_path, db):
    built = FencedNode(tmp_path, db)
    built.start_agent()
    yield built
    built.stop_agent()


def lapse_releases(node: Node) -> None:
    """Every release claim's lease has run out (the claimer stalled past it)."""
    with node.db.write() as conn:
        conn.execute(update(releases_table).values(lease_expires_at=utcnow() - PAST))


def lapse_bind_jobs(node: Node) -> None:
    with node.db.write() as conn:
        conn.execute(update(bind_jobs).values(lease_expires_at=utcnow() - PAST))


def lapse_marks(node: Node) -> None:
    with node.db.write() as conn:
        conn.execute(update(deployables).values(programming_until=utcnow() - PAST))


def bind_while_a_program_stalls(node: Node, monkeypatch: pytest.MonkeyPatch,
                                meanwhile: Callable[[Node], None] = lapse_marks
                                ) -> dict[str, str]:
    """Stall the next program's call to its agent (after the conductor's last check): while
    it stalls, ``meanwhile(node)`` runs and a bind goes Bound; then the call goes on. The
    dict holds that bind's ARQ (``"arq"``) once the call was made."""
    real_call = Programmer._call_agent
    later: dict[str, str] = {}

    def stall_then_resume(self, url, hostname, request, path="/program"):  # type: ignore[no-untyped-def]
        if path == "/program" and "arq" not in later:
            meanwhile(node)
            later["arq"] = node.bind()
            assert node.arq(later["arq"])["state"] == "Bound"
        return real_call(self, url, hostname, request, path)

    monkeypatch.setattr(Programmer, "_call_agent", stall_then_resume)
    return later


def run_binds(node: Node, worker: BindWorker | None = None) -> None:
    worker = worker or BindWorker(node.conf, node.db)
    while worker.run_once():
        pass


def meanwhile_b_releases_and_a_bind_prepares(node: Node) -> str:
    """While A stalls past its release lease: B releases the handle (newer token), a new bind
    takes the same handle and prepares the same mdev (newer still) and is Bound."""
    lapse_releases(node)
    assert ReleaseWorker(node.conf, node.db).run_once() == 1
    assert node.prepared() == set() and node.in_use() == []
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound"
    return arq


def bound_then_unbound(node: Node) -> str:
    first = node.bind()
    [mdev] = node.prepared()
    node.unbind(first)
    assert len(node.queue()) == 1
    return mdev


def test_a_stalled_release_is_refused_after_a_new_bind_prepared_the_mdev(node, caplog):
    """Stall at the agent call (after A's re-check): the agent refuses A's older token."""
    mdev = bound_then_unbound(node)
    stalled = ReleaseWorker(node.conf, node.db)
    real_release = stalled.client.release
    later: dict[str, str] = {}

    def stall_then_resume(hostname, body):  # type: ignore[no-untyped-def]
        later["arq"] = meanwhile_b_releases_and_a_bind_prepares(node)
        return real_release(hostname, body)  # A resumes its call

    stalled.client.release = stall_then_resume
    with caplog.at_level(logging.WARNING, logger="acceld.conductor.binding.handle_release"):
        assert stalled.run_once() == 1
    assert node.prepared() == {mdev}  # the Bound ARQ's mdev stays
    assert node.arq(later["arq"])["state"] == "Bound"
    [held] = node.in_use()
    assert mdev_uuid(held) == mdev and node.queue() == []
    assert node.releases_logged() == 1  # B's only
    fenced = [r for r in caplog.records if "fenced" in r.getMessage()]
    assert len(fenced) == 1, [r.getMessage() for r in caplog.records]


def test_a_release_whose_claim_lapsed_before_its_recheck_is_not_sent(node, monkeypatch):
    """Stall right after the claim (before the re-check): A sends nothing."""
    mdev = bound_then_unbound(node)
    real_claim = handle_releases.claim
    later: dict[str, str] = {}

    def claim_then_stall(*args, **kwargs):  # type: ignore[no-untyped-def]
        rows = real_claim(*args, **kwargs)
        if rows and not later:  # A's claim (B's, made in the hook, goes straight on)
            later["arq"] = "B is releasing"
            later["arq"] = meanwhile_b_releases_and_a_bind_prepares(node)
        return rows

    monkeypatch.setattr(handle_releases, "claim", claim_then_stall)
    assert ReleaseWorker(node.conf, node.db).run_once() == 1
    assert node.prepared() == {mdev}
    assert node.releases_logged() == 1
    assert node.arq(later["arq"])["state"] == "Bound" and len(node.in_use()) == 1


def test_a_stalled_prepare_does_not_recreate_a_released_mdev(node):
    """A took the handle and stalls at its prepare; its job lease lapses, a later try binds,
    the ARQ is unbound and the release removes the mdev; then A's prepare arrives."""
    arq = node.start_bind()
    stalled = BindWorker(node.conf, node.db)
    real_prepare = stalled.attach.prepare

    def stall_then_resume(hostname, body):  # type: ignore[no-untyped-def]
        lapse_bind_jobs(node)
        run_binds(node)  # the later try: prepared (newer token) and Bound
        assert node.arq(arq)["state"] == "Bound" and len(node.prepared()) == 1
        node.unbind(arq)
        assert node.release_all() == 1  # newer still: the mdev is removed
        assert node.prepared() == set()
        return real_prepare(hostname, body)  # A resumes

    stalled.attach.prepare = stall_then_resume
    run_binds(node, stalled)
    assert node.arq(arq)["state"] == "Unbound"
    assert node.prepared() == set()  # not recreated
    assert node.in_use() == [] and node.queue() == []


def _dep_uuid(node: Node) -> str:
    with node.db.read() as conn:
        return conn.execute(select(deployables.c.uuid)).scalar_one()


def test_a_stalled_program_does_not_write_under_a_bound_arq(node, monkeypatch):
    """A marked the deployable and stalls at its agent call; the mark lapses and a bind goes
    Bound on the deployable (its prepare tells the agent); A's program is refused."""
    later = bind_while_a_program_stalls(node, monkeypatch)
    with pytest.raises(ProgramError) as refused:
        Programmer(node.conf, node.db, SECRET).program(_dep_uuid(node), "bitstream",
                                                       image_id=IMAGE)
    assert refused.value.status == 409 and refused.value.message.startswith("Fenced:")
    assert node.fake.programmed("FakeDevice") == {}  # the device was not written
    assert node.arq(later["arq"])["state"] == "Bound"
    with node.db.read() as conn:
        assert conn.execute(select(deployables.c.bitstream_id)).scalar_one() is None


def test_a_program_whose_mark_lapsed_before_its_recheck_is_not_sent(node, monkeypatch):
    calls: list[str] = []
    real_call = Programmer._call_agent
    real_check = Programmer._still_ours

    def lapse_then_check(self, *args):  # type: ignore[no-untyped-def]
        lapse_marks(node)
        assert node.arq(node.bind())["state"] == "Bound"
        return real_check(self, *args)

    def counted(self, url, hostname, request, path="/program"):  # type: ignore[no-untyped-def]
        calls.append(path)
        return real_call(self, url, hostname, request, path)

    monkeypatch.setattr(Programmer, "_still_ours", lapse_then_check)
    monkeypatch.setattr(Programmer, "_call_agent", counted)
    with pytest.raises(ProgramError) as refused:
        Programmer(node.conf, node.db, SECRET).program(_dep_uuid(node), "bitstream",
                                                       image_id=IMAGE)
    assert refused.value.status == 409 and refused.value.fenced
    assert calls == [] and node.fake.programmed("FakeDevice") == {}


def test_fenced_calls_still_work_in_order(node):
    """The tokens never refuse the ordinary sequence: bind, unbind, release, program, bind."""
    first = node.bind()
    node.unbind(first)
    assert node.release_all() == 1 and node.prepared() == set()
    assert Programmer(node.conf, node.db, SECRET).program(
        _dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    assert node.fake.programmed("FakeDevice")["bitstream"]
    second = node.bind()
    assert node.arq(second)["state"] == "Bound" and len(node.prepared()) == 1
