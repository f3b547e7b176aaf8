"""A real Keystone (30.0.0) on 127.0.0.1 for tests, fast to start.

The first use on a machine installs Keystone into its own virtualenv
(``.keystone/venv``, git-ignored; ``make test`` does it up front) and
prepares a template: a migrated and bootstrapped SQLite database, fernet and
credential keys, and the personas (users, projects, role assignments, the
accelerator catalog entry). Each test session copies the template, points
its endpoints at fresh ports and starts Keystone in gunicorn: about 4 s.

Keystone runs in its own process (it reads oslo.config's global CONF and
sys.argv at import), through a small shim module that hides our argv.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import requests

from tests.support import api_process
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".keystone"
VENV = HOME / "venv"
VERSION = "30.0.0"
STAMP = VENV / f".installed-keystone-{VERSION}"
TEMPLATE = HOME / f"template-{VERSION}"
PASSWORD = "s3cret-ks-password"
REGION = "RegionOne"

# Scopes other than a project's, as PERSONAS spells them.
DOMAIN = "domain:default"
SYSTEM = "system:all"

# user -> (scope, role): a project name, DOMAIN or SYSTEM. Role implication adds the lower
# roles to each token.
PERSONAS: dict[str, tuple[str, str]] = {
    "admin": ("admin", "admin"),
    "demo-admin": ("demo", "admin"),
    "demo-manager": ("demo", "manager"),
    "demo-member": ("demo", "member"),
    "demo-reader": ("demo", "reader"),
    "demo2-member": ("demo2", "member"),
    "nova": ("service", "service"),
    "cyborg": ("service", "service"),
    "norole": ("service", "reader"),  # a valid user without the service role
    # A member of demo who also holds the service role on their own token.
    "demo-service": ("demo", "service"),
    "domain-admin": (DOMAIN, "admin"),
    "domain-member": (DOMAIN, "member"),
    "domain-reader": (DOMAIN, "reader"),
    "system-admin": (SYSTEM, "admin"),
    "system-reader": (SYSTEM, "reader"),
}
# Written into the template: a template made for other personas is made again.
LAYOUT = hashlib.sha256(json.dumps(sorted(PERSONAS.items())).encode()).hexdigest()[:16]
PROJECTS = ("demo", "demo2", "service")

SHIM = """\
import os, sys
_argv, sys.argv = sys.argv, sys.argv[:1]
try:
    from keystone.wsgi.api import application  # noqa: F401
finally:
    sys.argv = _argv
"""

CONF_TEMPLATE = """\
[DEFAULT]
log_file = {dir}/keystone.log
[database]
connection = sqlite:///{dir}/keystone.db
[token]
provider = fernet
[fernet_tokens]
key_repository = {dir}/fernet-keys
[fernet_receipts]
key_repository = {dir}/fernet-keys
[credential]
key_repository = {dir}/credential-keys
[identity]
password_hash_rounds = 4
[resource]
admin_project_name = admin
admin_project_domain_name = Default
[cache]
enabled = true
backend = dogpile.cache.memory
"""


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One installer or template builder at a time, across test sessions."""
    HOME.mkdir(exist_ok=True)
    with open(HOME / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install() -> None:
    """Create the virtualenv with Keystone and gunicorn, once (about 30 s)."""
    with _locked():
        if STAMP.exists():
            return
        if not (VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                        f"keystone=={VERSION}", "gunicorn"], check=True)
        STAMP.touch()


def _write_keys(directory: Path) -> None:
    """What keystone-manage fernet_setup / credential_setup write, without its 3.5 s import."""
    directory.mkdir(mode=0o700)
    for name in ("0", "1"):
        path = directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(base64.urlsafe_b64encode(os.urandom(32)))


def _write_conf(directory: Path) -> Path:
    conf = directory / "keystone.conf"
    conf.write_text(CONF_TEMPLATE.format(dir=directory))
    (directory / "keystone_wsgi.py").write_text(SHIM)
    return conf


def _manage(conf: Path, *args: str) -> None:
    subprocess.run([str(VENV / "bin" / "keystone-manage"), "--config-file", str(conf), *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _start(directory: Path, port: int) -> subprocess.Popen:
    env = {**os.environ, "OS_KEYSTONE_CONFIG_FILES": str(directory / "keystone.conf")}
    with open(directory / "gunicorn.log", "ab") as log:
        return subprocess.Popen(
            [str(VENV / "bin" / "gunicorn"), "--no-control-socket", "--chdir", str(directory),
             "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "4",
             "--timeout", "120", "keystone_wsgi:application"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _auth_body(user: str, scope: str | None) -> dict:
    body: dict = {"auth": {"identity": {"methods": ["password"], "password": {
        "user": {"name": user, "domain": {"id": "default"}, "password": PASSWORD}}}}}
    if scope == DOMAIN:
        body["auth"]["scope"] = {"domain": {"id": "default"}}
    elif scope == SYSTEM:
        body["auth"]["scope"] = {"system": {"all": True}}
    elif scope:
        body["auth"]["scope"] = {"project": {"name": scope, "domain": {"id": "default"}}}
    return body


def _issue(url: str, user: str, project: str | None) -> str:
    resp = requests.post(f"{url}/v3/auth/tokens", json=_auth_body(user, project), timeout=30)
    if resp.status_code != 201:
        raise RuntimeError(f"token for {user}: {resp.status_code} {resp.text[:300]}")
    return resp.headers["X-Subject-Token"]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"Keystone exited with {proc.returncode}")
        with contextlib.suppress(requests.RequestException, RuntimeError):
            return _issue(url, "admin", "admin")
        time.sleep(0.1)
    raise RuntimeError("Keystone did not become ready")


def _create_personas(url: str, admin_token: str, api_url: str) -> None:
    session = requests.Session()
    session.headers["X-Auth-Token"] = admin_token

    def post(path: str, body: dict) -> dict:
        resp = session.post(url + path, json=body, timeout=30)
        resp.raise_for_status()
        return resp.json()

    roles = {r["name"]: r["id"] for r in session.get(url + "/v3/roles", timeout=30).json()["roles"]}
    projects = {p["name"]: p["id"]
                for p in session.get(url + "/v3/projects", timeout=30).json()["projects"]}
    for name in PROJECTS:
        projects[name] = post("/v3/projects", {"project": {"name": name,
                                                            "domain_id": "default"}})["project"]["id"]
    for user, (scope, role) in PERSONAS.items():
        if user == "admin":
            continue
        fields = {"name": user, "domain_id": "default", "password": PASSWORD}
        if scope in projects:
            fields["default_project_id"] = projects[scope]
        uid = post("/v3/users", {"user": fields})["user"]["id"]
        target = {DOMAIN: "domains/default", SYSTEM: "system"}.get(
            scope, f"projects/{projects.get(scope)}")
        session.put(f"{url}/v3/{target}/users/{uid}/roles/{roles[role]}",
                    timeout=30).raise_for_status()
    service = post("/v3/services", {"service": {"name": "cyborg", "type": "accelerator"}})
    for interface in ("public", "internal", "admin"):
        post("/v3/endpoints", {"endpoint": {"service_id": service["service"]["id"],
                                            "interface": interface, "url": api_url,
                                            "region_id": REGION}})


def _build_template() -> None:
    """db_sync + bootstrap + personas into TEMPLATE (once per machine, about 20 s)."""
    work = HOME / f"building-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _write_keys(work / "fernet-keys")
    _write_keys(work / "credential-keys")
    conf = _write_conf(work)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    _manage(conf, "db_sync")
    _manage(conf, "bootstrap", "--bootstrap-password", PASSWORD,
            "--bootstrap-region-id", REGION,
            "--bootstrap-public-url", f"{url}/v3", "--bootstrap-internal-url", f"{url}/v3",
            "--bootstrap-admin-url", f"{url}/v3")
    proc = _start(work, port)
    try:
        token = _wait_ready(url, proc)
        _create_personas(url, token, "http://127.0.0.1:1/accelerator/v2")
    finally:
        api_process.stop(proc)
    for name in ("keystone.log", "gunicorn.log", "keystone.conf", "keystone_wsgi.py"):
        (work / name).unlink(missing_ok=True)
    (work / "template.json").write_text(json.dumps({"port": port, "layout": LAYOUT}))
    work.rename(TEMPLATE)


def _template_current() -> bool:
    try:
        return json.loads((TEMPLATE / "template.json").read_text()).get("layout") == LAYOUT
    except (OSError, ValueError):
        return False


def ensure_template() -> None:
    install()
    with _locked():
        if not _template_current():
            shutil.rmtree(TEMPLATE, ignore_errors=True)
            _build_template()


def _retarget(db_path: Path, keystone_url: str, api_url: str) -> None:
    """Point the copied catalog at this session's ports."""
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE endpoint SET url = ? WHERE service_id IN "
                     "(SELECT id FROM service WHERE type = 'identity')", (f"{keystone_url}/v3",))
        conn.execute("UPDATE endpoint SET url = ? WHERE service_id IN "
                     "(SELECT id FROM service WHERE type = 'accelerator')", (api_url,))


@dataclass
class Keystone:
    """A running Keystone; ``api_port`` is reserved for acceld (the catalog points there)."""

    url: str
    api_port: int
    directory: Path
    proc: subprocess.Popen
    _tokens: dict[str, str] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}/accelerator/v2"

    def token(self, user: str) -> str:
        """A token scoped as the persona is (cached for the session)."""
        if user not in self._tokens:
            self._tokens[user] = _issue(self.url, user, PERSONAS[user][0])
        return self._tokens[user]

    def project_id(self, name: str) -> str:
        resp = requests.get(f"{self.url}/v3/projects", params={"name": name},
                            headers={"X-Auth-Token": self.token("admin")}, timeout=30)
        resp.raise_for_status()
        return resp.json()["projects"][0]["id"]

    def authtoken_section(self) -> str:
        """``[keystone_authtoken]`` for acceld: the cyborg service user validates tokens."""
        return (f"[keystone_authtoken]\n"
                f"www_authenticate_uri = {self.url}/v3\n"
                f"auth_url = {self.url}/v3\n"
                f"auth_type = password\n"
                f"username = cyborg\n"
                f"password = {PASSWORD}\n"
                f"user_domain_id = default\n"
                f"project_name = service\n"
                f"project_domain_id = default\n"
                f"interface = public\n"
                f"service_token_roles = service\n"
                f"service_token_roles_required = true\n")

    def stop(self) -> None:
        api_process.stop(self.proc)


@contextlib.contextmanager
def acceld_api(ks: Keystone, state: Path, extra_conf: str = "",
               database: Any = None) -> Iterator[dict]:
    """`acceld api` with ``auth_strategy = keystone`` on the port the catalog names, on
    ``database`` (a migrated acceld.db.engine.Database the caller disposes of) or a new
    SQLite one.

    Yields ``{"base", "db", "state"}``; the process is stopped by its PID's group."""
    from acceld.db import migrate
    from acceld.db.engine import Database

    db_url = database.url.render_as_string(hide_password=False) if database is not None \
        else f"sqlite:///{state}/acceld.sqlite"
    conf_text = (
        f"[DEFAULT]\nauth_strategy = keystone\nstate_path = {state}\ndebug = true\n"
        f"log_file = {state}/api.log\n"
        f"[database]\nconnection = {db_url}\n"
        f"[internal]\nshared_secret = internal-secret-for-the-keystone-tests\n"
        f"[api]\nhost_ip = 127.0.0.1\nport = {ks.api_port}\n"
        + extra_conf + ks.authtoken_section())
    db = database if database is not None else Database(db_url)
    if database is None:
        migrate.upgrade(db)
    try:
        with api_process.running(state, conf_text, ks.api_port) as base:
            yield {"base": base, "db": db, "state": state}
    finally:
        if database is None:
            db.dispose()


def start(directory: Path) -> Keystone:
    """Copy the template into ``directory`` and serve it; the caller stops it."""
    ensure_template()
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("keystone.db", "fernet-keys", "credential-keys"):
        src = TEMPLATE / name
        if src.is_dir():
            shutil.copytree(src, directory / name)
        else:
            shutil.copy2(src, directory / name)
    _write_conf(directory)
    port, api_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    _retarget(directory / "keystone.db", url, f"http://127.0.0.1:{api_port}/accelerator/v2")
    proc = _start(directory, port)
    try:
        _wait_ready(url, proc)
    except BaseException:
        api_process.stop(proc)
        raise
    return Keystone(url=url, api_port=api_port, directory=directory, proc=proc)


if __name__ == "__main__":
    # `python -m tests.support.keystone`: install and prepare the template (make test does).
    ensure_template()
    print(f"Keystone {VERSION} ready: {TEMPLATE}")
