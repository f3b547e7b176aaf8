"""Programming never runs under an instance (issue 11 item 1), forced at the exact point on
SQLite, PostgreSQL and MariaDB.

Guarantees under test:

* two binds asking different bitstreams of one deployable: exactly one ends ``Bound``, the
  other ``BindFailed`` saying why, and the device holds the ``Bound`` one's image;
* a bind whose profile names no bitstream, arriving while another bind's program rewrites
  the device, does not go ``Bound``: it ends ``BindFailed`` saying the deployable is being
  programmed (the design's choice; docs/arqs.md);
* a direct program while one of the deployable's handles is in use, or being taken by a bind
  that has not committed yet, is refused (409) naming the ARQs, and nothing is programmed;
* a bind arriving while a direct program runs is not ``Bound`` on that deployable.

Each test pauses one side at the point that matters (a bind's transaction right after it
took its handle, or a program inside its agent call) with events, then runs the other side
and checks what the database decided. On SQLite the second writer waits for the paused
first (one write lock); on PostgreSQL and MariaDB the row locks decide.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
import uuid

import pytest
from sqlalchemy import update as sa_update

from acceld.conductor import programming
from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.programming import BindProgramming
from acceld.conductor.binding.worker import BindWorker
from acceld.conductor.programming import Programmer, ProgramError
from acceld.db import bind_jobs
from acceld.db.clock import db_now
from acceld.db.models import attach_handles, deployables
from tests.conftest import make_conf
from tests.helpers import ADMIN, SERVICE, version
from tests.support.interleave import DEADLINE, Background, Gate
from tests.support.programming import DATA, HOST, IMAGE, SECRET, Chain

ARQS = "/accelerator/v2/accelerator_requests"
OTHER = str(uuid.uuid4())
OTHER_DATA = b"another bitstream" * 16
TOKEN = "program-race"


@pytest.fixture
def chain(tmp_path, db):
    directory = tmp_path / "bitstreams"
    directory.mkdir()
    (directory / IMAGE).write_bytes(DATA)
    (directory / OTHER).write_bytes(OTHER_DATA)
    conf = make_conf(str(tmp_path), agent__bitstream_dir=str(directory),
                     conductor__program_timeout=20)
    built = Chain(conf, db, handles=4)
    yield built
    built.stop()


def request_bind(chain: Chain, group: dict[str, str]) -> str:
    """An ARQ of a one-group profile of its own, bound to the FPGA by Nova (job pending)."""
    name = f"dp-{uuid.uuid4().hex[:8]}"
    client = chain.client
    assert client.simulate_post("/accelerator/v2/device_profiles", headers=ADMIN, json=[
        {"name": name, "groups": [{"resources:FPGA": "1", **group}]}]).status_code == 201
    [arq] = client.simulate_post(ARQS, json={"device_profile_name": name},
                                 headers=SERVICE).json["arqs"]
    ops = [{"op": "add", "path": "/hostname", "value": HOST},
           {"op": "add", "path": "/device_rp_uuid", "value": chain.dep["rp_uuid"]},
           {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid4())}]
    assert client.simulate_patch(ARQS, json={arq["uuid"]: ops},
                                 headers=SERVICE).status_code == 202
    return arq["uuid"]


def claim_one(chain: Chain):  # type: ignore[no-untyped-def]
    """The oldest pending job (each ARQ here is its own instance's), claimed for TOKEN."""
    [job] = bind_jobs.claim(chain.db, bind_jobs.PENDING, TOKEN, 1, 300)
    return job


def bind_job(chain: Chain, job) -> bool:  # type: ignore[no-untyped-def]
    return BindWorker(chain.conf, chain.db)._bind(job, TOKEN)


def show(chain: Chain, arq_uuid: str) -> dict:
    return chain.client.simulate_get(f"{ARQS}/{arq_uuid}",
                                     headers={**SERVICE, **version("2.4")}).json


def loaded(chain: Chain) -> str | None:
    """The digest of what the fake driver holds now (None: never programmed)."""
    record = chain.fake.programmed("FakeDevice").get("bitstream")
    return record and record["sha256"]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pause_after_taking_a_handle(monkeypatch, thread_name: str) -> Gate:
    """The bind transaction of thread ``thread_name`` stops right after it took its handle,
    before it commits."""
    gate, original = Gate(), bind_target.take_handle

    def take_then_pause(conn, target):  # type: ignore[no-untyped-def]
        original(conn, target)
        if threading.current_thread().name == thread_name:
            gate.pause()

    monkeypatch.setattr(bind_target, "take_handle", take_then_pause)
    return gate


def pause_inside_the_program(monkeypatch) -> Gate:
    """The next program stops inside its agent call (the device is being rewritten)."""
    gate, original = Gate(), Programmer._call_agent

    def paused(self, url, hostname, request, path="/program"):  # type: ignore[no-untyped-def]
        if path == "/program" and not gate.reached.is_set():
            gate.pause()
        return original(self, url, hostname, request, path)

    monkeypatch.setattr(Programmer, "_call_agent", paused)
    return gate


class Side:
    """``fn()`` in a named thread; its result or error."""

    def __init__(self, name: str, fn) -> None:  # type: ignore[no-untyped-def]
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:  # type: ignore[no-untyped-def]
        try:
            self.result = fn()
        except BaseException as exc:  # noqa: BLE001 - raised by join()
            self.error = exc

    def join(self):  # type: ignore[no-untyped-def]
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.result


def pause_after_programming(monkeypatch, thread_name: str) -> Gate:
    """The bind of thread ``thread_name`` stops once its program is done (lease given back),
    before its bind transaction."""
    gate, original = Gate(), BindProgramming.before

    def before_then_pause(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        verdict = original(self, *args, **kwargs)
        if threading.current_thread().name == thread_name:
            gate.pause()
        return verdict

    monkeypatch.setattr(BindProgramming, "before", before_then_pause)
    return gate


def pause_with_the_lease(monkeypatch, thread_name: str) -> Gate:
    """The program of thread ``thread_name`` stops right after it took the program lease."""
    gate, original = Gate(), programming._ProgramLease.__enter__

    def enter_then_pause(self):  # type: ignore[no-untyped-def]
        lease = original(self)
        if threading.current_thread().name == thread_name:
            gate.pause()
        return lease

    monkeypatch.setattr(programming._ProgramLease, "__enter__", enter_then_pause)
    return gate


def test_two_binds_with_different_bitstreams_one_wins(chain, monkeypatch):
    """A programmed IMAGE; B (OTHER) takes the program lease; A's bind transaction takes a
    handle and stops before it commits; then B goes on: its check of the handles must not
    miss A's, whatever the database."""
    first = request_bind(chain, {"accel:bitstream_id": IMAGE})
    second = request_bind(chain, {"accel:bitstream_id": OTHER})
    job_a, job_b = claim_one(chain), claim_one(chain)
    a_programmed = pause_after_programming(monkeypatch, "bind-a")
    b_leased = pause_with_the_lease(monkeypatch, "bind-b")
    a_taken = pause_after_taking_a_handle(monkeypatch, "bind-a")
    a = Side("bind-a", lambda: bind_job(chain, job_a))
    a_programmed.wait_reached()
    b = Background(chain.db, lambda: bind_job(chain, job_b), name="bind-b")
    b_leased.wait_reached()
    a_programmed.open()
    a_taken.wait_reached()  # A's transaction holds a handle, uncommitted
    b.wants_write_lock.clear()  # SQLite: B's lease was its last write; watch for the next
    b_leased.open()
    assert b.finished_or_blocked() in ("finished", "blocked")
    a_taken.open()
    a.join()
    b.join()
    states = {show(chain, u)["state"]: u for u in (first, second)}
    assert sorted(states) == ["BindFailed", "Bound"], states
    winner, loser = states["Bound"], states["BindFailed"]
    reason = show(chain, loser)["bind_failure_reason"]
    assert "in use" in reason or "being programmed" in reason or "reprogrammed" in reason, reason
    wanted = IMAGE if winner == first else OTHER
    assert chain.bitstream() == wanted
    assert loaded(chain) == digest(DATA if wanted == IMAGE else OTHER_DATA)


def test_a_bind_without_bitstream_waits_for_no_program(chain, monkeypatch):
    """C names no bitstream and arrives while A's program rewrites the device: C is not
    Bound on it (BindFailed, saying so); A ends Bound with its image."""
    first = request_bind(chain, {"accel:bitstream_id": IMAGE})
    plain = request_bind(chain, {})
    job_a, job_c = claim_one(chain), claim_one(chain)
    gate = pause_inside_the_program(monkeypatch)
    a = Side("bind-a", lambda: bind_job(chain, job_a))
    gate.wait_reached()
    # Nothing holds a lock now (A's mark is committed): C runs to its end.
    Side("bind-c", lambda: bind_job(chain, job_c)).join()
    during = show(chain, plain)
    gate.open()
    a.join()
    assert during["state"] == "BindFailed", during
    assert "being programmed" in during["bind_failure_reason"]
    assert show(chain, first)["state"] == "Bound"
    assert chain.bitstream() == IMAGE and loaded(chain) == digest(DATA)


PROGRAM_FORMS = [
    ("upstream", "2.4"), ("upstream", "2.5"), ("seed-bitstream", None), ("seed-firmware", None)]


def direct_program(chain: Chain, form: str,  # type: ignore[no-untyped-def]
                   microversion: str | None):
    uuid_ = chain.dep["uuid"]
    headers = {**ADMIN, **(version(microversion) if microversion else {})}
    if form == "upstream":
        url, body = f"{uuid_}/program", [{"path": "/program", "op": "replace",
                                          "value": [{"image_uuid": IMAGE}]}]
    else:
        kind = form.split("-")[1]
        url, body = uuid_, [{"path": f"/{kind}", "op": "replace", "value": IMAGE}]
    return chain.client.simulate_patch(f"/accelerator/v2/deployables/{url}", headers=headers,
                                       json=body)


@pytest.mark.parametrize("form, microversion", PROGRAM_FORMS)
def test_direct_program_of_a_deployable_in_use_is_409(chain, form, microversion):
    arq = request_bind(chain, {})
    BindWorker(chain.conf, chain.db).run_once()
    bound = show(chain, arq)
    assert bound["state"] == "Bound"
    answer = direct_program(chain, form, microversion)
    assert answer.status_code == 409, answer.text
    message = answer.json["error"] if "error" in answer.json else answer.text
    assert arq in answer.text and bound["instance_uuid"] in answer.text, message
    assert chain.fake.programmed("FakeDevice") == {}
    assert chain.bitstream() is None
    deployable = chain.client.simulate_get(f"/accelerator/v2/deployables/{chain.dep['uuid']}",
                                           headers={**ADMIN, **version("2.5")}).json
    assert deployable["program_status"] is None  # refused before it started


def test_direct_program_while_a_handle_is_being_taken(chain, monkeypatch):
    """A bind took a handle and has not committed; the program waits for it, then sees the
    handle in use: 409 naming the ARQ, nothing programmed."""
    arq = request_bind(chain, {})
    job = claim_one(chain)
    gate = pause_after_taking_a_handle(monkeypatch, "bind-c")
    c = Side("bind-c", lambda: bind_job(chain, job))
    gate.wait_reached()
    program = Background(chain.db, lambda: Programmer(chain.conf, chain.db, SECRET).program(
        chain.dep["uuid"], "bitstream", image_id=IMAGE), name="program")
    assert program.finished_or_blocked() in ("finished", "blocked")
    gate.open()
    c.join()
    with pytest.raises(ProgramError) as refused:
        program.join()
    assert refused.value.status == 409
    assert arq in refused.value.message
    assert show(chain, arq)["state"] == "Bound"
    assert chain.fake.programmed("FakeDevice") == {}
    assert chain.bitstream() is None


def test_a_bind_during_a_direct_program_is_not_bound(chain, monkeypatch):
    plain = request_bind(chain, {})
    gate = pause_inside_the_program(monkeypatch)
    program = Side("program", lambda: direct_program(chain, "upstream", "2.4"))
    gate.wait_reached()
    BindWorker(chain.conf, chain.db).run_once()
    during = show(chain, plain)
    gate.open()
    assert program.join().status_code == 200
    assert during["state"] == "BindFailed", during
    assert "being programmed" in during["bind_failure_reason"]
    assert chain.bitstream() == IMAGE and loaded(chain) == digest(DATA)


def test_binds_go_on_once_the_program_ended(chain):
    """The mark is cleared with the result: a later bind takes a handle as before."""
    assert direct_program(chain, "upstream", "2.4").status_code == 200
    arq = request_bind(chain, {"accel:bitstream_id": IMAGE})
    BindWorker(chain.conf, chain.db).run_once()
    assert show(chain, arq)["state"] == "Bound"


def test_a_failed_program_gives_the_deployable_back(chain):
    """A program the agent fails clears its mark: the next bind is not refused for it."""
    refused = direct_program_of(chain, str(uuid.uuid4()))  # no such image on the node
    assert refused.status_code == 400 and "not found" in refused.text, refused.text
    arq = request_bind(chain, {})
    BindWorker(chain.conf, chain.db).run_once()
    assert show(chain, arq)["state"] == "Bound", show(chain, arq)


@pytest.mark.parametrize("seconds_left, state", [(-1, "Bound"), (300, "BindFailed")])
def test_a_crashed_programs_mark_lapses(chain, seconds_left, state):
    """A conductor that died mid-program leaves its mark; binds are refused until it lapses
    (by the database's clock), then go on."""
    with chain.db.write() as conn:
        until = db_now(conn) + dt.timedelta(seconds=seconds_left)
        conn.execute(sa_update(deployables).values(programming_owner="dead-conductor",
                                                   programming_until=until))
    arq = request_bind(chain, {})
    BindWorker(chain.conf, chain.db).run_once()
    assert show(chain, arq)["state"] == state


def direct_program_of(chain: Chain, image: str):  # type: ignore[no-untyped-def]
    return chain.client.simulate_patch(
        f"/accelerator/v2/deployables/{chain.dep['uuid']}/program", headers=ADMIN,
        json=[{"path": "/program", "op": "replace", "value": [{"image_uuid": image}]}])


def test_an_async_program_overtaken_by_a_bind_fails_naming_it(chain):
    """From 2.5 the in-use check answers before the 202; a bind that takes a handle after the
    202 and before the program starts fails the program (FAILED, the 409 as its reason)."""
    request_id = chain.component._start(chain.dep["id"])  # the 202 was answered
    arq = request_bind(chain, {})
    BindWorker(chain.conf, chain.db).run_once()
    assert show(chain, arq)["state"] == "Bound"
    with pytest.raises(ProgramError) as refused:
        chain.component._run(chain.dep["uuid"], chain.dep["id"], request_id, "bitstream",
                             IMAGE, None)
    assert refused.value.status == 409
    deployable = chain.client.simulate_get(f"/accelerator/v2/deployables/{chain.dep['uuid']}",
                                           headers={**ADMIN, **version("2.5")}).json
    assert deployable["program_status"] == "FAILED"
    assert deployable["program_reason"].startswith("409: ") and arq in deployable[
        "program_reason"]
    assert chain.fake.programmed("FakeDevice") == {}


def test_a_handle_whose_release_is_pending_also_holds_the_deployable(chain):
    """A handle still in use with no ARQ (its release queued) is named in the 409."""
    with chain.db.write() as conn:
        conn.execute(sa_update(attach_handles).values(in_use=True))
    answer = direct_program_of(chain, IMAGE)
    assert answer.status_code == 409
    assert "release is still pending" in answer.text
    assert chain.fake.programmed("FakeDevice") == {}


def test_a_timed_out_program_keeps_binds_out(chain, monkeypatch):
    """The agent did not answer within program_timeout and may still be writing the device:
    the mark stays (for one more program_timeout + 30 s), so binds are still refused."""
    chain.conf.set_override("program_timeout", 1, group="conductor")
    writing, done = threading.Event(), threading.Event()
    original = chain.fake.program

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        writing.set()
        assert done.wait(DEADLINE)
        return original(*args, **kwargs)

    monkeypatch.setattr(chain.fake, "program", slow)
    try:
        answer = direct_program_of(chain, IMAGE)
        assert writing.is_set()
        assert answer.status_code == 502 and "did not finish" in answer.text, answer.text
        arq = request_bind(chain, {})
        BindWorker(chain.conf, chain.db).run_once()
        refused = show(chain, arq)
    finally:
        done.set()
    assert refused["state"] == "BindFailed"
    assert "being programmed" in refused["bind_failure_reason"]
