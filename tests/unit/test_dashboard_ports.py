"""The all-in-one's dashboard line: the URL, and a word when browsers will refuse its port
(Chromium's list, checked against a real Chromium in tests/integration/test_observability.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from acceld import dashboard

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("port", [6665, 6666, 6667, 6668, 6669, 6000, 10080])
def test_a_refused_port_is_named(port):
    line = dashboard.announcement(f"http://127.0.0.1:{port}", port)
    assert line.startswith(f"acceld dashboard: http://127.0.0.1:{port}/dashboard (browsers "
                           f"refuse port {port}, ERR_UNSAFE_PORT: `acceld all --port 6680`")


def test_make_runs_ports_are_all_allowed():
    """`make run`'s PORT and the conductor and agent after it (acceld all --port P)."""
    (port,) = re.findall(r"^PORT \?= (\d+)$", (REPO / "Makefile").read_text(), re.M)
    assert int(port) == dashboard.BROWSER_PORT
    assert not {int(port), int(port) + 1, int(port) + 2} & dashboard.BROWSER_REFUSED_PORTS
    assert dashboard.announcement("http://127.0.0.1:6680", 6680) == (
        "acceld dashboard: http://127.0.0.1:6680/dashboard")
