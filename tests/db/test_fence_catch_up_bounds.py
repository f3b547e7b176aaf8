"""A node that names a new floor at every call cannot keep a conductor busy for good, on
SQLite, PostgreSQL and MariaDB (an outside attack on issue 37 item 7's catch-up).

A fenced refusal whose floor is above the row's token raises the row to it and sends again
(a restored database: acceld.conductor.fencing.caught_up). A compromised node that answers
every call so, each time naming a floor just above the token it was sent (a floor a real
claim could have reached, so it is believed), made the bind go again at once without using
an attempt, and the release be due again at once, forever: a conductor's workers spun on
that node's ARQ and handle (a database write and an agent call each turn) and the ARQ never
resolved. A restore needs one catch-up per row; the turns after it count as tries: the bind
ends BindFailed naming the refusal after the attempt limit, the release backs off.
"""

from __future__ import annotations

import falcon
import pytest
from sqlalchemy import select, update

from acceld.agent.fences import FENCED
from acceld.conductor.binding.handle_release import ReleaseWorker
from acceld.conductor.binding.worker import MAX_BIND_ATTEMPTS, BindWorker
from acceld.db.models import agents, attach_handles, handle_releases
from acceld.internal.auth import agent_destination
from acceld.internal.server import InternalServer, build_app as internal_app, json_body
from tests.db.test_fencing import FencedNode
from tests.unit.test_attach_handles import HOST, SECRET


def always_one_above(req: falcon.Request, resp: falcon.Response) -> None:
    """A compromised agent: every call is 'fenced', naming its token + 1 as the floor."""
    token = json_body(req)["fence_token"]
    raise falcon.HTTPError(409, description=(
        f"{FENCED} the step was sent with fencing token {token}, older than {token + 1}, "
        "the lowest this agent still accepts for it. Nothing was done."))


@pytest.fixture
def node(tmp_path, db):
    built = FencedNode(tmp_path, db)
    built.start_agent()
    yield built
    built.stop_agent()


def turn_agent(node: FencedNode) -> None:
    """The node's agent now answers every prepare and release with a new floor."""
    node.stop_agent()
    node.agent = InternalServer(internal_app(SECRET, 60, {
        "/attach-handles/prepare": {"POST": always_one_above},
        "/attach-handles/release": {"POST": always_one_above}},
        destination=agent_destination(HOST)), "127.0.0.1", 0).start()
    with node.db.write() as conn:
        conn.execute(update(agents).where(agents.c.hostname == HOST).values(
            endpoint=node.agent.url[len("http://"):]))


def handle_token(node: FencedNode) -> int:
    with node.db.read() as conn:
        return int(conn.execute(select(attach_handles.c.fence_token)).scalar_one())


def test_a_node_naming_a_new_floor_each_time_does_not_keep_a_bind_going(node):
    turn_agent(node)
    arq = node.start_bind()
    worker = BindWorker(node.conf, node.db)
    before = handle_token(node)
    for _ in range(3 * MAX_BIND_ATTEMPTS):
        if not worker.run_once():
            break
    else:
        pytest.fail(f"the bind was still going after {3 * MAX_BIND_ATTEMPTS} passes "
                    f"(token {before} -> {handle_token(node)}): {node.arq(arq)}")
    found = node.arq(arq)
    assert found["state"] == "BindFailed", found
    assert "Fenced:" in found["bind_failure_reason"], found
    assert handle_token(node) - before <= 2 * MAX_BIND_ATTEMPTS


def test_a_node_naming_a_new_floor_each_time_gets_its_release_backed_off(node):
    arq = node.bind()
    node.unbind(arq)
    turn_agent(node)
    worker = ReleaseWorker(node.conf, node.db)
    taken = 0
    for _ in range(10):
        taken += worker.run_once()
    assert taken <= 2, f"the release was taken {taken} times in a row"
    with node.db.read() as conn:
        [row] = conn.execute(select(handle_releases)).all()
    assert row.last_error and "Fenced:" in row.last_error
