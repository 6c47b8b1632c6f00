"""The audit against torch's flight recorder: a backend op created inside one of the
rank's events on the same group is seen, anything else is unseen, counted per op
name; a recorder that cannot be compared says why and nothing else."""

from commviz.events import Audit, BackendOp
from commviz.model import Model
from commviz.model.audit import Windows, compare
from tests.helpers import WALL0, group, hello, op

MS = 1_000_000


def fed(*events) -> Model:
    m = Model()
    m.ingest(0, hello(0, world=2))
    m.ingest(0, group("0", (0, 1)))
    m.ingest(0, group("7", (0, 1)))
    for e in events:
        m.ingest(0, e)
    return m


def audit_of(m: Model) -> dict:
    (pr,) = [p for p in m.summary()["per_rank"] if p["rank"] == 0]
    return pr["audit"]


def backend(group: str, name: str, mono: int) -> BackendOp:
    return BackendOp(group, name, WALL0 + mono)  # hello(0): wall = WALL0 + mono


def test_ops_inside_events_are_seen_and_the_rest_unseen():
    m = fed(*op(1, 10 * MS, 20 * MS, seq=0), *op(2, 30 * MS, 40 * MS, name="broadcast_object_list", seq=1),
            Audit(100 * MS, WALL0 + 100 * MS, "", [
                backend("0", "all_reduce", 15 * MS),
                backend("0", "broadcast", 31 * MS), backend("0", "broadcast", 39 * MS),  # one call, two ops
                backend("0", "all_reduce", 50 * MS),  # between events: a ProcessGroup method called directly
                backend("7", "all_reduce", 35 * MS),  # inside an event, but of another group
            ]))
    a = audit_of(m)
    assert a == {"backend": {"all_reduce": 3, "broadcast": 2}, "seen": {"all_reduce": 1, "broadcast": 2},
                 "unseen": {"all_reduce": 2}}
    assert all(a["seen"][k] + a["unseen"].get(k, 0) == n for k, n in a["backend"].items())
    assert m.rank_rows(m.last_t)[0].unseen == {"all_reduce": 2}


def test_an_op_still_in_flight_covers_what_the_backend_started_for_it():
    start, _ = op(1, 10 * MS, 0)
    m = fed(start, Audit(100 * MS, WALL0 + 100 * MS, "", [backend("0", "all_reduce", 12 * MS)]))
    assert audit_of(m)["unseen"] == {}


def test_an_async_op_in_flight_does_not_cover_what_was_issued_after_a_later_call():
    first, _ = op(1, 10 * MS, 0, is_async=True)  # never waited on yet
    m = fed(first, *op(2, 20 * MS, 30 * MS, seq=1),
            Audit(100 * MS, WALL0 + 100 * MS, "", [backend("0", "all_reduce", 11 * MS),  # issued by op 1
                                                   backend("0", "all_reduce", 21 * MS),  # by op 2
                                                   backend("0", "broadcast", 50 * MS)]))  # by nobody
    assert audit_of(m)["unseen"] == {"broadcast": 1}


def test_an_entry_the_recorder_names_no_group_is_seen_inside_any_event():
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps groups in a ProcessGroupWrapper
    and its recorder entries carry no group name (torch's own suite runs so)."""
    m = fed(*op(1, 10 * MS, 20 * MS, name="all_gather_object", gid="7"),
            *op(2, 12 * MS, 13 * MS, seq=0),  # another group's, started later, over before the second entry
            Audit(100 * MS, WALL0 + 100 * MS, "", [backend("", "all_gather", 12 * MS),
                                                   backend("", "all_gather", 15 * MS),
                                                   backend("", "all_gather", 50 * MS)]))  # inside no event
    assert audit_of(m)["unseen"] == {"all_gather": 1}


def test_the_recorder_clock_drifting_from_the_monotonic_one_is_corrected():
    # the wall clock gained 5 ms over the run (slewing): without interpolation the
    # backend op at mono 500 ms would land 5 ms late, past its 1 ms event
    drift = 5 * MS
    m = fed(*op(1, 500 * MS, 501 * MS),
            Audit(1000 * MS, WALL0 + 1000 * MS + 2 * drift, "", [BackendOp("0", "all_reduce", WALL0 + 500 * MS + drift + MS // 2)]))
    assert audit_of(m)["unseen"] == {}


def test_a_state_is_all_there_is_when_the_recorder_cannot_be_compared():
    m = fed(*op(1, 10, 20), Audit(100, WALL0 + 100, "off: torch's flight recorder is off"))
    assert audit_of(m) == {"state": "off: torch's flight recorder is off"}
    assert audit_of(fed(Audit(100, WALL0 + 100, "", []))) == {"state": "empty: the flight recorder holds no entries"}


def test_entries_older_than_the_events_kept_are_not_guessed_at():
    w = Windows(size=2)
    for k in range(3):
        w.add("0", k * MS, k * MS + 10)
    a = Audit(10 * MS, 10 * MS, "", [BackendOp("0", "all_reduce", 0)])
    assert compare(w, [], None, a)["state"].startswith("partial:")


def test_no_audit_no_key():
    assert "audit" not in fed(*op(1, 10, 20)).summary()["per_rank"][0]


def test_windows_survive_a_pickle_as_they_were():
    """A replay's seek checkpoints pickle the model: the windows come back the same,
    wrapped ring and dropped-before included, and go on the same."""
    import pickle

    w = Windows(size=4)
    for i in range(7):
        w.add(f"g{i % 3}", 1_000 + 10 * i, 1_005 + 11 * i)
    back = pickle.loads(pickle.dumps(w))
    assert back.ended == w.ended and back.dropped_before == w.dropped_before == 1_020
    back.add("g9", 5_000, 5_001)
    w.add("g9", 5_000, 5_001)
    assert back.ended == w.ended and len(back) == 4
    assert pickle.loads(pickle.dumps(Windows())).ended == []


def test_a_window_takes_a_batch_as_one_op_at_a_time_would_ring_turned_or_not():
    """The batch path adds a rank's ops to its window at once, writing over the oldest
    in place once the ring is full: what the window holds, in order, and the newest
    start pushed out are those of adding each op on its own, however the batches
    fall against the ring's turn (longer than the ring, or only its newest `size`
    given with the newest start of the rest as `pushed`, as `ledger.windows_many` does;
    single adds in between)."""
    import random

    rng = random.Random(7)
    for size in (1, 2, 5, 16):
        one, many = Windows(size=size), Windows(size=size)
        t = 0
        for _ in range(80):
            n = rng.choice([0, 1, 2, size - 1, size, size + 1, 2 * size + 3, rng.randrange(3 * size + 2)])
            ops = [(f"g{rng.randrange(3)}", t + rng.randrange(50)) for _ in range(n)]  # starts not in order
            t += 60
            for g, s in ops:
                one.add(g, s, s + 5)
            pushed = None
            if n > size and rng.random() < 0.5:
                pushed, ops = max(s for _, s in ops[:n - size]), ops[n - size:]
            many.extend([g for g, _ in ops], [s for _, s in ops], [s + 5 for _, s in ops], pushed)
            assert many.ended == one.ended and many.dropped_before == one.dropped_before
            if rng.random() < 0.3:
                one.add("g1", t, t + 1)
                many.add("g1", t, t + 1)
                t += 2
