"""Fixtures for integration tests: real services on loopback, shared per test session."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.placement import PlacementServer


@pytest.fixture(scope="session")
def placement(tmp_path_factory) -> Iterator[PlacementServer]:
    """A real Placement (openstack-placement 16.0.0, noauth2, SQLite), started once per session.

    Tests share it: each one uses its own compute-node names (and so its own providers).
    """
    server = PlacementServer(tmp_path_factory.mktemp("placement")).start()
    yield server
    server.stop()
