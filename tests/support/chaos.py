"""Support for the chaos test: acceld services as real processes, stopped and killed by PID.

:class:`AcceldProcess` runs one ``acceld conductor`` or ``acceld agent`` with its log in a
file; it can be killed with SIGKILL (a crash), frozen with SIGSTOP and thawed, and stopped
gracefully. :func:`kill_holding_claims` kills a conductor at a point that is decided, not
hoped for: frozen while it holds bind claims and no Nova event of its own is in flight.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import select

from acceld.db.engine import Database
from acceld.db.models import bind_jobs, deployables, handle_releases


class AcceldProcess:
    """One acceld service process (its own session), its output in ``<dir>/<name>.log``."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, port: int, *,
                 env: dict[str, str] | None = None, cwd: Path | None = None,
                 module: str = "acceld.cmd.main") -> None:
        self.name = name
        # ``module``: the command line's module in the release run (the skew test's earlier
        # release has it at acceld.cli).
        self.argv = [sys.executable, "-m", module, *argv]
        self.log_path = Path(log_dir) / f"{name}.log"
        self.port = port
        self.env = env  # None: this process's; the skew test runs an earlier release
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def start(self, timeout: float = 45.0) -> "AcceldProcess":
        """Start it and return once its internal port accepts connections."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> "AcceldProcess":
        """Start it without waiting (start several, then :meth:`wait_ready` each)."""
        with open(self.log_path, "ab") as log:
            log.write(f"==== start {time.strftime('%H:%M:%S')} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log,
                                         start_new_session=True, env=self.env, cwd=self.cwd)
        return self

    def wait_ready(self, timeout: float = 45.0) -> "AcceldProcess":
        """Return once its internal port accepts connections; AssertionError with its log
        if it exits or does not within ``timeout`` s."""
        assert self.proc is not None, f"{self.name} was never launched"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"{self.name} did not start within {timeout} s:\n{self.log()}")

    def kill9(self) -> None:
        """SIGKILL: no cleanup runs, leases and claims are left as they were."""
        os.kill(self.pid, signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def freeze(self, timeout: float = 5.0) -> None:
        """SIGSTOP, returning once every thread of it is stopped (Linux /proc): a thread
        running on another CPU goes on for a moment after the signal is sent."""
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not _all_threads_stopped(self.pid):
            assert time.monotonic() < deadline, f"{self.name} did not stop"
            time.sleep(0.001)

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; nothing if it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGCONT)  # a frozen process cannot act on SIGTERM
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _all_threads_stopped(pid: int) -> bool:
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        if stat.rsplit(")", 1)[1].split()[0] not in ("T", "t"):
            return False
    return True


def write_conf(path: Path, sections: dict[str, dict[str, object]]) -> str:
    """An oslo.config file from ``{section: {option: value}}``; returns its path."""
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {value}" for key, value in values.items()]
        lines.append("")
    Path(path).write_text("\n".join(lines))
    return str(path)


def wait_until(check: Callable[[], Any], timeout: float, what: str,
               explain: Callable[[], str] = lambda: "") -> Any:
    """Poll ``check`` every 0.1 s until it returns something true (returned) or raises
    nothing; AssertionError naming ``what`` and the last result after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except AssertionError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: "
                                 f"{last!r}\n{explain()}")
        time.sleep(0.1)


def claims_of(db: Database, pid: int) -> dict[str, int]:
    """What a conductor process holds: bind jobs by phase (``pending``, ``notify``) and
    handle releases (``release``).

    The lease tokens of its bind and release workers start with ``<hostname[:30]>-<pid>-``
    (acceld.conductor.binding.worker.BindWorker.owner, acceld.conductor.binding.handle_release).
    """
    prefix = f"{socket.gethostname()[:30]}-{pid}-%"
    with db.read() as conn:
        phases = conn.execute(select(bind_jobs.c.phase).where(
            bind_jobs.c.lease_owner.like(prefix))).scalars().all()
        releases = conn.execute(select(handle_releases.c.id).where(
            handle_releases.c.lease_owner.like(prefix))).scalars().all()
    counts: dict[str, int] = {"release": len(releases)} if releases else {}
    for phase in phases:
        counts[phase] = counts.get(phase, 0) + 1
    return counts


def kill_holding_claims(conductor: AcceldProcess, db: Database, timeout: float) -> int:
    """SIGKILL ``conductor`` while it holds pending bind claims and nothing else.

    The conductor is frozen (SIGSTOP) and its claims read: a claim in phase ``notify``
    may have an event already taken by Nova, and killing then would make Nova hear that
    ARQ twice (delivery is at least once, docs/arqs.md); a handle release it holds would
    keep its handle in use until that claim's long lease lapses (attach_timeout times the
    batch). So it is killed only when it holds pending binds and neither of those;
    otherwise it is thawed and looked at again. Returns how many pending claims died
    with it.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conductor.freeze()
        claims = claims_of(db, conductor.pid)
        if claims.get("pending") and not claims.get("notify") and not claims.get("release"):
            conductor.kill9()
            return claims["pending"]
        conductor.thaw()
        time.sleep(0.01)
    raise AssertionError(f"{conductor.name} never held bind claims without a notification "
                         f"within {timeout} s:\n{conductor.log()}")


def freeze_holding_claims(conductor: AcceldProcess, db: Database, timeout: float
                          ) -> dict[str, int]:
    """SIGSTOP ``conductor`` while it holds pending bind claims, handle releases or a
    programming mark (what fencing protects), and no bind claim in phase ``notify``
    (delivery of a Nova event is at least once: a conductor frozen between Nova's receipt
    and the job's deletion would have its event sent twice, docs/arqs.md). Looked at while
    frozen, thawed and looked at again until ``timeout``; after that it is left frozen at a
    moment without ``notify`` claims, whatever it holds. Returns what it held (a count per
    kind, ``mark`` for programming marks), the conductor frozen."""
    deadline = time.monotonic() + timeout
    while True:
        conductor.freeze()
        claims = claims_of(db, conductor.pid)
        with db.read() as conn:
            marks = len(conn.execute(select(deployables.c.id).where(
                deployables.c.programming_owner.is_not(None))).all())
        if marks:
            claims["mark"] = marks
        if not claims.get("notify") and (
                claims.get("pending") or claims.get("release") or marks
                or time.monotonic() >= deadline):
            return claims
        conductor.thaw()
        time.sleep(0.01)


class HttpResult:
    """What a falcon TestClient's simulate_* returns, for an answer over HTTP."""

    def __init__(self, resp: Any) -> None:
        self.status_code = resp.status_code
        self.text = resp.text
        self.headers = resp.headers
        self.json = resp.json() if resp.content else None


class HttpApi:
    """An ``acceld api`` process, called like the in-process falcon TestClient (so that a
    test can send the same calls to either of two API replicas)."""

    def __init__(self, url: str) -> None:
        import requests

        self.url = url.rstrip("/")
        self._session = requests.Session()

    def _call(self, method: str, path: str, **kwargs: Any) -> HttpResult:
        return HttpResult(self._session.request(method, self.url + path, timeout=30,
                                                **kwargs))

    def simulate_get(self, path: str, **kwargs: Any) -> HttpResult:
        return self._call("GET", path, **kwargs)

    def simulate_post(self, path: str, **kwargs: Any) -> HttpResult:
        return self._call("POST", path, **kwargs)

    def simulate_patch(self, path: str, **kwargs: Any) -> HttpResult:
        return self._call("PATCH", path, **kwargs)

    def simulate_delete(self, path: str, **kwargs: Any) -> HttpResult:
        return self._call("DELETE", path, **kwargs)

    def close(self) -> None:
        self._session.close()
