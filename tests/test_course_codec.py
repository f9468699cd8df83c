"""The channel's values, live (a4's and a6's policies stay in the sandbox between calls):
what travels for a request sent again, a policy's handle, the tests' objects coming back, and
the stand-in the tests hold (`course/codec.py`, `course/channel.py`, `course/caller.py`). No
sandbox: both ends in this process, the messages through JSON as on the pipe."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from minivtc.course.caller import Session
from minivtc.course.channel import ChannelError, Opaque, receive, state_of
from minivtc.course.codec import Codec
from minivtc.course.worker import answer, describe_class, lives
from minivtc.fairness.vtc import VTC
from minivtc.requests.params import SamplingParams
from minivtc.requests.request import Request, Status


def ends() -> tuple[Codec, Codec]:
    """The tests' end and the sandbox's, live."""
    return Codec(trusted=True, live=lambda handle, name: None), Codec(False, live=lives((), None))


def through(node: Any) -> Any:
    return json.loads(json.dumps(node))


def test_a_request_sent_again_travels_as_its_changes():
    tests, sandbox = ends()
    r = Request("r1", "a", [5] * 300, SamplingParams(max_tokens=100), 0.0)
    first = through(tests.encode([r]))
    (copy,) = sandbox.decode(first)
    r.output_ids += [7, 8]
    r.status, r.num_computed = Status.RUNNING, 301
    again = through(tests.encode([r]))
    assert len(json.dumps(again)) < len(json.dumps(first)) / 4, again  # no prompt this time
    assert sandbox.decode(again)[0] is copy
    assert state_of(copy) == state_of(r)


def deep(v: Any) -> Any:
    """A request's fields, its parameters' and its lists', as values (types count)."""
    if isinstance(v, (Request, SamplingParams)):
        return {k: deep(x) for k, x in state_of(v).items()}
    if isinstance(v, (list, tuple)):
        return [deep(x) for x in v]
    return (type(v), v)


def test_a_request_unchanged_travels_as_its_id_and_a_step_as_what_it_changed():
    tests, sandbox = ends()
    r = Request("r1", "a", [5] * 300, SamplingParams(max_tokens=100), 0.0)
    (copy,) = sandbox.decode(through(tests.encode([r])))
    assert through(tests.encode([r]))["list"] == [{"ref": id(r)}]
    r.output_ids.append(7)
    r.num_computed = 301
    step = through(tests.encode([r]))
    grown = {"grown": id(r.output_ids), "list": [7]}
    assert step["list"] == [{"delta": id(r), "set": [["num_computed", 301], ["output_ids", grown]]}]
    assert sandbox.decode(step)[0] is copy
    assert deep(copy) == deep(r)


def test_whatever_the_tests_change_between_calls_reaches_the_sandbox_s_copy():
    """A request sent again as its changes: after each of these, the sandbox's copy equals
    the tests' request, field by field, its lists and its parameters included (a field set
    to an equal value of another type, a list changed before its end, a list that replaced
    a value and then grew, parameters changed in place, one parameters object shared)."""
    tests, sandbox = ends()
    shared = SamplingParams(max_tokens=100)
    r = Request("r1", "a", [5] * 8, shared, 0.0)
    s = Request("r2", "b", [6] * 4, shared, 0.0)
    copies = sandbox.decode(through(tests.encode([r, s])))
    changes = [
        lambda: r.output_ids.extend([7, 8]),
        lambda: setattr(r, "num_computed", 10),
        lambda: setattr(r, "num_computed", 10.0),
        lambda: r.output_ids.__setitem__(0, 9),
        lambda: setattr(r, "status", Status.RUNNING),
        lambda: setattr(r, "logprobs", []),
        lambda: r.logprobs.append(-0.5),
        lambda: r.logprobs.append(-0.25),
        lambda: setattr(r, "output_ids", [1]),
        lambda: r.output_ids.append(2),
        lambda: object.__setattr__(shared, "temperature", 0.5),
        lambda: r.prompt_ids.pop(),
        lambda: setattr(s, "params", SamplingParams(max_tokens=3)),
        lambda: object.__setattr__(shared, "max_tokens", 50),
        lambda: object.__setattr__(shared, "note", "a field it did not have"),
    ]
    for change in changes:
        change()
        assert sandbox.decode(through(tests.encode([r, s]))) == copies
        assert deep(copies) == deep([r, s])
    assert copies[0].params is not copies[1].params


def test_changes_of_what_was_never_sent_are_refused():
    """By the sandbox (it holds no such copy) and by the tests' side (it never takes changes:
    what comes back is whole, checked, or the tests' own)."""
    tests, sandbox = ends()
    r = Request("r1", "a", [5] * 3, SamplingParams(max_tokens=4), 0.0)
    (copy,) = sandbox.decode(through(tests.encode([r])))
    for end in (sandbox, tests):
        with pytest.raises(ChannelError, match="never sent"):
            end.decode({"delta": 7, "set": []})
        with pytest.raises(ChannelError, match="never sent"):
            end.decode({"grown": 8, "list": [1]})
    with pytest.raises(ChannelError, match="never sent"):
        tests.decode({"delta": id(r), "set": [["num_cached", 3]]})
    with pytest.raises(ChannelError, match="never sent"):  # (a request is no list)
        sandbox.decode({"grown": id(r), "list": [1]})
    with pytest.raises(ChannelError, match="by name"):
        sandbox.decode({"delta": id(r), "set": [[1, 3]]})
    with pytest.raises(ChannelError, match="plain"):
        sandbox.decode({"grown": id(r.output_ids), "list": [{"obj": "os:system"}]})
    assert r.num_cached == copy.num_cached == 0


def test_the_tests_objects_come_back_as_themselves():
    """What the sandbox did to its copy of a request is not taken: the request is the tests'."""
    tests, sandbox = ends()
    r = Request("r1", "a", [5] * 3, SamplingParams(max_tokens=4), 0.0)
    (copy,) = sandbox.decode(through(tests.encode([r])))
    copy.num_cached = 3
    answer = through(sandbox.encode([copy]))
    assert answer["list"][0] == {"ref": id(r)}
    (back,) = tests.decode(answer)
    assert back is r and r.num_cached == 0


def test_a_policy_made_in_the_sandbox_stays_there():
    _, sandbox = ends()
    vtc = VTC()
    node = through(sandbox.encode(vtc))
    assert node == {"handle": node["handle"], "class": "minivtc.fairness.vtc:VTC"}
    assert sandbox.decode({"handle": node["handle"]}) is vtc
    ledger = through(sandbox.encode(vtc.ledger))
    assert "handle" in ledger and ledger["handle"] != node["handle"]
    counters = sandbox.encode(vtc.counters)  # a value: copied
    assert "handle" not in counters
    with pytest.raises(ChannelError, match="handle"):
        sandbox.decode({"handle": 12345})


def test_the_tests_own_helper_is_called_back():
    """A test's predictor stays the test's: the sandbox calls its methods back."""
    calls = []
    helper = Opaque(3, lambda ident, args, kwargs, method=None: calls.append((ident, args, method)))
    helper.observe("done")
    assert calls == [(3, ("done",), "observe")]
    with pytest.raises(AttributeError):
        _ = helper._private


class Asked(Session):
    """A session whose sandbox answers every read with `value`, recording what was asked."""

    def __init__(self, value: Any) -> None:
        super().__init__({"deadline": 0, "live": []})
        self.value = value
        self.asked: list[tuple[dict, tuple]] = []

    def ask(self, message: dict, args: tuple, kwargs: dict, later: bool = False) -> Any:
        self.asked.append((message, args))
        return self.value


def test_the_stand_in_reads_the_object_in_the_sandbox_not_its_base_s_class():
    """`Scheduler.name` is "base" on the class here; the VTC in the sandbox holds its own."""
    session = Asked("vtc")
    try:
        stand_in = session.stand_in(
            "minivtc.fairness.vtc", "VTC", describe_class(VTC, Codec(False))
        )
        policy = session.remote(-1, "minivtc.fairness.vtc:VTC")
        assert isinstance(policy, stand_in) and stand_in.name == "base"
        assert policy.name == "vtc" and policy.counters == "vtc"
        assert [m for m, _ in session.asked] == [
            {"get": "name", "self": -1},
            {"get": "counters", "self": -1},
        ]
        policy.name = "mine"
        assert session.asked[-1] == ({"set": "name", "self": -1}, ("mine",))
    finally:
        session.close()


RAISED = {"raised": {"type": "builtins:ValueError", "message": "broken"}}
RAISED_LATER = RAISED | {"later": True}  # (a call left for later answers only if it raised)
OK = {"ok": Codec(trusted=False).encode([None, [], {}])}


class Piped(Session):
    """A session whose worker's answers are `replies`, in order; what it is sent is read back
    by `sent` (the pipe's two ends are the session's inbox and outbox)."""

    def __init__(self, replies: list[dict]) -> None:
        super().__init__({"deadline": 0, "live": []})
        self.replies, self.process = replies, object()
        self.inbox, self.outbox = os.pipe()

    def await_reply(self) -> dict:
        if not self.replies:
            raise ChannelError("no answer")
        return self.replies.pop(0)

    def sent(self) -> dict:
        return receive(self.inbox, float("inf"))

    def stop(self) -> None:  # (no sandbox to kill: a failed call stops the session)
        self.unread = 0

    def close(self) -> None:
        os.close(self.inbox)
        os.close(self.outbox)
        self.process = None
        super().close()


def test_a_method_s_answer_read_later_still_fails_the_next_call():
    """`caller.LATER`: `on_decode` is not waited for, but its failure comes with the next
    call's answer, before that call returns."""
    session = Piped([RAISED_LATER, OK])
    try:
        assert session.ask({"call": "on_decode"}, (), {}, later=True) is None
        assert session.sent()["later"] and session.unread == 1
        with pytest.raises(ValueError, match="broken"):
            session.ask({"call": "peek"}, (), {})
        assert "later" not in session.sent()
        assert session.unread == 0 and not session.replies
    finally:
        session.close()


def test_an_answer_left_for_later_is_read_at_the_test_s_end():
    session = Piped([RAISED_LATER, OK, OK])
    try:
        session.ask({"call": "on_finish"}, (), {}, later=True)
        with pytest.raises(ValueError, match="broken"):
            session.settle()
        session.ask({"call": "on_finish"}, (), {}, later=True)
        session.ask({"call": "on_finish"}, (), {}, later=True)
        session.settle()  # (two calls that did not raise: no answer but the settling call's)
        assert session.unread == 0 and not session.replies
    finally:
        session.close()


def test_nothing_is_left_for_later_once_the_sandbox_may_call_the_tests_back():
    session = Piped([OK])
    try:
        session.codec.callable_sent = True  # (a test's predictor was sent: see above)
        session.ask({"call": "on_finish"}, (), {}, later=True)
        assert "later" not in session.sent()
        assert session.unread == 0 and not session.replies
    finally:
        session.close()


def test_only_a_call_left_for_later_that_raised_is_answered():
    """The sandbox's side: no answer to a call left for later unless it raised (saying so);
    the tests' side: an answer to such a call that is not a failure, or answers past the calls
    sent, fail the call."""
    sandbox = Codec(trusted=False)
    call = {"call": "builtins:len", "args": sandbox.encode([[[1, 2]], {}])}
    assert Codec(trusted=True).decode(answer(sandbox, call)["ok"])[0] == 2
    assert answer(sandbox, call | {"later": 1}) is None
    broken = {"call": "builtins:len", "args": sandbox.encode([[3], {}]), "later": 1}
    assert answer(sandbox, broken)["later"] and "TypeError" in str(answer(sandbox, broken))
    for replies in ([OK | {"later": True}, OK], [RAISED_LATER, RAISED_LATER]):
        session = Piped(replies)
        try:
            session.ask({"call": "on_finish"}, (), {}, later=True)
            with pytest.raises(ChannelError, match="answer"):
                session.ask({"call": "peek"}, (), {})
        finally:
            session.close()
