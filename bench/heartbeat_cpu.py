"""Conductor CPU per unchanged heartbeat, in process (issue 15's 0.3 ms goal).

A real conductor (agents component, its internal app with credential check, replay
guard, JSON and hello) and a real agent (no drivers) in this process; after the host
is registered, ``--calls`` unchanged hellos signed with the agent's key are handed to
the conductor's WSGI app one after another (no HTTP, no client work in the timing:
every request is signed and built before the clock starts). The figure is this
process's CPU (every thread: the heartbeat flush and the nonce writes included; the
database server's own CPU not) divided by the calls.

The hellos are signed as acceld's conductor client signs them: for the name the
conductor announced in ``X-Acceld-Destination`` when it has one, else for the
conductors' shared name. Run the same script against another checkout to compare:

    PYTHONPATH=<checkout> .venv/bin/python bench/heartbeat_cpu.py --db sqlite
    PYTHONPATH=<checkout> .venv/bin/python bench/heartbeat_cpu.py \\
        --db postgresql+psycopg://postgres@127.0.0.1:5432/<an empty database>
"""

from __future__ import annotations

import argparse
import io
import shutil
import tempfile
import time

import orjson
from falcon import testing
from oslo_config import cfg


def _conf(state_path: str):  # type: ignore[no-untyped-def]
    from acceld import config

    conf = cfg.ConfigOpts()
    config.load(conf=conf)
    overrides = {("DEFAULT", "state_path"): state_path, ("conductor", "port"): 0,
                 ("agent", "port"): 0, ("agent", "heartbeat_interval"): 3600,
                 ("agent", "discovery_interval"): 3600, ("agent", "enabled_drivers"): []}
    for (group, name), value in overrides.items():
        conf.set_override(name, value, group=None if group == "DEFAULT" else group)
    return conf


def run(db_url: str, calls: int) -> dict:
    import acceld
    from acceld.agent.service import Agent
    from acceld.conductor.fleet.agents import AgentsComponent
    from acceld.conductor.service import Conductor
    from acceld.db import migrate
    from acceld.db.engine import Database
    from acceld.internal import auth
    from acceld.runtime.secrets import ensure_secret_file

    state = tempfile.mkdtemp(prefix="hb-cpu-")
    url = f"sqlite:///{state}/acceld.sqlite" if db_url == "sqlite" else db_url
    db = Database(url)
    migrate.upgrade(db)
    conf = _conf(state)
    ensure_secret_file(state)
    conductor = Conductor(conf, db, [AgentsComponent(conf, db)], instance_id="bench")
    conductor.start()
    conf.set_override("url", [conductor.server.url], group="conductor")
    agent = Agent(conf, hostname="node-a", drivers=[]).start()
    app = conductor.server._server.app
    try:
        def environ(destination: str) -> dict:
            body = orjson.dumps(agent.hello_body())
            headers = agent.signer.headers("POST", "/hello", body, destination=destination)[0]
            headers["Content-Type"] = "application/json"
            env = testing.create_environ(method="POST", path="/hello", headers=headers)
            env["CONTENT_LENGTH"] = str(len(body))
            env["wsgi.input"] = io.BytesIO(body)
            return env

        def call(env: dict) -> tuple[str, dict]:
            seen: dict = {}

            def start_response(status, headers, exc_info=None):  # type: ignore[no-untyped-def]
                seen.update(status=status, headers={k.lower(): v for k, v in headers})

            b"".join(app(env, start_response))
            return seen["status"], seen["headers"]

        status, headers = call(environ(auth.CONDUCTOR))  # registers the host (full hello)
        assert status.startswith("200"), status
        announced = headers.get("x-acceld-destination")  # none before the change
        destination = announced if announced else auth.CONDUCTOR
        for env in [environ(destination) for _ in range(200)]:  # warm up
            assert call(env)[0].startswith("200")
        time.sleep(1.5)  # the agent's own first hello and the pull it caused have ended
        prepared = [environ(destination) for _ in range(calls)]
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        for env in prepared:
            status, _ = call(env)
            assert status.startswith("200"), status
        cpu = time.process_time() - started_cpu
        wall = time.perf_counter() - started_wall
        return {"tree": acceld.__file__.rsplit("/acceld/", 1)[0], "backend": db.backend,
                "signed_for": "own name" if announced else "shared name",
                "calls": calls, "cpu_ms_per_call": round(cpu / calls * 1000, 3),
                "wall_ms_per_call": round(wall / calls * 1000, 3)}
    finally:
        agent.stop()
        conductor.stop()
        db.dispose()
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", default="sqlite",
                        help="sqlite (a temporary file) or a SQLAlchemy URL of an empty "
                             "database (it is migrated; drop it afterwards)")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    print(orjson.dumps(run(args.db, args.calls)).decode())


if __name__ == "__main__":
    main()
