"""The agent's fence store and the fenced steps (issue 24 item 2), and version skew.

Decided and tested here: an **equal** token is accepted (the same claim sending its call
again after a lost answer; the steps are idempotent), an older one is refused with 409
``Fenced: ...`` before the driver is asked anything, the lowest accepted token survives a
restart of the agent, and a call without a token (a conductor from before fencing) is not
fenced. A conductor calling an agent from before fencing sends the call again without the
tokens, once, and remembers that host.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

import pytest

from acceld.agent import fences as fences_mod
from acceld.agent.attach import AttachFailed, AttachSteps
from acceld.agent.fences import Fenced, FenceStore, FenceStoreError
from acceld.agent.programming import Programming, ProgramFailed
from acceld.clients.agent import AgentCallError
from acceld.conductor import fencing
from acceld.drivers.fake import FakeDriver
from tests.conftest import make_conf

HANDLE = str(uuid.uuid4())
DEPLOYABLE = str(uuid.uuid4())


def test_older_refused_equal_and_newer_accepted(tmp_path):
    store = FenceStore(str(tmp_path / "fences"))
    assert store.lowest("handle:x") == 0
    store.admit("handle:x", 5, "The release")
    store.admit("handle:x", 5, "The release")  # the same claim's retry
    with pytest.raises(Fenced) as refused:
        store.admit("handle:x", 4, "The release of x")
    assert str(refused.value).startswith("Fenced: The release of x was sent with fencing "
                                         "token 4, older than 5")
    store.admit("handle:x", 9, "The release")
    assert store.lowest("handle:x") == 9
    assert store.lowest("handle:y") == 0  # keys are independent


def test_the_lowest_token_survives_a_restart(tmp_path):
    FenceStore(str(tmp_path / "f")).admit("deployable:d", 7, "The program")
    restarted = FenceStore(str(tmp_path / "f"))
    with pytest.raises(Fenced):
        restarted.admit("deployable:d", 6, "The program")
    restarted.admit("deployable:d", 7, "The program")
    [name] = os.listdir(tmp_path / "f")  # one file per key, no temporary left behind
    assert name.endswith(".json")


def test_raise_to_never_lowers(tmp_path):
    store = FenceStore(str(tmp_path))
    store.raise_to("deployable:d", 4)
    store.raise_to("deployable:d", 2)
    assert store.lowest("deployable:d") == 4
    with pytest.raises(Fenced):
        store.admit("deployable:d", 3, "The program")


def test_an_unreadable_record_fails_closed(tmp_path):
    store = FenceStore(str(tmp_path))
    store.admit("handle:x", 1, "The release")
    [name] = os.listdir(tmp_path)
    (tmp_path / name).write_bytes(b"{not json")
    with pytest.raises(FenceStoreError, match="unreadable"):
        store.admit("handle:x", 2, "The release")


def test_a_failed_write_admits_nothing(tmp_path, monkeypatch):
    store = FenceStore(str(tmp_path))

    def no_space(*args):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fences_mod.os, "fsync", no_space)
    with pytest.raises(FenceStoreError, match="could not record"):
        store.admit("handle:x", 3, "The release")
    monkeypatch.undo()
    assert store.lowest("handle:x") == 0 and os.listdir(tmp_path) == []


def test_concurrent_admits_never_lower_the_record(tmp_path, monkeypatch):
    """Many threads, shuffled tokens, two store instances on one directory: each write is
    larger than the one before (check and write are one step per key), the last is the
    largest token, and exactly the tokens larger than all admitted before were accepted."""
    stores = [FenceStore(str(tmp_path)), FenceStore(str(tmp_path))]
    written: list[int] = []
    real_write = FenceStore._write

    def recorded(self, key, lowest):  # type: ignore[no-untyped-def]
        written.append(lowest)
        real_write(self, key, lowest)

    monkeypatch.setattr(FenceStore, "_write", recorded)
    tokens = [(i * 37) % 101 + 1 for i in range(101)]  # 1..101, shuffled
    start = threading.Barrier(8)
    refused: list[int] = []

    def work(part: list[int], store: FenceStore) -> None:
        start.wait()
        for token in part:
            try:
                store.admit("handle:x", token, "The release")
            except Fenced:
                refused.append(token)

    threads = [threading.Thread(target=work, args=(tokens[i::8], stores[i % 2]))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert written == sorted(set(written)) and written[-1] == 101
    assert stores[0].lowest("handle:x") == 101
    assert len(written) + len(refused) == len(tokens)


class Steps:
    """The agent's attach steps over the fake driver's simulated mdevs, with a fence store."""

    def __init__(self, tmp_path) -> None:  # type: ignore[no-untyped-def]
        spec = tmp_path / "spec.json"
        spec.write_text('[{"type": "FPGA", "attach_type": "MDEV", "attach_handles": 1}]')
        self.conf = make_conf(str(tmp_path), fake_driver__spec_file=str(spec))
        self.fake = FakeDriver(self.conf, "node-a")
        [record] = self.fake.discover()
        self.handle = record.deployables[0].attach_handles[0]
        self.directory = str(tmp_path / "fences")

    def steps(self) -> AttachSteps:  # a new agent process each time: nothing in memory
        return AttachSteps({"fake": self.fake}.get, "node-a", fences=FenceStore(self.directory))

    def body(self, **fence) -> dict:  # type: ignore[no-untyped-def]
        return {"driver_name": "fake", "deployable_name": "FakeDevice",
                "attach_type": self.handle.attach_type,
                "attach_info": dict(self.handle.attach_info), **fence}

    def log(self) -> list:
        return self.fake.attach_state().get("log", [])


def test_agent_refuses_an_older_handle_token_before_the_driver(tmp_path, caplog):
    node = Steps(tmp_path)
    node.steps().run("prepare", node.body(handle_uuid=HANDLE, fence_token=3))
    done = len(node.log())
    with caplog.at_level(logging.WARNING, logger="acceld.agent.attach"):
        with pytest.raises(AttachFailed) as refused:
            node.steps().run("release", node.body(handle_uuid=HANDLE, fence_token=2))
    assert refused.value.status == 409 and refused.value.message.startswith("Fenced:")
    assert len(node.log()) == done and node.fake.attach_state()["prepared"]  # untouched
    assert len([r for r in caplog.records if "Fenced:" in r.getMessage()]) == 1
    node.steps().run("release", node.body(handle_uuid=HANDLE, fence_token=3))  # equal: ok
    assert node.fake.attach_state()["prepared"] == {}


def test_a_prepare_raises_the_deployables_floor(tmp_path):
    """A bind that read the deployable's token m: programs with a token up to m are over."""
    node = Steps(tmp_path)
    bitstreams = tmp_path / "bitstreams"
    bitstreams.mkdir()
    image = str(uuid.uuid4())
    (bitstreams / image).write_bytes(b"bits" * 16)
    node.conf.set_override("bitstream_dir", str(bitstreams), group="agent")
    node.steps().run("prepare", node.body(handle_uuid=HANDLE, fence_token=1,
                                          deployable_uuid=DEPLOYABLE, deployable_fence=4))
    programming = Programming(node.conf, {"fake": node.fake}.get,
                              fences=FenceStore(node.directory))
    program = {"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": image,
               "deployable_uuid": DEPLOYABLE}
    with pytest.raises(ProgramFailed) as refused:
        programming.program({**program, "fence_token": 4})
    assert refused.value.status == 409 and node.fake.programmed("FakeDevice") == {}
    assert programming.program({**program, "fence_token": 5})["image_id"] == image


def test_calls_without_a_token_are_not_fenced_on_a_handle_never_fenced(tmp_path):
    """A conductor from before fencing (rolling upgrade): accepted, as before, as long as
    no call with a token reached this handle."""
    node = Steps(tmp_path)
    node.steps().run("prepare", node.body())
    assert node.steps().run("release", node.body()) == {"released": True}


def test_a_call_without_a_token_is_refused_on_a_handle_already_fenced(tmp_path):
    """Issue 37 item 10: once a call with a token reached a handle, a token-less call for it
    (a conductor from before fencing, stalled or not yet stopped) is refused before the
    driver, even after the agent restarts: it cannot be ordered after the fenced claims."""
    node = Steps(tmp_path)
    node.steps().run("prepare", node.body(handle_uuid=HANDLE, fence_token=9))
    done = len(node.log())
    with pytest.raises(AttachFailed) as refused:
        node.steps().run("release", node.body())
    assert refused.value.status == 409 and refused.value.message.startswith("Fenced:")
    assert "without a fencing token" in refused.value.message
    assert len(node.log()) == done and node.fake.attach_state()["prepared"]  # untouched


def test_a_program_without_a_token_is_refused_on_a_fenced_deployable(tmp_path):
    node = Steps(tmp_path)
    bitstreams = tmp_path / "bitstreams"
    bitstreams.mkdir()
    image = str(uuid.uuid4())
    (bitstreams / image).write_bytes(b"bits" * 16)
    node.conf.set_override("bitstream_dir", str(bitstreams), group="agent")
    programming = Programming(node.conf, {"fake": node.fake}.get,
                              fences=FenceStore(node.directory))
    program = {"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": image}
    assert programming.program(program)["image_id"] == image  # never fenced: as before
    programming.program({**program, "deployable_uuid": DEPLOYABLE, "fence_token": 3})
    written = node.fake.programmed("FakeDevice")
    with pytest.raises(ProgramFailed) as refused:
        Programming(node.conf, {"fake": node.fake}.get,
                    fences=FenceStore(node.directory)).program(program)
    assert refused.value.status == 409 and refused.value.message.startswith("Fenced:")
    assert node.fake.programmed("FakeDevice") == written


def test_a_prepare_fences_token_less_programs_of_its_deployable(tmp_path):
    node = Steps(tmp_path)
    bitstreams = tmp_path / "bitstreams"
    bitstreams.mkdir()
    image = str(uuid.uuid4())
    (bitstreams / image).write_bytes(b"bits" * 16)
    node.conf.set_override("bitstream_dir", str(bitstreams), group="agent")
    node.steps().run("prepare", node.body(handle_uuid=HANDLE, fence_token=1,
                                          deployable_uuid=DEPLOYABLE, deployable_fence=0))
    with pytest.raises(ProgramFailed) as refused:
        Programming(node.conf, {"fake": node.fake}.get, fences=FenceStore(
            node.directory)).program({"driver_name": "fake", "deployable_name": "FakeDevice",
                                      "image_id": image})
    assert refused.value.status == 409 and node.fake.programmed("FakeDevice") == {}


def test_a_conductor_that_took_an_agent_for_old_resends_with_tokens_when_fenced(caplog):
    """The skew memory is stale (the agent was upgraded): the agent refuses the token-less
    call for a fenced key; the conductor forgets the host and sends the call with its tokens
    at once."""
    memory = fencing.SkewMemory()
    memory.remember("node-a")
    sent: list[dict] = []

    def upgraded(body):  # type: ignore[no-untyped-def]
        sent.append(body)
        if "fence_token" not in body:
            raise AgentCallError(409, "Fenced: The release of attach handle x was sent "
                                      "without a fencing token.")
        return {"released": True}

    fence = {"handle_uuid": HANDLE, "fence_token": 2}
    assert fencing.post_fenced(upgraded, "node-a", {"driver_name": "fake"}, fence,
                               memory) == {"released": True}
    assert sent == [{"driver_name": "fake"}, {"driver_name": "fake", **fence}]
    assert not memory.old("node-a")


def test_a_hello_of_an_agent_that_fences_ends_the_skew_memory():
    """Issue 37 item 10: a conductor that met a pre-fencing agent re-probes at the next
    hello that speaks a version from fencing on (1.1), or another version than before (an
    upgraded or restarted agent), instead of calling that host token-less for 600 s."""
    memory = fencing.SkewMemory()
    memory.heard("node-old", (1, 0))
    memory.remember("node-old")
    memory.heard("node-old", (1, 0))  # the same old agent's heartbeat: still old
    assert memory.old("node-old")
    memory.heard("node-old", (1, 1))
    assert not memory.old("node-old")
    memory.remember("node-b")
    memory.heard("node-b", (1, 0))  # first hello heard from it since: a version change
    assert not memory.old("node-b")


@pytest.mark.parametrize("fence, words", [
    ({"fence_token": 1}, "go together"),
    ({"handle_uuid": HANDLE, "fence_token": -1}, "go together"),
    ({"handle_uuid": HANDLE, "fence_token": True}, "go together"),
    ({"handle_uuid": "not-a-uuid", "fence_token": 1}, "go together"),
    ({"handle_uuid": HANDLE, "fence_token": 1, "deployable_fence": 2}, "on a prepare only"),
])
def test_malformed_tokens_are_400(tmp_path, fence, words):
    node = Steps(tmp_path)
    with pytest.raises(AttachFailed) as refused:
        node.steps().run("release", node.body(**fence))
    assert refused.value.status == 400 and words in refused.value.message


def test_a_conductor_resends_without_tokens_to_an_agent_from_before_fencing(caplog):
    """An older agent refuses unknown keys (400) before doing anything: sent again without
    the tokens, logged once, and later calls to that host go without them."""
    sent: list[dict] = []

    def old_agent(body):  # type: ignore[no-untyped-def]
        sent.append(body)
        unknown = sorted(set(body) - {"driver_name", "attach_info"})
        if unknown:
            raise AgentCallError(400, f"Unknown keys: {', '.join(unknown)}.")
        return {"released": True}

    memory = fencing.SkewMemory()
    fence = {"handle_uuid": HANDLE, "fence_token": 2}
    with caplog.at_level(logging.WARNING, logger="acceld.conductor.fencing"):
        for _ in range(2):
            assert fencing.post_fenced(old_agent, "node-old", {"driver_name": "fake"}, fence,
                                       memory) == {"released": True}
    assert sent == [{"driver_name": "fake", **fence}, {"driver_name": "fake"},
                    {"driver_name": "fake"}]
    assert len([r for r in caplog.records if "predates fencing" in r.getMessage()]) == 1


def test_other_refusals_are_not_resent():
    memory = fencing.SkewMemory()
    calls: list[dict] = []

    def refusing(body):  # type: ignore[no-untyped-def]
        calls.append(body)
        raise AgentCallError(400, "attach_info must be a non-empty object of strings.")

    with pytest.raises(AgentCallError):
        fencing.post_fenced(refusing, "node-a", {}, {"fence_token": 1}, memory)
    assert len(calls) == 1 and not memory.old("node-a")


def test_the_skew_memory_forgets_after_a_while():
    now = [0.0]
    memory = fencing.SkewMemory(clock=lambda: now[0])
    assert memory.remember("node-old") and not memory.remember("node-old")
    assert memory.old("node-old")
    now[0] = fencing.SKEW_MEMORY + 1
    assert not memory.old("node-old")  # tried with tokens again (the agent may be upgraded)


@pytest.mark.parametrize("body, words", [
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "deployable_uuid": DEPLOYABLE},
     "are required"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "deployable_uuid": "x",
      "deployable_fence": 1}, "are required"),
    ({"driver_name": "", "deployable_name": "FakeDevice", "deployable_uuid": DEPLOYABLE,
      "deployable_fence": 1}, "are required"),
    ({"driver_name": "fake", "deployable_name": "FakeDevice", "deployable_uuid": DEPLOYABLE,
      "deployable_fence": 1, "extra": 1}, "Unknown keys: extra"),
    ([], "JSON object"),
])
def test_a_malformed_fence_is_400_and_fences_nothing(tmp_path, body, words):
    node = Steps(tmp_path)
    programming = Programming(node.conf, {"fake": node.fake}.get,
                              fences=FenceStore(node.directory))
    with pytest.raises(ProgramFailed) as refused:
        programming.fence(body)
    assert refused.value.status == 400 and words in refused.value.message
    assert not os.path.exists(node.directory) or os.listdir(node.directory) == []


def test_a_fence_refuses_the_programs_up_to_the_binds_token(tmp_path):
    node = Steps(tmp_path)
    bitstreams = tmp_path / "bitstreams"
    bitstreams.mkdir()
    image = str(uuid.uuid4())
    (bitstreams / image).write_bytes(b"bits" * 16)
    node.conf.set_override("bitstream_dir", str(bitstreams), group="agent")
    programming = Programming(node.conf, {"fake": node.fake}.get,
                              fences=FenceStore(node.directory))
    assert programming.fence({"driver_name": "fake", "deployable_name": "FakeDevice",
                              "deployable_uuid": DEPLOYABLE, "deployable_fence": 4}) == {
        "fenced": True, "by_device": True}
    program = {"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": image,
               "deployable_uuid": DEPLOYABLE}
    with pytest.raises(ProgramFailed) as refused:
        programming.program({**program, "fence_token": 4})
    assert refused.value.status == 409 and node.fake.programmed("FakeDevice") == {}
    with pytest.raises(ProgramFailed):  # nor without a token, now that it is fenced
        programming.program({k: v for k, v in program.items() if k != "deployable_uuid"})
    assert programming.program({**program, "fence_token": 5})["image_id"] == image


def _programming_with_image(tmp_path) -> tuple["Steps", Programming, str]:
    node = Steps(tmp_path)
    bitstreams = tmp_path / "bitstreams"
    bitstreams.mkdir()
    image = str(uuid.uuid4())
    (bitstreams / image).write_bytes(b"bits" * 16)
    node.conf.set_override("bitstream_dir", str(bitstreams), group="agent")
    return node, Programming(node.conf, {"fake": node.fake}.get,
                             fences=FenceStore(node.directory)), image


@pytest.mark.parametrize("by", ["fence", "prepare", "program"])
def test_a_program_of_an_earlier_row_of_the_device_is_refused(tmp_path, by):
    """Issue 37 item 8 (a re-registered deployable): the device as this agent names it is a
    key of its own. A bind's fence, an mdev prepare or a program of a NEW row (another uuid,
    a larger token) of the same device refuses a program of the earlier row with a token
    below, although that row's own key was never raised."""
    node, programming, image = _programming_with_image(tmp_path)
    old, new = DEPLOYABLE, str(uuid.uuid4())
    program = {"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": image}
    assert programming.program({**program, "deployable_uuid": old, "fence_token": 5})
    written = node.fake.programmed("FakeDevice")
    if by == "fence":
        programming.fence({"driver_name": "fake", "deployable_name": "FakeDevice",
                           "deployable_uuid": new, "deployable_fence": 100})
    elif by == "prepare":
        node.steps().run("prepare", node.body(handle_uuid=HANDLE, fence_token=1,
                                              deployable_uuid=new, deployable_fence=100))
    else:
        programming.program({**program, "deployable_uuid": new, "fence_token": 101})
        written = node.fake.programmed("FakeDevice")
    other = str(uuid.uuid4())  # the stale program's image: a write would change the digest
    (tmp_path / "bitstreams" / other).write_bytes(b"other bits" * 16)
    with pytest.raises(ProgramFailed) as refused:
        programming.program({**program, "image_id": other, "deployable_uuid": old,
                             "fence_token": 6})
    assert refused.value.status == 409 and "lowest this agent still accepts" in \
        refused.value.message and fences_mod.floor_in(refused.value.message) == 101
    assert node.fake.programmed("FakeDevice") == written
    assert programming.program({**program, "deployable_uuid": new, "fence_token": 101})


def test_a_refused_program_raises_no_floor(tmp_path):
    """A program refused by one key leaves every key as it was (checked before written)."""
    node, programming, image = _programming_with_image(tmp_path)
    store = FenceStore(node.directory)
    program = {"driver_name": "fake", "deployable_name": "FakeDevice", "image_id": image}
    programming.fence({"driver_name": "fake", "deployable_name": "FakeDevice",
                       "deployable_uuid": DEPLOYABLE, "deployable_fence": 9})
    before = sorted(os.listdir(node.directory))
    other = str(uuid.uuid4())
    with pytest.raises(ProgramFailed):
        programming.program({**program, "deployable_uuid": other, "fence_token": 7})
    assert sorted(os.listdir(node.directory)) == before
    assert store.lowest(fences_mod.deployable_key(other)) == 0
