"""Node key generations in the credential, and the conductor's bounded reading of them.

Issue 25, item 6 (the end-to-end checks on every backend: tests/db/test_node_key_revocation.py).
"""

from __future__ import annotations

import pytest
from falcon import testing
from sqlalchemy import text

from acceld.db import node_keys
from acceld.db.engine import Database
from acceld.db.models import agents, utcnow
from acceld.internal import auth
from acceld.internal.server import build_app, respond

CLOUD = b"cloud-secret-for-node-key-generation-tests-0123"


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def check(verifier: auth.Verifier, signer: auth.Signer) -> auth.Identity:
    h = signer.headers("POST", "/hello", b"{}", destination="conductor")[0]
    return verifier.check("POST", "/hello", h[auth.HEADER], h.get(auth.NODE_HEADER),
                          h[auth.DIGEST_HEADER])


def test_generations_derive_distinct_keys_and_gen0_is_the_old_key() -> None:
    import hashlib
    import hmac

    old = hmac.new(CLOUD, b"acceld node key\nnode-a", hashlib.sha256).hexdigest().encode()
    assert auth.node_key(CLOUD, "node-a") == auth.node_key(CLOUD, "node-a", 0) == old
    keys = {auth.node_key(CLOUD, "node-a", g) for g in range(4)}
    assert len(keys) == 4 and auth.node_key(CLOUD, "node-b", 1) not in keys


def test_the_deployed_form_carries_the_generation() -> None:
    key = auth.node_key(CLOUD, "node-a", 7)
    assert auth.format_node_key(key, 7) == "g7:" + key.decode()
    assert auth.parse_node_key("g7:" + key.decode()) == auth.NodeKey(key, 7)
    zero = auth.node_key(CLOUD, "node-a")
    assert auth.format_node_key(zero, 0) == zero.decode()
    assert auth.parse_node_key(zero.decode()) == auth.NodeKey(zero, 0)
    # Anything else is a generation-0 key used as it is (keys set before generations).
    assert auth.parse_node_key("g0:" + zero.decode()) == auth.NodeKey(b"g0:" + zero, 0)


def test_the_key_id_is_sent_from_generation_1_and_checked() -> None:
    verifier = auth.Verifier(auth.CloudKeys(CLOUD), destination="conductor")
    gen0 = auth.Signer(auth.node_key(CLOUD, "node-a"), "node-a")
    assert gen0.headers("POST", "/hello")[0][auth.HEADER].count(".") == 2
    assert check(verifier, gen0).generation == 0
    # Without a table every node is at generation 0: generation 1 is refused.
    gen1 = auth.Signer(auth.node_key(CLOUD, "node-a", 1), "node-a", 1)
    assert gen1.headers("POST", "/hello")[0][auth.HEADER].endswith(".1")
    with pytest.raises(auth.CredentialError, match="never issued"):
        check(verifier, gen1)
    # A key id claiming another generation than the key's: the MAC does not match.
    liar = auth.Signer(auth.node_key(CLOUD, "node-a"), "node-a", 1)
    with pytest.raises(auth.CredentialError, match="wrong credential"):
        check(verifier, liar)
    # The cloud's secret has no generations.
    with pytest.raises(auth.CredentialError, match="without X-Acceld-Node"):
        check(verifier, auth.Signer(CLOUD, None, 2))


def test_a_node_accepts_only_its_own_generation() -> None:
    key = auth.node_key(CLOUD, "node-a", 2)
    verifier = auth.Verifier(auth.NodeKeys("node-a", key, 2), destination="conductor")
    assert check(verifier, auth.Signer(key, "node-a", 2)).generation == 2
    with pytest.raises(auth.CredentialError, match="made with generation 0 of node node-a's "
                                                   "key; this node holds generation 2"):
        check(verifier, auth.Signer(auth.node_key(CLOUD, "node-a"), "node-a"))


class Table:
    """A stand-in auth.Generations: each node's state, counted reads."""

    def __init__(self, states: dict[str, auth.KeyState]) -> None:
        self.states = states

    def state(self, hostname: str, refresh: bool = False) -> auth.KeyState:
        return self.states.get(hostname, auth.KeyState())


def test_a_revoked_key_is_told_to_the_holder_only() -> None:
    table = Table({"node-a": auth.KeyState(1, False)})

    def ok(req, resp) -> None:  # type: ignore[no-untyped-def]
        respond(resp, {"ok": True})

    app = build_app(auth.CloudKeys(CLOUD, table), 60, {"/hello": {"POST": ok}},
                    destination="conductor")
    client = testing.TestClient(app)

    def post(signer: auth.Signer):  # type: ignore[no-untyped-def]
        return client.simulate_post("/hello", body=b"{}", headers=signer.headers(
            "POST", "/hello", b"{}", destination="conductor")[0])

    revoked = post(auth.Signer(auth.node_key(CLOUD, "node-a"), "node-a"))
    assert revoked.status_code == 401
    assert "Generation 0 of node node-a's key is revoked" in revoked.json["error"]
    # A forger claiming node-a (wrong key) learns nothing of node-a's key.
    forged = post(auth.Signer(b"x" * 64, "node-a"))
    assert forged.status_code == 401 and "revoked" not in forged.json["error"]
    assert post(auth.Signer(auth.node_key(CLOUD, "node-a", 1), "node-a", 1)).status_code == 200
    assert post(auth.Signer(auth.node_key(CLOUD, "node-b"), "node-b")).status_code == 200


def _known(db: Database, *hosts: str) -> None:
    with db.write() as conn:
        for host in hosts:
            conn.execute(agents.insert().values(hostname=host, endpoint="127.0.0.1:9",
                                                state="up", last_seen_at=utcnow(),
                                                heartbeat_interval=10))


def test_the_reading_is_never_older_than_max_age(sqlite_db) -> None:
    _known(sqlite_db, "node-a")
    clock = Clock()
    cache = node_keys.KeyGenerations(sqlite_db, 60, clock=clock)
    assert cache.state("node-a") == auth.KeyState() and cache.reads == 1
    node_keys.rotate(sqlite_db, "node-a")
    clock.now += 59.9
    assert cache.state("node-a") == auth.KeyState() and cache.reads == 1  # no query per call
    clock.now += 0.1
    assert cache.state("node-a") == auth.KeyState(1, False) and cache.reads == 2
    node_keys.revoke(sqlite_db, "node-a")
    assert cache.state("node-a", refresh=True) == auth.KeyState(1, True)
    with pytest.raises(node_keys.KeyRevokedHost, match="The key of host node-a is revoked"):
        cache.signing("node-a")


def test_an_unreadable_table_keeps_the_last_reading_and_none_is_503(sqlite_db,
                                                                   caplog) -> None:
    _known(sqlite_db, "node-a")
    node_keys.rotate(sqlite_db, "node-a")
    clock = Clock()
    cache = node_keys.KeyGenerations(sqlite_db, 60, clock=clock)
    assert cache.state("node-a") == auth.KeyState(1, False)
    with sqlite_db.write() as conn:
        conn.execute(text("ALTER TABLE node_key_generations RENAME TO gone"))
    clock.now += 60
    assert cache.state("node-a") == auth.KeyState(1, False)  # kept
    assert "Cannot read the node key generations" in caplog.text
    reads_failed = caplog.text.count("Cannot read the node key generations")
    clock.now += node_keys.RETRY_SECONDS - 0.1
    cache.state("node-a")  # not tried again before RETRY_SECONDS
    assert caplog.text.count("Cannot read the node key generations") == reads_failed
    fresh = node_keys.KeyGenerations(sqlite_db, 60, clock=clock)
    with pytest.raises(auth.KeysUnavailable):
        fresh.state("node-a")
    # Through a server: a node's call is 503, not accepted and not called forged.
    app = build_app(auth.CloudKeys(CLOUD, fresh), 60, {"/hello": {"POST": lambda q, r: None}},
                    destination="conductor")
    signer = auth.Signer(auth.node_key(CLOUD, "node-a", 1), "node-a", 1)
    answer = testing.TestClient(app).simulate_post("/hello", body=b"{}", headers=signer.headers(
        "POST", "/hello", b"{}", destination="conductor")[0])
    assert answer.status_code == 503
