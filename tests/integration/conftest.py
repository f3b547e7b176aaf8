"""Fixtures for integration tests: real services on loopback, shared per test session."""

from __future__ import annotations

import uuid as uuidlib
from typing import Iterator

import pytest
from oslo_config import cfg

from tests.conftest import make_conf
from tests.support import keystone
from tests.support.placement import PlacementServer


@pytest.fixture(scope="session")
def placement(tmp_path_factory) -> Iterator[PlacementServer]:
    """A real Placement (openstack-placement 16.0.0, noauth2, SQLite), started once per session.

    Tests share it: each one uses its own compute-node names (and so its own providers).
    """
    server = PlacementServer(tmp_path_factory.mktemp("placement")).start()
    yield server
    server.stop()


@pytest.fixture
def pconf(tmp_path, placement: PlacementServer) -> cfg.ConfigOpts:
    """acceld's options, its state under the test's tmp_path, pointed at the shared
    Placement."""
    conf = make_conf(str(tmp_path))
    placement.configure(conf)
    return conf


@pytest.fixture
def tag() -> str:
    """A per-test suffix for resource classes, traits and host names on the shared
    Placement, so that other tests' providers never answer."""
    return uuidlib.uuid4().hex[:8].upper()


@pytest.fixture(scope="module")
def ks(tmp_path_factory) -> Iterator[keystone.Keystone]:
    """A real Keystone 30 (tests.support.keystone), one per test module that asks for it."""
    server = keystone.start(tmp_path_factory.mktemp("keystone"))
    yield server
    server.stop()
