"""Background loops of the node services outlive one failing pass.

A heartbeat thread that died on an unexpected exception (a peer answering 200
with a body that is not JSON, a body builder that raised) would leave the node
marked down for good; a discovery loop that died would never rescan again.
"""

from __future__ import annotations

import threading
import time

import falcon

from acceld.agent.hardware import HelloLoop
from acceld.internal.server import serve
from acceld.runtime.lifecycle import repeat_until_stopped
from tests.conftest import make_conf

SECRET = b"loop-test-secret"


def _wait_for(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_hello_loop_survives_a_non_json_answer(tmp_path) -> None:
    conf = make_conf(str(tmp_path), agent__heartbeat_interval=1)
    answers = {"n": 0}

    def on_hello(req: falcon.Request, resp: falcon.Response) -> None:
        answers["n"] += 1
        resp.status = 200
        # First answer: 200 with a body that is not JSON (a proxy's page, a bug).
        resp.data = b"<html>oops</html>" if answers["n"] == 1 else b'{"status": "OK"}'

    server = serve(conf, SECRET, {"/hello": {"POST": on_hello}}, "127.0.0.1", 0,
                   destination="peer")
    loop = HelloLoop.to_peer(conf, SECRET, server.url, lambda: {"status": "READY"}, "peer",
                             "peer")
    loop.interval = 0.05
    try:
        loop.start()
        assert _wait_for(lambda: loop.beats >= 2), "the hello loop died on a bad answer"
        assert answers["n"] >= 3
    finally:
        loop.stop()
        server.stop()


def test_repeat_until_stopped_survives_a_failing_pass() -> None:
    stop = threading.Event()
    calls = {"n": 0}

    def action() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("one bad pass")

    thread = repeat_until_stopped(stop, lambda: 0.01, action, "test-loop")
    try:
        assert _wait_for(lambda: calls["n"] >= 3), "the loop died after one failing pass"
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=5)
