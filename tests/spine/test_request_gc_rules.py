"""Rule 1 for request events: `probe.request` and `probe.request_tokens` cause nothing they measure.

The same proofs as test_probe_gc_rules.py gives the step wrappers, with
automatic GC disabled: a loop of calls adds exactly as many GC-tracked
objects as the same loop with no probe (zero net per call: the gen-0 count
of `gc.get_count()` compared window by window), leaves no cyclic garbage,
and never raises, bad arguments included (they are counted in `errors` and
`request_errors`). Every case runs with no daemon listening and with a live
one, on a probe whose spans use the C record write (where it is built) and
on one whose spans use the Python write: request events are written by the
same Python code in both, and must keep the rules next to either.
"""

import gc
import threading

import pytest

import probe_client
from helpers.waiting import wait_for
from probe_client import wire

pytestmark = pytest.mark.daemon

N = 3000


@pytest.fixture(scope="module")
def live_daemon(tmp_path_factory):
    from helpers.daemonproc import DaemonProcess

    d = DaemonProcess(tmp_path_factory.mktemp("request-rules")).start()
    yield d
    assert d.stop()[0] == 0


@pytest.fixture(
    params=["no-daemon", "live-daemon", "no-daemon/python-write", "live-daemon/python-write"]
)
def probe(request, tmp_path, monkeypatch):
    if request.param.endswith("/python-write"):
        monkeypatch.setenv("STALLSCOPE_PROBE_ACCEL", "python")
    if request.param.startswith("no-daemon"):
        p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    else:
        p = probe_client.connect(
            socket_path=request.getfixturevalue("live_daemon").socket, gc=False
        )
        assert p.connected
        # the flusher's thread-state report makes its lasting objects once,
        # right after connect: before any window counts
        assert wait_for(lambda: p.stats()["pythreads_status"] is not None, 10)
    want = "python" if request.param.endswith("/python-write") else probe_client.ACCELERATOR
    assert p.accelerator == want
    yield p
    p.close()


@pytest.fixture(autouse=True)
def no_flusher_left():
    yield
    assert wait_for(
        lambda: not [t for t in threading.enumerate() if t.name == "stallscope-flush"], 5
    )


def _delta(fn, n=N):
    for i in range(50):
        fn(i)
    before = gc.get_count()[0]
    for i in range(n):
        fn(i)
    return gc.get_count()[0] - before


def _plain(i):
    return None


IDS = list(range(10_000, 10_256))
STR_IDS = [f"cmpl-{i:032x}-0" for i in range(256)]
ONES = [1] * 256


class _State:
    """A request's state, as an engine keeps one (transformers' RequestState)."""

    def __init__(self, request_id, limit):
        self.request_id = request_id
        self.status = 2
        self.n = 0
        self.limit = limit

    def update(self, token):
        self.n += 1
        return self.n % self.limit == 0


def _forms(probe):
    """The preset request forms (docs/run.md) on fresh classes: a span with
    an `arrived` form, and a request-only form with a `then` event."""

    class Manager:
        def add_request(self, prompt, request_id=None):
            return request_id

    class State(_State):
        pass

    probe.attach(Manager, "add_request", kind="add", request='"arrived" if result else None',
                 request_id="result", request_tokens="len(prompt)")  # fmt: skip
    probe.attach(State, "update", kind="request",
                 request='"token" if result or self.status == 2 else None',
                 request_id="self.request_id", request_then='"finished" if result else None')  # fmt: skip
    return Manager(), State(STR_IDS[0], 4), State(7, 4)


def _calls(probe):
    """Each hot-path shape, as a callable of the loop index."""
    manager, str_state, int_state = _forms(probe) if probe is not None else (None, None, None)
    prompt = [1, 2, 3]
    return {
        "form: arrived, str id": lambda i: manager.add_request(prompt, STR_IDS[i & 255]),
        "form: token (+finished), str id": lambda i: str_state.update(i),
        "form: token (+finished), int id": lambda i: int_state.update(i),
        "int token": lambda i: probe.request(i, "token", tokens=1),
        "int arrived": lambda i: probe.request(i, "arrived"),
        "str arrived (sends its text)": lambda i: probe.request(STR_IDS[i & 255], "arrived", 12),
        "str token": lambda i: probe.request(STR_IDS[i & 255], "token"),
        "finished": lambda i: probe.request(i, "finished"),
        "batch of ints": lambda i: probe.request_tokens(IDS, ONES),
        "batch, one count": lambda i: probe.request_tokens(IDS, 1),
        "batch of strs": lambda i: probe.request_tokens(STR_IDS, ONES),
        "bad event": lambda i: probe.request(i, "nonsense"),
        "negative tokens": lambda i: probe.request(i, "token", tokens=-1),
    }


@pytest.mark.parametrize("shape", list(_calls(None)))
def test_zero_net_tracked_objects_per_call(probe, gc_off, shape):
    fn = _calls(probe)[shape]
    n = N // 10 if shape.startswith("batch") else N
    plain = _delta(_plain, n)
    # the count is process-wide: a live probe's flusher may be mid-send at a
    # window's edge, so a window is retried before it counts as a failure
    traced = [_delta(fn, n) for _ in range(3)]
    assert plain in traced, (plain, traced)
    if shape in ("bad event", "negative tokens"):
        assert probe.request_errors == 3 * (n + 50)  # each window warms up with 50
    else:
        assert probe.errors == 0


def test_no_cyclic_garbage_and_every_bad_call_is_counted(probe, gc_off):
    gc.collect()
    for i in range(2000):
        probe.request(STR_IDS[i & 255], "arrived")
        probe.request(i, "scheduled")
        probe.request_tokens(IDS, ONES)
        probe.request(i, "finished")
    assert gc.collect() == 0
    assert probe.errors == 0 and probe.request_errors == 0
    probe.request(1, "started")  # not an event
    probe.request(1, "token", tokens=-3)
    probe.request(1, "token", tokens=1 << 40)  # beyond the wire's 32 bits
    probe.request(object(), "token")  # neither int nor str
    probe.request([1], "token")
    probe.request(1, ["token"])  # unhashable event
    probe.request_tokens(IDS[:3], [1, -1, 2])  # one bad count of three
    probe.request_tokens([1, None, 2], 1)  # one bad id
    probe.request_tokens(IDS, -1)  # a bad count for all 256
    assert probe.request_errors == 6 + 1 + 1 + 256
    assert probe.errors == probe.request_errors
    assert probe.stats()["request_errors"] == probe.request_errors


def test_a_full_buffer_is_sent_not_overrun(probe):
    """Batches larger than a datagram and str arrivals that need five
    records each land in order, whole, in datagrams that never overflow."""
    before = probe.stats()["next_seq"]
    for _ in range(5):
        probe.request_tokens(list(range(1000)), 1)
        for s in STR_IDS:
            probe.request(s, "arrived")
    assert probe.errors == 0
    # 5 x (1000 + 256 x (1 REQUEST + 2 REQUEST_TEXT)): every record numbered
    assert probe.stats()["next_seq"] - before == 5 * (1000 + 256 * 3)


def _buffer_after(monkeypatch, tmp_path, accel, calls):
    """The record bytes a fresh probe's buffer holds after `calls(probe)`,
    with the clock and thread id fixed so that two probes can be compared."""
    from probe_client import _requests

    if accel:
        monkeypatch.delenv("STALLSCOPE_PROBE_ACCEL", raising=False)
    else:
        monkeypatch.setenv("STALLSCOPE_PROBE_ACCEL", "python")
    monkeypatch.setattr(_requests, "_monotonic_ns", lambda: 123_456_789_012)
    p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    try:
        assert p.accelerator == ("c" if accel else "python")
        p._thread_state().tid = 4321
        calls(p)
        return bytes(p._buf[32 : p._pos]), p.stats()["next_seq"], p.errors
    finally:
        p.close()


@pytest.mark.skipif(probe_client.ACCELERATOR != "c", reason="the C record write is not built")
def test_the_c_batch_write_writes_the_python_bytes(monkeypatch, tmp_path):
    from probe_client import _accel

    def calls(p):
        p.request_tokens(IDS, 1)
        p.request_tokens([0, -1, 1 << 64, (1 << 64) + 5, -(1 << 70), True], 7)  # masked to 64 bits
        p.request_tokens([1, 2, "req-\u00e9", 3, "req-x"], 2)  # C stops at a non-ASCII str
        p.request_tokens((9, 8, 7), 0)  # a tuple
        p.request_tokens(STR_IDS[:40], 3)  # ASCII str ids: hashed in C
        p.request_tokens([5, _SameHash("req-y"), 6], 1)  # a str subclass: Python

    def overflow(p):
        calls(p)
        p.request_tokens(list(range(600)), 1)  # past a datagram: a send in the middle

    c = _buffer_after(monkeypatch, tmp_path, True, calls)
    py = _buffer_after(monkeypatch, tmp_path, False, calls)
    assert c == py and c[2] == 0 and len(c[0]) == 32 * (256 + 6 + 5 + 3 + 40 + 3)
    # what is left after the send (written by the Python path after the C
    # write stopped at the buffer's end) and the sequence numbers agree too
    assert _buffer_after(monkeypatch, tmp_path, True, overflow) == _buffer_after(
        monkeypatch, tmp_path, False, overflow
    )
    # and it was the C write: it takes a whole batch of ints itself
    p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    try:
        st = p._thread_state()
        held = p._lock.locked
        assert _accel.request_tokens(p.__dict__, p._buf, held, 16000, 5, st.tid, IDS, 1) == 256
        assert p._pos == 32 + 256 * 32
        with p._lock:  # a thread holds the lock: nothing written
            assert _accel.request_tokens(p.__dict__, p._buf, held, 16000, 5, 1, IDS, 1) == 0
        assert _accel.request_tokens(p.__dict__, p._buf, held, 16000, 5, 1, IDS, -1) == 0
        n = _accel.request_tokens(p.__dict__, p._buf, held, 16000, 5, 1, STR_IDS[:3] + [b"x"], 1)
        assert n == 3 and p._pos == 32 + 259 * 32  # str ids hashed, stopped at the bytes
        assert _accel.request_tokens(p.__dict__, p._buf, held, 16000, 5, 1, "abc", 1) == 0
        assert _accel.request_tokens() == 0  # never raises
        assert p._pos == 32 + 259 * 32
    finally:
        p.close()


@pytest.mark.skipif(probe_client.ACCELERATOR != "c", reason="the C record write is not built")
def test_the_c_single_write_writes_the_python_bytes(monkeypatch, tmp_path):
    from probe_client import _accel

    def calls(p):
        for i, event in enumerate(("scheduled", "token", "preempted", "finished", "aborted")):
            p.request(1000 + i, event)
            p.request(STR_IDS[i], event, tokens=i)  # a str id: its key, flag REQ_STR_ID
        p.request((1 << 64) + 3, "token", tokens=(1 << 31) - 1)  # masked id, the largest count
        p.request(-1, "finished", ts_ns=42)  # a given time
        p.request(STR_IDS[7], "arrived", 9)  # with its text: the Python write
        p.request(5, "arrived")  # an int arrival: no text, C
        p.request("req-\u00e9", "token")  # not ASCII: hashed in Python
        p.request(_SameHash("req-z"), "finished")  # a str subclass: Python

    def overflow(p):
        calls(p)
        for i in range(600):  # past a datagram: the sends fall between C writes
            p.request(i, "token")

    c = _buffer_after(monkeypatch, tmp_path, True, calls)
    py = _buffer_after(monkeypatch, tmp_path, False, calls)
    assert c == py and c[2] == 0 and len(c[0]) == 32 * (10 + 2 + 3 + 1 + 2)
    assert _buffer_after(monkeypatch, tmp_path, True, overflow) == _buffer_after(
        monkeypatch, tmp_path, False, overflow
    )
    # and it was the C write, which declines (nothing written) when a
    # thread holds the lock, a send is due or an argument is out of range
    p = probe_client.connect(socket_path=str(tmp_path / "absent.sock"), gc=False)
    try:
        held = p._lock.locked
        args = (p.__dict__, p._buf, held, 16000, 5, 7)
        assert _accel.request_one(*args, 3, 1, 99, 1) is True and p._pos == 64
        assert bytes(p._buf[32:64]) == bytes(
            wire.REQUEST_RECORD.pack(wire.REC_REQUEST, 3, 1, 7, 5, 99, 1, 0)
        )
        with p._lock:
            assert _accel.request_one(*args, 3, 1, 99, 1) is False
        assert _accel.request_one(p.__dict__, p._buf, held, 64, 5, 7, 3, 1, 99, 1) is False
        for bad in ((0, 1, 99, 1), (3, 1, 99, 1 << 31), (3, 1 << 16, 99, 1), (3, 1, b"x", 1),
                    (3, 1, "\u00e9", 1), (3, 1, _SameHash("x"), 1), (3, 1, 99, True),
                    (1, 0, "req-1", 0), (3, 1, 99.0, 1)):  # fmt: skip
            assert _accel.request_one(*args, *bad) is False, bad
        assert _accel.request_one() is False  # never raises
        assert p._pos == 64
        # an int id is masked to 64 bits, a str id hashed and flagged, as in Python
        assert _accel.request_one(*args, 3, 1, -1, 1) is True
        assert _accel.request_one(*args, 3, 1, "req-1", 1) is True
        assert bytes(p._buf[64:128]) == wire.REQUEST_RECORD.pack(
            wire.REC_REQUEST, 3, 1, 7, 5, wire.U64_MAX, 1, 0
        ) + wire.REQUEST_RECORD.pack(
            wire.REC_REQUEST, 3, 1 | wire.REQ_STR_ID, 7, 5, wire.request_key(b"req-1"), 1, 0
        )
    finally:
        p.close()


class _SameHash(str):
    """A str id of a subclass (its own __hash__ and __eq__): the Python path hashes it."""

    def __hash__(self):
        return 1

    def __eq__(self, other):
        return True


@pytest.mark.skipif(probe_client.ACCELERATOR != "c", reason="the C record write is not built")
def test_the_c_hash_of_a_str_id_is_the_wire_key_at_every_length():
    """_accel hashes ASCII str ids itself (BLAKE2b-64): the same key as
    wire.request_key() at every length across the 128-byte block edges,
    and it leaves every other str to Python."""
    import random
    import string

    from probe_client import _accel

    r = random.Random(7)
    for n in range(0, 300):
        s = "".join(r.choice(string.printable) for _ in range(n))
        assert _accel.request_key(s) == wire.request_key(s.encode()), n
    for other in ("\u00e9", "req-\U0001f600", _SameHash("x"), b"x", 5):
        assert _accel.request_key(other) is None, other
