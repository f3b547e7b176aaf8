"""acceld.serving.connection_loop: one epoll shared by a few threads, each serving the requests it
reads. Real sockets on loopback; interleavings are forced with events, never sleeps (the
deadline tests wait on purpose: time is what they test)."""

from __future__ import annotations

import collections
import socket
import threading
import time

import pytest

from acceld.serving import serving_slot
from acceld.serving.connection_loop import HEAD_END, Conn, ConnectionLoop, Outcome


class Expired(Exception):
    pass


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    yield left, right
    left.close()
    right.close()


def _conn(sock: socket.socket, deadline: float | None) -> Conn:
    conn = Conn(sock, ("test", 0), 0.0, None)  # type: ignore[arg-type]
    conn.deadline = deadline
    conn.on_expired = Expired
    return conn


def test_buffered_bytes_come_first_then_the_socket(pair):
    server, client = pair
    conn = _conn(server, None)
    conn.buffer += b"head"
    client.sendall(b"body")
    assert conn.recv(2) == b"he"
    assert conn.recv(10) == b"ad"
    assert conn.recv(10) == b"body"


def test_bytes_already_received_are_read_after_the_deadline(pair):
    server, client = pair
    client.sendall(b"body")
    time.sleep(0.05)
    conn = _conn(server, time.monotonic() - 5)
    assert conn.recv(10) == b"body"
    with pytest.raises(Expired):  # nothing more came: no waiting past the deadline
        conn.recv(10)
    assert server.gettimeout() is None  # the socket's own mode is given back


def test_a_read_waits_only_until_the_deadline(pair):
    server, _client = pair
    conn = _conn(server, time.monotonic() + 0.3)
    started = time.monotonic()
    with pytest.raises(Expired):
        conn.recv(10)
    assert 0.25 <= time.monotonic() - started < 2


class Server:
    """A loop whose requests are ``GET /<word>``: ``block`` waits for ``release``,
    ``boom`` raises, ``close`` answers and closes, anything else is answered and kept."""

    def __init__(self, threads: int = 2, **limits: float) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.served_by: list[str] = []
        self.words: list[str] = []
        self.gates = collections.defaultdict(threading.Event)
        self.entered = collections.defaultdict(threading.Event)
        self.late: list[str] = []
        self.active = 0  # serve calls running now, and the most at once
        self.most_active = 0
        self.slot_after_step_out: list[bool] = []
        self._count = threading.Lock()
        options = {"max_connections": 64, "header_timeout": 5.0, "idle_timeout": 5.0}
        options.update(limits)
        self.loop = ConnectionLoop([self.listener], self.serve, threads=threads,
                                   on_header_timeout=lambda c: self.late.append(c.peer()),
                                   **options).start()  # type: ignore[arg-type]

    def serve(self, conn: Conn) -> Outcome:
        with self._count:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            return self._serve(conn)
        finally:
            with self._count:
                self.active -= 1

    def _serve(self, conn: Conn) -> Outcome:
        end = conn.buffer.index(HEAD_END)
        word = bytes(conn.buffer[:end]).split(b" ")[1].lstrip(b"/")
        del conn.buffer[:end + len(HEAD_END)]
        self.served_by.append(threading.current_thread().name)
        self.words.append(word.decode())
        if word == b"block":
            self.blocked.set()
            assert self.release.wait(10)
        if word.startswith(b"wait-"):  # waits for its own gate
            self.entered[word].set()
            assert self.gates[word].wait(10)
        if word.startswith(b"out-"):  # waits for its gate outside the serving slot
            with self._count:
                self.active -= 1  # not serving while stepped out
            with serving_slot.stepped_out():
                self.entered[word].set()
                assert self.gates[word].wait(10)
            with self._count:
                self.active += 1
                self.most_active = max(self.most_active, self.active)
            self.slot_after_step_out.append(serving_slot.holds_slot())
        if word == b"yield":  # gives the GIL away mid-request, as a database call does
            time.sleep(0.001)
        if word == b"boom":
            raise RuntimeError("boom")
        body = word + b"!"
        conn.sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return Outcome.CLOSE if word == b"close" else Outcome.KEEP

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def stop(self) -> None:
        self.release.set()
        for gate in list(self.gates.values()):
            gate.set()
        self.loop.stop()
        self.listener.close()


@pytest.fixture
def server():
    srv = Server()
    yield srv
    srv.stop()


def _get(sock: socket.socket, word: str) -> bytes:
    sock.sendall(f"GET /{word} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return _answer(sock)


_READERS: dict[int, object] = {}


def _answer(sock: socket.socket) -> bytes:
    """The next answer's body (answers that arrive together are read one by one)."""
    reader = _READERS.setdefault(id(sock), sock.makefile("rb"))
    length = None
    while True:
        line = reader.readline()  # type: ignore[attr-defined]
        assert line, "closed before an answer"
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
        if line == b"\r\n":
            return reader.read(length)  # type: ignore[attr-defined]


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _wait_until(condition, seconds: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_kept_alive_connection_serves_requests_in_turn(server):
    sock = server.connect()
    assert [_get(sock, w) for w in ("a", "b", "c")] == [b"a!", b"b!", b"c!"]
    assert all(name.startswith("http-") for name in server.served_by)  # a loop thread


def test_pipelined_requests_are_all_answered_in_order(server):
    sock = server.connect()
    sock.sendall(b"".join(f"GET /{w} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for w in "xyz"))
    assert [_answer(sock) for _ in range(3)] == [b"x!", b"y!", b"z!"]


def test_a_pipelined_request_waits_its_turn_behind_other_connections():
    srv = Server(threads=1)
    try:
        first, other = srv.connect(), srv.connect()
        first.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.blocked.wait(5)
        other.sendall(b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")  # ready while /block runs
        srv.release.set()
        assert [_answer(first), _answer(first), _answer(other)] == [b"block!", b"next!", b"other!"]
        assert srv.words == ["block", "other", "next"]
    finally:
        srv.stop()


def test_a_head_in_pieces_is_served_once_complete(server):
    sock = server.connect()
    for piece in (b"GET /pie", b"ces HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
        sock.sendall(piece)
    assert _answer(sock) == b"pieces!"


def test_a_blocked_request_holds_one_thread_only(server):
    blocked = server.connect()
    blocked.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
    assert server.blocked.wait(5)
    other = server.connect()  # served by the other thread while the first still waits
    assert _get(other, "free") == b"free!"
    _wait_until(lambda: server.loop.serving == 1)  # its thread counts itself out after answering
    server.release.set()
    assert _answer(blocked) == b"block!"


def test_a_ready_request_goes_to_a_free_thread_not_behind_a_busy_one():
    """Each thread takes one event a wait: two requests ready together are not both
    taken by a thread that then serves one and keeps the other waiting."""
    srv = Server(threads=2)
    try:
        a, b, c, d = (srv.connect() for _ in range(4))
        a.sendall(b"GET /wait-a HTTP/1.1\r\nHost: x\r\n\r\n")
        b.sendall(b"GET /wait-b HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.entered[b"wait-a"].wait(5) and srv.entered[b"wait-b"].wait(5)
        # Both threads busy: c and d are ready in the epoll together.
        c.sendall(b"GET /wait-c HTTP/1.1\r\nHost: x\r\n\r\n")
        d.sendall(b"GET /d HTTP/1.1\r\nHost: x\r\n\r\n")
        srv.gates[b"wait-b"].set()  # one thread is free: it takes c and blocks on it
        assert _answer(b) == b"wait-b!"
        assert srv.entered[b"wait-c"].wait(5)
        srv.gates[b"wait-a"].set()  # the other thread is free: d is its to serve
        assert _answer(a) == b"wait-a!"
        d.settimeout(5)
        assert _answer(d) == b"d!"  # while c still holds its thread
        srv.gates[b"wait-c"].set()
        assert _answer(c) == b"wait-c!"
    finally:
        for gate in list(srv.gates.values()):
            gate.set()
        srv.stop()


def test_a_failing_request_closes_its_connection_and_nothing_else(server):
    bad, good = server.connect(), server.connect()
    bad.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _closed_within(bad, 5)
    assert _get(good, "still") == b"still!"


def test_closing_answer_arrives_whole_and_the_connection_lingers_for_the_fin(server):
    sock = server.connect()
    assert _get(sock, "close") == b"close!"
    assert _closed_within(sock, 5)  # the server half-closed after the answer
    assert server.loop.open_connections == 1  # lingering, in the epoll, no thread
    sock.close()  # the client's FIN ends the linger
    _wait_until(lambda: server.loop.open_connections == 0)


def test_an_incomplete_head_is_closed_at_the_header_deadline():
    srv = Server(header_timeout=0.5)
    try:
        slow, quick = srv.connect(), srv.connect()
        slow.sendall(b"GET /never HTTP/1.1\r\nHost")
        assert _get(quick, "ok") == b"ok!"  # no thread waits on the slow one
        assert _closed_within(slow, 5)
        assert len(srv.late) == 1
    finally:
        srv.stop()


def test_an_idle_kept_alive_connection_is_closed_at_the_idle_deadline():
    srv = Server(idle_timeout=0.5, header_timeout=30)
    try:
        sock = srv.connect()
        assert _get(sock, "once") == b"once!"
        assert _closed_within(sock, 5)
        assert srv.late == []  # idle, not late with a head
    finally:
        srv.stop()


def test_at_the_limit_an_idle_connection_makes_room_and_busy_ones_do_not():
    srv = Server(max_connections=2)
    try:
        idle = srv.connect()
        assert _get(idle, "idle") == b"idle!"
        _wait_until(lambda: srv.loop.idle_connections == 1)  # its thread re-armed it
        blocked = srv.connect()
        blocked.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.blocked.wait(5)
        newcomer = srv.connect()
        assert _get(newcomer, "new") == b"new!"  # the idle one was evicted for it
        assert _closed_within(idle, 5)
        _wait_until(lambda: srv.loop.idle_connections == 1)
        third = srv.connect()  # the newcomer is idle now and gets evicted in turn
        assert _get(third, "next") == b"next!"
        srv.release.set()
        assert _answer(blocked) == b"block!"
    finally:
        srv.stop()


def test_at_the_limit_with_every_connection_busy_a_newcomer_is_closed():
    srv = Server(max_connections=1)
    try:
        blocked = srv.connect()
        blocked.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.blocked.wait(5)
        assert _closed_within(srv.connect(), 5)
        srv.release.set()
        assert _answer(blocked) == b"block!"
    finally:
        srv.stop()


def test_stop_waits_for_a_request_being_served():
    srv = Server()
    sock = srv.connect()
    sock.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
    assert srv.blocked.wait(5)
    stopper = threading.Thread(target=srv.loop.stop, kwargs={"grace": 10})
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive()  # still waiting for the request
    srv.release.set()
    assert _answer(sock) == b"block!"
    stopper.join(10)
    assert not stopper.is_alive()
    srv.listener.close()


def test_stop_serves_a_request_already_on_its_way():
    """A graceful stop (gunicorn's SIGHUP or SIGTERM) serves a connection it accepted whose
    request has not arrived whole yet, within the grace: closing it left the client with
    'Remote end closed connection without response' (seen in test_sighup's reload)."""
    srv = Server()
    sock = srv.connect()
    _wait_until(lambda: len(srv.loop._conns) == 1)  # accepted, no byte of its request yet
    stopper = threading.Thread(target=srv.loop.stop, kwargs={"grace": 10})
    stopper.start()
    _wait_until(lambda: not srv.loop._accepting)
    sock.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _answer(sock) == b"late!"
    stopper.join(10)
    assert not stopper.is_alive()
    srv.listener.close()


def test_stop_does_not_wait_for_idle_kept_alive_connections():
    srv = Server()
    sock = srv.connect()
    assert _get(sock, "first") == b"first!"  # now idle, kept alive
    started = time.monotonic()
    srv.loop.stop(grace=10)
    assert time.monotonic() - started < 2
    assert _closed_within(sock, 2)
    srv.listener.close()


# The serving slot (acceld.serving.serving_slot): one thread at a time handles events.

def test_with_a_slot_one_thread_serves_while_none_waits_elsewhere():
    """Four threads, four clients sending requests that give the GIL away mid-request:
    never two served at once, and all by the slot's holder: the other threads sleep
    (without a slot, all four threads serve together)."""
    srv = Server(threads=4, slot=serving_slot.Slot())
    try:
        socks = [srv.connect() for _ in range(4)]

        def client(sock: socket.socket) -> None:
            for _ in range(25):
                assert _get(sock, "yield") == b"yield!"

        workers = [threading.Thread(target=client, args=(s,)) for s in socks]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        assert srv.words.count("yield") == 100
        assert srv.most_active == 1
        assert len(set(srv.served_by)) == 1
    finally:
        srv.stop()


def test_without_a_slot_threads_serve_at_once():
    """The other side of the test above: the internal API's loop has no slot."""
    srv = Server(threads=2)
    try:
        a, b = srv.connect(), srv.connect()
        a.sendall(b"GET /wait-a HTTP/1.1\r\nHost: x\r\n\r\n")
        b.sendall(b"GET /wait-b HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.entered[b"wait-a"].wait(5) and srv.entered[b"wait-b"].wait(5)
        assert srv.most_active == 2
    finally:
        srv.stop()


def test_a_request_stepped_out_of_the_slot_lets_the_next_be_served():
    """A wait for another service (the conductor, a slow reader) runs outside the slot:
    other requests are served meanwhile, and the waiter takes the slot back before it
    answers."""
    srv = Server(threads=2, slot=serving_slot.Slot())
    try:
        waiting, other = srv.connect(), srv.connect()
        waiting.sendall(b"GET /out-a HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.entered[b"out-a"].wait(5)
        assert _get(other, "free") == b"free!"  # while out-a waits for its gate
        srv.gates[b"out-a"].set()
        assert _answer(waiting) == b"out-a!"
        assert srv.slot_after_step_out == [True]
        assert srv.most_active == 1
        assert srv.served_by[0] != srv.served_by[1]  # the next thread took over the loop
        assert _get(other, "again") == b"again!"  # and the loop goes on after the hand-back
    finally:
        srv.stop()


def test_a_request_holding_the_slot_keeps_the_others_waiting():
    srv = Server(threads=2, slot=serving_slot.Slot())
    try:
        blocked, other = srv.connect(), srv.connect()
        blocked.sendall(b"GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.blocked.wait(5)
        other.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        srv.release.set()
        assert _answer(blocked) == b"block!"
        assert _answer(other) == b"after!"
        assert srv.words == ["block", "after"] and srv.most_active == 1
    finally:
        srv.stop()


def test_stop_waits_for_a_request_stepped_out_of_the_slot_and_ends_every_thread():
    """SIGTERM's drain with a slot: a request waiting outside the slot (a bind PATCH's
    wait for the conductor) takes the slot back and answers whole; then every thread ends,
    those asleep waiting for the slot included."""
    srv = Server(threads=3, slot=serving_slot.Slot())
    try:
        sock = srv.connect()
        sock.sendall(b"GET /out-drain HTTP/1.1\r\nHost: x\r\n\r\n")
        assert srv.entered[b"out-drain"].wait(5)
        stopper = threading.Thread(target=srv.loop.stop, kwargs={"grace": 10})
        stopper.start()
        _wait_until(lambda: not srv.loop._accepting)
        assert stopper.is_alive()  # waiting for the request
        srv.gates[b"out-drain"].set()
        assert _answer(sock) == b"out-drain!"
        stopper.join(10)
        assert not stopper.is_alive()
        for thread in srv.loop._threads:
            thread.join(5)
            assert not thread.is_alive()
    finally:
        srv.release.set()
        srv.listener.close()
