"""acceld-status's Placement check against a real Placement (openstack-placement 16.0.0)."""

from __future__ import annotations

import pytest
from oslo_upgradecheck.upgradecheck import Code

from acceld.clients.placement import MICROVERSION
from acceld.cmd.placement_check import check_placement
from tests.conftest import make_conf

pytestmark = pytest.mark.integration


def test_real_placement_serves_what_acceld_needs(placement, tmp_path) -> None:
    conf = make_conf(str(tmp_path))
    placement.configure(conf)
    result = check_placement(conf)
    assert result.code == Code.SUCCESS, result.details
    assert result.details.endswith(f"(acceld needs {MICROVERSION}).")
