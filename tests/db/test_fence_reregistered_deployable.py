"""A stale program does not rewrite an FPGA across its host's re-registration, on SQLite,
PostgreSQL and MariaDB (an outside attack on issue 37 items 6 and 8).

The agent writes the device its request names by driver and deployable name, and fenced
the program by the deployable's uuid only. A deployable discovered again (its host retired and
registered anew) gets a new row with a new uuid, so a program claimed on the old row by a
conductor that stalled across the re-registration was checked against the old uuid's
floor, which nothing raised any more: a bind of the new row's handle went Bound (a PCI
handle: no agent call, the row was never marked; an mdev: its prepare raised the new uuid's
floor), the stale program arrived and rewrote the device under it.

Fixed (docs/architecture.md, "Fencing", "Keys that come back"): the agent also keeps a
floor per device as it names it (``local:program:<driver>/<name>``), raised by programs,
fences and prepares of any row of the device; a new deployable row starts at
``fences.first_token`` and untold, so its first bind tells the agent a token above every
token of the earlier row (a PCI bind's ``POST /deployables/fence``, an mdev prepare).

The agent is the production one (tests/db/test_fencing.py's FencedNode).
"""

from __future__ import annotations

import uuid

import pytest

from acceld.conductor.programming import Programmer, ProgramError
from tests.db.test_fence_keys import retire_and_register_again
from tests.db.test_fencing import IMAGE, FencedNode, _dep_uuid, bind_while_a_program_stalls
from tests.unit.test_attach_handles import SECRET, Node

OTHER = str(uuid.uuid4())  # the stale program's image: a write would change the digest


@pytest.fixture(params=["TEST_PCI", "MDEV"])
def node(request, tmp_path, db):
    built = FencedNode(tmp_path, db, attach_type=request.param)
    (tmp_path / "bitstreams" / OTHER).write_bytes(b"\xaa\x55 another" * 32)
    built.start_agent()
    yield built
    built.stop_agent()


def test_a_program_stalled_across_a_reregistration_does_not_write_under_a_bound_arq(
        node, monkeypatch):
    """A marks the deployable and stalls at its agent call; the host is retired and
    registered again (a new deployable row, a new uuid, for the same device) and a bind of
    its handle goes Bound; A resumes: refused, the device keeps what the bind found."""
    programmer = Programmer(node.conf, node.db, SECRET)
    old = _dep_uuid(node)
    assert programmer.program(old, "bitstream", image_id=IMAGE) == IMAGE
    written = node.fake.programmed("FakeDevice")
    def reregister(node: Node) -> None:
        retire_and_register_again(node)
        assert _dep_uuid(node) != old

    later = bind_while_a_program_stalls(node, monkeypatch, reregister)
    with pytest.raises(ProgramError) as refused:
        programmer.program(old, "bitstream", image_id=OTHER)
    assert refused.value.status == 409 and refused.value.message.startswith("Fenced:")
    assert node.fake.programmed("FakeDevice") == written, \
        "the stale program rewrote the device under a Bound ARQ"
    assert node.arq(later["arq"])["state"] == "Bound"
