"""The connection cap and deadlines: which connections a collector's HTTP server
lets go, told what happens and when (no sockets, no sleeping)."""

from commviz.serving.guard import Guard, Why


def test_at_the_cap_the_oldest_idle_connection_makes_room_for_the_new_one():
    g = Guard(cap=3, deadline_s=10)
    for k in "abc":
        assert g.opened(k, 0.0) == []
    g.asked("a")  # inside a handler: not idle
    assert g.opened("d", 1.0) == [("b", Why.EVICTED)]
    assert g.opened("e", 1.0) == [("c", Why.EVICTED)]
    assert len(g) == 3


def test_a_new_connection_is_refused_only_when_every_open_one_is_busy():
    g = Guard(cap=2, deadline_s=10)
    g.opened("a", 0.0)
    g.opened("b", 0.0)
    g.asked("a")
    g.asked("b")
    assert g.opened("c", 0.0) == [("c", Why.REFUSED)]
    g.answered("a", 1.0)  # writing its answer: idle again, and first to go
    assert g.opened("c", 1.0) == [("a", Why.EVICTED)]


def test_an_idle_connection_goes_at_its_deadline_and_asking_again_buys_another():
    g = Guard(cap=10, deadline_s=10)
    g.opened("half", 0.0)  # sent half a request
    g.opened("keepalive", 0.0)
    g.asked("keepalive")
    g.answered("keepalive", 5.0)
    assert g.expired(9.9) == []
    assert g.expired(10.0) == [("half", Why.TIMED_OUT)]
    assert g.expired(14.9) == []
    assert g.expired(15.0) == [("keepalive", Why.TIMED_OUT)]
    assert len(g) == 0


def test_a_connection_inside_a_handler_never_times_out_there():
    g = Guard(cap=10, deadline_s=1)
    g.opened("slow summary", 0.0)
    g.asked("slow summary")
    assert g.expired(100.0) == []
    g.closed("slow summary")
    assert len(g) == 0 and g.expired(200.0) == []
