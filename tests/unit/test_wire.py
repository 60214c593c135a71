import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.transport_helpers import make_group
from transport import wire


def _frames_bytes(frames):
    return [bytes(f) for f in frames]


def test_group_round_trip():
    g = make_group("a0:7", n=6, length=9)
    back = wire.decode(_frames_bytes(wire.encode(g)))
    assert back.group_id == "a0:7" and back.n == 6 and back.policy_version == 0
    for name in ("prompt_ids", "lengths", "tokens", "logprobs", "rewards", "correct", "finish"):
        np.testing.assert_array_equal(getattr(back, name), getattr(g, name))
    assert [len(c) for c in back.completions()] == [9] * 6
    assert np.allclose(np.concatenate(back.completion_logprobs()), g.logprobs)


@pytest.mark.parametrize("msg", [
    wire.WorkRequest("a", 3, 5), wire.Hello("a", -1, "tok"), wire.Heartbeat("a", 2, 1, 0),
    wire.WorkAssignment([wire.PromptItem(1, "2+2=", "4", "synthetic", "t1")]), wire.GroupAck(["a:1", "a:2"]),
    wire.Snapshot(4, 2, {"math": "verifiers.math"}, False), wire.Control(9, "version", {"version": 3}),
    wire.Snapshot(5, 2, {}, False, {}, "e", False, 3), wire.Control(10, "compute", {"step": 3}),
])
def test_header_messages_round_trip(msg):
    assert wire.decode(_frames_bytes(wire.encode(msg))) == msg


def _tamper(frames, **header_changes):
    h = orjson.loads(frames[0])
    h.update(header_changes)
    return [orjson.dumps(h)] + frames[1:]


@pytest.mark.parametrize("mutate, why", [
    (lambda f: [b"not json"] + f[1:], "not JSON"),
    (lambda f: _tamper(f, v=99), "schema version"),
    (lambda f: _tamper(f, msg="nope"), "unknown message kind"),
    (lambda f: f[:-1], "array frames"),
    (lambda f: f[:3] + [f[3][:-4]] + f[4:], "bytes"),
    (lambda f: _tamper(f, group_id=5), "group_id"),
    (lambda f: _tamper(f, policy_version="3"), "policy_version"),
    (lambda f: _tamper(f, policy_version=True), "policy_version"),
    (lambda f: _tamper(f, reasons=["only one"]), "reasons"),
    (lambda f: f[:4] + [np.full(20, np.nan, np.float32).tobytes()] + f[5:], "logprobs"),
    (lambda f: f[:2] + [np.array([5, 5, 5, -1], np.int32).tobytes()] + f[3:], "negative"),
    (lambda f: f[:6] + [np.array([0, 1, 7, 1], np.uint8).tobytes()] + f[7:], "correct"),
    (lambda f: [], "empty"),
])
def test_malformed_group_rejected(mutate, why):
    frames = _frames_bytes(wire.encode(make_group("a:1", n=4, length=5)))
    with pytest.raises(wire.WireError, match=why):
        wire.decode(mutate(frames))


def test_dtype_and_shape_spec_checked():
    frames = _frames_bytes(wire.encode(make_group("a:1")))
    h = orjson.loads(frames[0])
    h["arrays"][2]["dtype"] = "float64"
    with pytest.raises(wire.WireError, match="dtype"):
        wire.decode([orjson.dumps(h)] + frames[1:])
    h = orjson.loads(frames[0])
    h["arrays"][2]["shape"] = [2, 10]
    with pytest.raises(wire.WireError, match="shape"):
        wire.decode([orjson.dumps(h)] + frames[1:])


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_mutated_frames_never_escape_as_other_errors(data):
    frames = _frames_bytes(wire.encode(make_group("a:1", n=3, length=4)))
    i = data.draw(st.integers(0, len(frames) - 1))
    b = bytearray(frames[i])
    for _ in range(data.draw(st.integers(1, 8))):
        if not b:
            break
        pos = data.draw(st.integers(0, len(b) - 1))
        b[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        b = b[: data.draw(st.integers(0, len(b)))]
    frames[i] = bytes(b)
    try:
        wire.decode(frames)
    except wire.WireError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=9))
def test_random_frames_only_raise_wire_error(frames):
    try:
        wire.decode(frames)
    except wire.WireError:
        pass
