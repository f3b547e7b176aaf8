"""A bind's deployable token at the column's end does not poison the agent's fence store.

A bind's fence (``POST /deployables/fence``, or a prepare's ``deployable_fence``) raises the
deployable's floor to the token + 1. The token was accepted up to 2^63-1, so the largest one
was stored as 2^63, which the store then reads as malformed: every later program or fence
of the deployable failed closed (502) until someone repaired the file by hand. A token the
store cannot raise past is bad input: 400, nothing changed.
"""

from __future__ import annotations

import os
import uuid

import pytest

from acceld.agent.attach import AttachFailed
from acceld.agent.fences import MAX_TOKEN, FenceStore
from acceld.agent.programming import Programming, ProgramFailed
from tests.unit.test_agent_fences import DEPLOYABLE, HANDLE, Steps


def test_a_fence_at_the_columns_end_is_400_and_changes_nothing(tmp_path):
    node = Steps(tmp_path)
    programming = Programming(node.conf, {"fake": node.fake}.get,
                              fences=FenceStore(node.directory))
    with pytest.raises(ProgramFailed) as refused:
        programming.fence({"driver_name": "fake", "deployable_name": "FakeDevice",
                           "deployable_uuid": DEPLOYABLE, "deployable_fence": MAX_TOKEN})
    assert refused.value.status == 400 and "deployable_fence" in refused.value.message
    assert not os.path.exists(node.directory) or os.listdir(node.directory) == []
    assert programming.fence({"driver_name": "fake", "deployable_name": "FakeDevice",
                              "deployable_uuid": DEPLOYABLE,
                              "deployable_fence": MAX_TOKEN - 1}) == {"fenced": True,
                                                                      "by_device": True}
    assert FenceStore(node.directory).lowest(f"deployable:{DEPLOYABLE}") == MAX_TOKEN
    assert FenceStore(node.directory).lowest("local:program:fake/FakeDevice") == MAX_TOKEN


def test_a_prepare_with_a_deployable_token_at_the_columns_end_is_400(tmp_path):
    node = Steps(tmp_path)
    with pytest.raises(AttachFailed) as refused:
        node.steps().run("prepare", node.body(handle_uuid=HANDLE, fence_token=1,
                                              deployable_uuid=DEPLOYABLE,
                                              deployable_fence=MAX_TOKEN))
    assert refused.value.status == 400 and "deployable_fence" in refused.value.message
    assert not node.fake.attach_state().get("prepared")
    assert not os.path.exists(node.directory) or os.listdir(node.directory) == []
    other = str(uuid.uuid4())
    node.steps().run("prepare", node.body(handle_uuid=other, fence_token=1,
                                          deployable_uuid=DEPLOYABLE, deployable_fence=1))
