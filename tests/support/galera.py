"""A real three-node MariaDB Galera cluster on loopback, with HAProxy in front of it.

The database clouds run (kolla-ansible, OpenStack-Ansible): three ``mariadbd`` with the
galera-4 provider, the first bootstrapped with ``--wsrep-new-cluster``, the others joining
it by state transfer (``rsync``, run as the ``mysql`` user: as root the joiner's rsync
daemon drops to ``nobody`` and the transfer fails). Every port (client, group
communication, IST, SST) is a free one on 127.0.0.1, every data directory is under a
temporary directory, and every process is stopped by its PID.

HAProxy is configured as kolla-ansible does for MariaDB: one active server, the two
others ``backup``, so that one node takes every write until it fails. The health check is
an external one that asks the node for ``wsrep_local_state`` and passes only on 4
(Synced): a donor, a joiner or a node cut off from the primary component is taken out.

One cluster per test process (pytest-xdist workers each get their own: no shared ports,
no lock to hold), started on first use and stopped at the end of the session.
:func:`unavailable` says why a cluster cannot be had here (the tests skip with it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

import pymysql

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
RUN_AS = "mysql"
START_TIMEOUT = 90.0  # seconds for one node to be Synced (an SST on a loaded machine)
SYNCED = 4  # wsrep_local_state


def unavailable() -> str | None:
    """Why a Galera cluster cannot be started on this machine, or None when it can."""
    for tool in ("mariadbd", "mariadb-install-db", "rsync", "haproxy"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is not installed (make test installs haproxy; galera-4 and " \
                   "mariadb-server come with the machine's image)"
    if not os.path.exists(PROVIDER):
        return f"galera-4 is not installed ({PROVIDER} missing)"
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        return f"no {RUN_AS!r} user to run the nodes as"
    if os.geteuid() != 0:
        return "the nodes run as the mysql user, which needs root to start them"
    return None


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (held open together while chosen)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    """One ``mariadbd``: its ports, directory and process."""

    index: int
    base: str
    port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    proc: subprocess.Popen | None = None

    @property
    def datadir(self) -> str:
        return os.path.join(self.base, "data")

    @property
    def socket(self) -> str:
        return os.path.join(self.base, "mysqld.sock")

    @property
    def log(self) -> str:
        return os.path.join(self.base, "error.log")

    @property
    def cnf(self) -> str:
        return os.path.join(self.base, "my.cnf")

    def url(self, database: str = "") -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{database}"

    def connect(self, **kwargs) -> pymysql.Connection:  # type: ignore[no-untyped-def]
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root",
                               autocommit=True, connect_timeout=5, **kwargs)

    def local_state(self) -> int | None:
        """wsrep_local_state (4: Synced), or None when the node does not answer (asked
        over the node's socket: root over TCP exists only once the first node is up)."""
        try:
            conn = pymysql.connect(unix_socket=self.socket, user="root", connect_timeout=5)
        except pymysql.MySQLError:
            return None
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW STATUS LIKE 'wsrep_local_state'")
                row = cur.fetchone()
                return int(row[1]) if row else None
        except pymysql.MySQLError:
            return None
        finally:
            conn.close()


@dataclass
class Cluster:
    """Three nodes and the HAProxy in front of them (``vip_port``)."""

    base: str
    name: str
    nodes: list[Node]
    vip_port: int
    haproxy_stats: str = ""
    haproxy: subprocess.Popen | None = None
    databases: list[str] = field(default_factory=list)

    @property
    def gcomm(self) -> str:
        return "gcomm://" + ",".join(f"127.0.0.1:{n.gcomm_port}" for n in self.nodes)

    def vip_url(self, database: str = "") -> str:
        return f"mysql+pymysql://root@127.0.0.1:{self.vip_port}/{database}"

    # ------------------------------------------------------------------ nodes

    def _write_cnf(self, node: Node) -> None:
        provider_options = "; ".join([
            f"gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm_port}",
            f"ist.recv_addr=127.0.0.1:{node.ist_port}",
            "gcache.size=32M",
            # A killed node is declared gone in seconds, not the default 15 s.
            "evs.suspect_timeout=PT3S", "evs.inactive_timeout=PT5S",
            "evs.inactive_check_period=PT1S", "evs.keepalive_period=PT0.5S",
        ])
        with open(node.cnf, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(f"""\
                [mysqld]
                user = {RUN_AS}
                datadir = {node.datadir}
                socket = {node.socket}
                pid-file = {node.base}/mysqld.pid
                log-error = {node.log}
                port = {node.port}
                bind-address = 127.0.0.1
                skip-name-resolve
                skip-log-bin
                character-set-server = utf8mb4
                collation-server = utf8mb4_bin
                default-storage-engine = InnoDB
                binlog_format = ROW
                innodb_autoinc_lock_mode = 2
                innodb_buffer_pool_size = 32M
                innodb_log_file_size = 16M
                innodb_flush_log_at_trx_commit = 0
                performance_schema = OFF
                max_connections = 400
                wsrep_on = ON
                wsrep_provider = {PROVIDER}
                wsrep_cluster_name = {self.name}
                wsrep_cluster_address = {self.gcomm}
                wsrep_node_name = node{node.index}
                wsrep_node_address = 127.0.0.1:{node.gcomm_port}
                wsrep_node_incoming_address = 127.0.0.1:{node.port}
                wsrep_sst_receive_address = 127.0.0.1:{node.sst_port}
                wsrep_sst_method = rsync
                wsrep_slave_threads = 2
                wsrep_provider_options = "{provider_options}"
                """))

    def start_node(self, node: Node, *, bootstrap: bool = False) -> None:
        """Start ``node`` (the first one with ``--wsrep-new-cluster``) and wait until it
        is Synced."""
        args = ["mariadbd", f"--defaults-file={node.cnf}"]
        if bootstrap:
            args.append("--wsrep-new-cluster")
        with open(os.path.join(node.base, "stdout.log"), "ab") as log:
            node.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while node.local_state() != SYNCED:
            if node.proc.poll() is not None:
                raise RuntimeError(f"node{node.index} exited ({node.proc.returncode}): "
                                   + _tail(node.log))
            if time.monotonic() > deadline:
                raise RuntimeError(f"node{node.index} not Synced after {START_TIMEOUT} s: "
                                   + _tail(node.log))
            time.sleep(0.2)

    def kill_node(self, node: Node) -> None:
        """kill -9 the node's ``mariadbd`` (by its PID) and reap it."""
        if node.proc is not None and node.proc.poll() is None:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=30)

    def stop_node(self, node: Node) -> None:
        """Stop the node cleanly (SIGTERM by PID), kill -9 after 30 s."""
        if node.proc is None or node.proc.poll() is not None:
            return
        os.kill(node.proc.pid, signal.SIGTERM)
        try:
            node.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill_node(node)

    # ---------------------------------------------------------------- HAProxy

    def _write_haproxy(self) -> str:
        check = os.path.join(self.base, "wsrep_check.sh")
        with open(check, "w", encoding="utf-8") as f:
            # HAProxy's external check: $3 and $4 are the server's address and port.
            f.write(textwrap.dedent("""\
                #!/bin/sh
                state=$(mariadb --protocol=tcp -h "$3" -P "$4" -u root -N -B \\
                    --connect-timeout=2 -e "SHOW STATUS LIKE 'wsrep_local_state'" \\
                    2>/dev/null | cut -f2)
                [ "$state" = 4 ]
                """))
        os.chmod(check, 0o755)
        servers = "\n".join(
            f"    server node{n.index} 127.0.0.1:{n.port} check inter 1s rise 2 fall 2"
            + (" backup" if n.index > 1 else "") for n in self.nodes)
        cfg_path = os.path.join(self.base, "haproxy.cfg")
        self.haproxy_stats = os.path.join(self.base, "haproxy.sock")
        with open(cfg_path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(f"""\
                global
                    external-check
                    insecure-fork-wanted
                    stats socket {self.haproxy_stats} mode 600 level admin
                defaults
                    mode tcp
                    timeout connect 5s
                    timeout client 3600s
                    timeout server 3600s
                listen mariadb
                    bind 127.0.0.1:{self.vip_port}
                    option tcpka
                    option external-check
                    external-check path "/usr/bin:/bin"
                    external-check command {check}
                """) + servers + "\n")
        return cfg_path

    def start_haproxy(self) -> None:
        cfg_path = self._write_haproxy()
        log = open(os.path.join(self.base, "haproxy.log"), "ab")
        with log:
            self.haproxy = subprocess.Popen(["haproxy", "-db", "-f", cfg_path], stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while self.active_server() != "node1":
            if self.haproxy.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("haproxy did not route to node1: "
                                   + _tail(os.path.join(self.base, "haproxy.log")))
            time.sleep(0.2)

    def server_states(self) -> dict[str, str]:
        """HAProxy's view: server name -> status (UP, DOWN, ...)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.haproxy_stats)
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        states = {}
        for line in data.decode().splitlines():
            cols = line.split(",")
            if len(cols) > 17 and cols[0] == "mariadb" and cols[1].startswith("node"):
                states[cols[1]] = cols[17]
        return states

    def active_server(self) -> str | None:
        """The node HAProxy sends new connections to now, asked through the VIP."""
        try:
            conn = pymysql.connect(host="127.0.0.1", port=self.vip_port, user="root",
                                   connect_timeout=2, read_timeout=2)
        except pymysql.MySQLError:
            return None
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@wsrep_node_name")
                return cur.fetchone()[0]
        except pymysql.MySQLError:
            return None
        finally:
            conn.close()

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        first = self.nodes[0]
        subprocess.run(["mariadb-install-db", f"--defaults-file={first.cnf}",
                        "--auth-root-authentication-method=socket",
                        "--skip-test-db"], check=True, capture_output=True, timeout=120)
        self.start_node(first, bootstrap=True)
        # root over TCP from loopback without a password, replicated to the joiners by SST.
        conn = pymysql.connect(unix_socket=first.socket, user="root", autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE USER 'root'@'127.0.0.1'")
            cur.execute("GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        conn.close()
        for node in self.nodes[1:]:
            self.start_node(node)
        self.start_haproxy()

    def stop(self) -> None:
        if self.haproxy is not None and self.haproxy.poll() is None:
            os.kill(self.haproxy.pid, signal.SIGTERM)
            try:
                self.haproxy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.haproxy.pid, signal.SIGKILL)
                self.haproxy.wait(timeout=10)
        for node in reversed(self.nodes):
            self.stop_node(node)
        shutil.rmtree(self.base, ignore_errors=True)

    # -------------------------------------------------------------- databases

    def create_database(self) -> str:
        """A new empty database (replicated to every node); returns its name."""
        name = f"acceld_g_{uuid.uuid4().hex[:12]}"
        conn = self.nodes[0].connect()
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        conn.close()
        self.databases.append(name)
        return name

    def wait_synced(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every running node is Synced."""
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            while node.local_state() != SYNCED:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node{node.index} not Synced: " + _tail(node.log))
                time.sleep(0.2)


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def new_cluster() -> Cluster:
    """Lay out (not start) a cluster under a fresh directory the mysql user owns."""
    base = tempfile.mkdtemp(prefix="acceld-galera-")
    os.chmod(base, 0o755)
    ports = _free_ports(13)
    nodes = []
    for i in range(3):
        node_dir = os.path.join(base, f"node{i + 1}")
        os.makedirs(os.path.join(node_dir, "data"))
        nodes.append(Node(i + 1, node_dir, *ports[4 * i:4 * i + 4]))
    user = pwd.getpwnam(RUN_AS)
    for root, dirs, _files in os.walk(base):
        for d in dirs:
            os.chown(os.path.join(root, d), user.pw_uid, user.pw_gid)
    os.chown(base, user.pw_uid, user.pw_gid)
    cluster = Cluster(base, f"acceld_{uuid.uuid4().hex[:8]}", nodes, ports[12])
    for node in nodes:
        cluster._write_cnf(node)
    return cluster


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """A started cluster, stopped (every process by PID) and removed afterwards."""
    cluster = new_cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
