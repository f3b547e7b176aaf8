"""A stale program does not rewrite a PCI-handle FPGA under a Bound ARQ (issue 37 item 8),
on SQLite, PostgreSQL and MariaDB.

A bind of a PCI handle has no host step, so before this the agent never heard of it and a
program whose mark lapsed was written as soon as it reached the agent. Now:

* a bind of a handle of a deployable whose token the agent was not yet told (a row new from
  discovery, or one a program marked since) tells the agent, before the ARQ is Bound, the
  deployable's token as the bind read it (``POST /deployables/fence``): from then on the
  agent refuses every program up to it; binds that read the same token make no call;
* the agent checks a program's token under the deployable's fence lock right before the
  driver writes, and holds that lock around the write; a bind's fence (and an mdev
  prepare's) takes the same lock. A program that stalls anywhere before the write (at the
  conductor after its last check, or in the agent while it fetches the image) is refused
  once a bind fenced the deployable; one already writing ends before the bind goes on.

The agent is the production one (FencedNode), over the fake driver's PCI handles.
"""

from __future__ import annotations

import logging
import threading
import types
import uuid

import pytest
from sqlalchemy import select, update

from acceld.agent import attach as agent_attach
from acceld.agent import images
from acceld.agent import programming as agent_programming
from acceld.conductor.binding import attach_client
from acceld.conductor.programming import Programmer, ProgramError
from acceld.db import fences
from acceld.db.models import agents, deployables
from acceld.internal.auth import agent_destination
from acceld.internal.server import InternalServer, build_app as internal_app
from tests.db.test_fencing import (IMAGE, FencedNode, _dep_uuid, bind_while_a_program_stalls,
                                   lapse_marks)
from tests.unit.test_attach_handles import HOST, SECRET


OTHER = str(uuid.uuid4())  # the stale program's image: a write would change the digest


@pytest.fixture
def node(tmp_path, db):
    built = FencedNode(tmp_path, db, attach_type="TEST_PCI")
    (tmp_path / "bitstreams" / OTHER).write_bytes(b"\xaa\x55 another" * 32)
    built.start_agent()
    yield built
    built.stop_agent()


def test_a_program_stalled_after_its_last_check_is_refused_after_a_pci_bind(node, monkeypatch):
    """A checked its mark and stalls before its call reaches the agent; the mark lapses and
    a bind of a PCI handle goes Bound; A's program arrives: refused, nothing written."""
    programmer = Programmer(node.conf, node.db, SECRET)
    assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    written = node.fake.programmed("FakeDevice")
    later = bind_while_a_program_stalls(node, monkeypatch)
    with pytest.raises(ProgramError) as refused:
        programmer.program(_dep_uuid(node), "bitstream", image_id=OTHER)
    assert refused.value.status == 409 and refused.value.message.startswith("Fenced:")
    assert node.fake.programmed("FakeDevice") == written  # not written again
    assert node.arq(later["arq"])["state"] == "Bound"


def test_a_program_stalled_in_the_agent_before_the_write_is_refused(node, monkeypatch):
    """The agent admitted A's program and stalls while it fetches the image; meanwhile the
    mark lapses and a PCI bind goes Bound. A's token is checked again right before the
    write, under the lock the bind's fence took: refused, nothing written."""
    programmer = Programmer(node.conf, node.db, SECRET)
    assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    written = node.fake.programmed("FakeDevice")
    fetching, resume = threading.Event(), threading.Event()
    real_open = images.DirectorySource.open

    def stalled_open(self, image_id):  # type: ignore[no-untyped-def]
        fetching.set()
        assert resume.wait(60)
        return real_open(self, image_id)

    monkeypatch.setattr(images.DirectorySource, "open", stalled_open)
    outcome: list[BaseException | str] = []

    def program() -> None:
        try:
            outcome.append(programmer.program(_dep_uuid(node), "bitstream", image_id=OTHER))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome.append(exc)

    thread = threading.Thread(target=program, daemon=True)
    thread.start()
    try:
        assert fetching.wait(30), "the program never reached the agent"
        lapse_marks(node)
        arq = node.bind()
        assert node.arq(arq)["state"] == "Bound"
    finally:
        resume.set()
        thread.join(60)
    [result] = outcome
    assert isinstance(result, ProgramError) and result.status == 409, result
    assert result.message.startswith("Fenced:")
    assert node.fake.programmed("FakeDevice") == written
    assert node.arq(arq)["state"] == "Bound"


def _count_fences(monkeypatch) -> list[str]:
    """The hosts each bind's ``POST /deployables/fence`` went to (the real call is made)."""
    sent: list[str] = []
    real = attach_client.AttachClient.fence

    def counted(self, hostname, body):  # type: ignore[no-untyped-def]
        sent.append(hostname)
        return real(self, hostname, body)

    monkeypatch.setattr(attach_client.AttachClient, "fence", counted)
    return sent


def test_only_the_first_bind_of_a_never_programmed_deployable_calls_the_agent(
        node, monkeypatch):
    """The first bind of a new deployable row tells the agent the row's first token (which
    refuses every program of an earlier row of the same device, docs/architecture.md,
    "Keys that come back"); no program marked it since, so later binds stay one
    transaction with no agent call."""
    sent = _count_fences(monkeypatch)
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound" and sent == [HOST]
    node.unbind(arq)
    node.stop_agent()  # any call would fail
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound" and sent == [HOST]


def test_a_bind_fences_once_per_program_mark(node, monkeypatch):
    """The agent keeps the floor a bind's fence raised; binds that read the same token add
    nothing: one fence per program mark, not one per bind."""
    sent = _count_fences(monkeypatch)
    programmer = Programmer(node.conf, node.db, SECRET)
    assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    for expected in (1, 1):
        arq = node.bind()
        assert node.arq(arq)["state"] == "Bound" and len(sent) == expected
        node.unbind(arq)
    assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound" and len(sent) == 2


def test_a_pci_bind_after_programs_is_bound_and_unbinds_as_before(node):
    programmer = Programmer(node.conf, node.db, SECRET)
    assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound" and len(node.in_use()) == 1
    node.unbind(arq)
    assert node.in_use() == [] and node.queue() == []  # a PCI handle: freed at once
    assert programmer.program(_dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE


def _told(node: FencedNode) -> int | None:
    with node.db.read() as conn:
        return conn.execute(select(deployables.c.fence_told)).scalar_one()


def test_an_agent_from_before_the_fence_route_still_binds(node, caplog, monkeypatch):
    """Version skew: the agent answers 404 for ``POST /deployables/fence``; the bind goes on
    unfenced there, as before, with one WARNING for the host. The row stays untold, so the
    next bind asks again (an upgraded agent is then told)."""
    assert Programmer(node.conf, node.db, SECRET).program(
        _dep_uuid(node), "bitstream", image_id=IMAGE) == IMAGE
    node.stop_agent()
    shell = types.SimpleNamespace(conf=node.conf, hostname=HOST,
                                  find_driver={"fake": node.fake}.get,
                                  discover_in_background=lambda: None)
    routes = {**agent_attach.agent_routes(shell), **agent_programming.agent_routes(shell)}
    del routes["/deployables/fence"]
    node.agent = InternalServer(internal_app(SECRET, 60, routes,
                                             destination=agent_destination(HOST)),
                                "127.0.0.1", 0).start()
    with node.db.write() as conn:
        conn.execute(update(agents).where(agents.c.hostname == HOST).values(
            endpoint=node.agent.url[len("http://"):]))
    attach_client.SKEW.forget(HOST)  # what another test's agent taught this process
    sent = _count_fences(monkeypatch)
    with caplog.at_level(logging.WARNING):
        arq = node.bind()
        assert node.arq(arq)["state"] == "Bound"
        node.unbind(arq)
        arq = node.bind()
        assert node.arq(arq)["state"] == "Bound"
    attach_client.SKEW.forget(HOST)
    assert len([r for r in caplog.records if "/deployables/fence" in r.getMessage()]) == 1
    assert sent == [HOST, HOST] and _told(node) is None


def test_a_told_token_is_recorded_and_never_lowered(node):
    """The fence's answer records the token the bind read; a slower bind's older one does
    not undo it."""
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound"
    with node.db.read() as conn:
        dep_id, token = conn.execute(select(deployables.c.id, deployables.c.fence_token)).one()
    assert _told(node) == token > 0
    with node.db.write() as conn:
        fences.record_told(conn, dep_id, token - 1)
    assert _told(node) == token


def test_an_agent_without_device_floors_leaves_the_row_untold(node, monkeypatch):
    """An agent of the release before device floors answers the fence ``{"fenced": true}``
    (it raised the row's uuid floor only): the row stays untold, so a bind after that agent's
    upgrade tells the device's floor too."""
    real = agent_programming.Programming.fence

    def uuid_only(self, request):  # type: ignore[no-untyped-def]
        answer = real(self, request)
        return {"fenced": answer["fenced"]}

    monkeypatch.setattr(agent_programming.Programming, "fence", uuid_only)
    sent = _count_fences(monkeypatch)
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound" and sent == [HOST] and _told(node) is None
    node.unbind(arq)
    monkeypatch.setattr(agent_programming.Programming, "fence", real)  # upgraded
    arq = node.bind()
    assert node.arq(arq)["state"] == "Bound" and sent == [HOST, HOST]
    assert _told(node) is not None
