"""A SIGHUP that arrives while a service is still starting (before its main loop runs)
neither ends the process nor is lost: it is handled once the service runs."""

from __future__ import annotations

import os
import signal
import threading

from acceld.runtime import lifecycle
from tests.conftest import make_conf


def test_a_sighup_during_start_is_handled_once_the_service_runs(tmp_path, monkeypatch):
    conf = make_conf(str(tmp_path))
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    reloaded: list[object] = []
    done = threading.Event()

    def fake_reload(c) -> None:  # type: ignore[no-untyped-def]
        reloaded.append(c)
        done.set()

    monkeypatch.setattr(lifecycle, "reload", fake_reload)
    try:
        lifecycle.catch_hup_early()  # what each service's run() does first
        os.kill(os.getpid(), signal.SIGHUP)  # logrotate, while the service starts
        stop = threading.Event()
        threading.Thread(target=lambda: done.wait(10) and stop.set(), daemon=True).start()
        lifecycle.run_until_signalled(stop, lambda: None, poll=0.05, conf=conf)
        assert reloaded == [conf]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
