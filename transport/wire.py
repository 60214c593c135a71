"""Every message that crosses between actors and learner, and its wire encoding.

A message is a ZeroMQ multipart message: frame 0 is an orjson header, frames 1.. are raw arrays
(C-contiguous, little-endian) described by the header's `arrays` list. Arrays are sent zero-copy
(`copy=False`). Every header carries `v` (the schema version) and `msg` (the message type).

Decoding (`decode`) validates everything before it returns — schema version, kind, field types, array
count, dtype, shape, byte size, cross-array consistency — and raises `WireError` otherwise, so nothing
half-decoded reaches the caller. Arrays come back as read-only numpy views of the received frames.

Message kinds and where they travel:
    WorkRequest     actor DEALER  -> learner ROUTER  (asks for up to `credits` prompts)
    Hello           actor DEALER  -> learner ROUTER  (join / rejoin; answered by Snapshot)
    Heartbeat       actor DEALER  -> learner ROUTER
    WorkAssignment  learner ROUTER -> actor DEALER
    GroupAck        learner ROUTER -> actor DEALER   (group ids received; the actor may forget them)
    Snapshot        learner ROUTER -> actor DEALER   (current control state, for a (re)joining actor)
    Admin           operator DEALER -> learner ROUTER (`brorl verifiers swap`), answered by AdminReply
    RolloutGroup    actor PUSH    -> learner PULL
    Control         learner ROUTER -> actor DEALER   (to every subscribed connection: transport/control.py)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from transport.messages import (PromptItem, WorkRequest, Hello, Heartbeat, Admin, AdminReply, WorkAssignment,
                                 GroupAck, Snapshot, Control, RolloutGroup)

SCHEMA_VERSION = 9  # raised whenever a message's fields change; a message of another version is rejected,
# both versions named
MAX_HEADER_BYTES = 1 << 20
MAX_REASON_CHARS = 200  # a verifier's reason per completion, as sent (the header of N = 2048 stays < 1 MiB)
ALLOWED_DTYPES = {"int32", "float32", "uint8"}
FINISH_REASONS = ("stop", "length", "abort", "error")
CONTROL_KINDS = ("version", "swap", "pause", "resume", "stop", "sync_ack", "weights", "compute")


class WireError(ValueError):
    """A frame sequence is not a valid message; the text says what is wrong."""


__all__ = ["SCHEMA_VERSION", "MAX_HEADER_BYTES", "MAX_REASON_CHARS", "ALLOWED_DTYPES", "FINISH_REASONS", "CONTROL_KINDS",
           "WireError", "max_frame_bytes", "encode", "decode", "PromptItem", "WorkRequest", "Hello", "Heartbeat", "Admin", "AdminReply", "WorkAssignment", "GroupAck", "Snapshot", "Control", "RolloutGroup"]


_ARRAYS = ("prompt_ids", "lengths", "tokens", "logprobs", "rewards", "correct", "finish", "versions")
_ARRAY_DTYPES = dict(zip(_ARRAYS, ("int32", "int32", "int32", "float32", "float32", "uint8", "uint8", "uint8")))
_HEADER_ONLY = {"work_request": WorkRequest, "hello": Hello, "heartbeat": Heartbeat,
                "assignment": WorkAssignment, "ack": GroupAck, "snapshot": Snapshot, "control": Control,
                "admin": Admin, "admin_reply": AdminReply}
_KIND_OF = {cls: kind for kind, cls in _HEADER_ONLY.items()} | {RolloutGroup: "group"}

# field name -> accepted python types, per header-only kind (validated on decode)
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "work_request": {"actor_id": (str,), "credits": (int,), "version": (int,), "returned": (list,)},
    "hello": {"actor_id": (str,), "version": (int,), "sync_token": (str,), "incarnation": (str,)},
    "heartbeat": {"actor_id": (str,), "version": (int,), "inflight": (int,), "unacked": (int,),
                  "checksum": (str,), "verifiers": (dict,), "error": (str,), "stats": (dict,), "group": (str,)},
    "assignment": {"items": (list,)},
    "ack": {"group_ids": (list,), "rejected": (dict,)},
    "snapshot": {"control_seq": (int,), "version": (int,), "verifiers": (dict,), "paused": (bool,),
                 "weights": (dict,), "epoch": (str,), "hello_needed": (bool,), "computing": (int,)},
    "control": {"seq": (int,), "kind": (str,), "payload": (dict,), "epoch": (str,)},
    "admin": {"command": (str,), "args": (dict,)},
    "admin_reply": {"ok": (bool,), "message": (str,)},
}
_GROUP_FIELDS = {"group_id": (str,), "prompt_id": (int,), "actor_id": (str,), "policy_version": (int,),
                 "verifier": (str,), "verifier_version": (str,), "timings": (dict,), "reasons": (list,)}


def max_frame_bytes(n_samples: int, max_tokens: int, max_model_len: int) -> int:
    """The largest frame a valid message of this job can have: a header, or a group's largest array (its
    N × max_tokens tokens or log-probs, or its prompt). Sockets refuse anything larger (ZMQ_MAXMSGSIZE)."""
    return max(MAX_HEADER_BYTES, 4 * n_samples * max_tokens, 4 * max_model_len) + 4096


def encode(msg: Any) -> list[Any]:
    """Message -> frames (header bytes, then arrays as buffers for zero-copy sends)."""
    kind = _KIND_OF.get(type(msg))
    if kind is None:
        raise TypeError(f"not a wire message: {type(msg).__name__}")
    if kind != "group":
        body = {k: getattr(msg, k) for k in _FIELDS[kind]}
        if kind == "assignment":
            body["items"] = [vars(it) for it in msg.items]
        return [orjson.dumps({"v": SCHEMA_VERSION, "msg": kind, **body})]
    arrays, specs = [], []
    for name in _ARRAYS:
        a = np.ascontiguousarray(getattr(msg, name), dtype=_ARRAY_DTYPES[name])
        arrays.append(a)
        specs.append({"name": name, "dtype": _ARRAY_DTYPES[name], "shape": list(a.shape)})
    header = {"v": SCHEMA_VERSION, "msg": "group", "arrays": specs,
              **{k: getattr(msg, k) for k in _GROUP_FIELDS}}
    return [orjson.dumps(header)] + [memoryview(a).cast("B") for a in arrays]


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise WireError(what)


def _typed(body: dict, fields: dict[str, tuple[type, ...]], kind: str) -> dict:
    out = {}
    for name, types in fields.items():
        _check(name in body, f"{kind}: missing field {name!r}")
        val = body[name]
        ok = isinstance(val, types) and not (isinstance(val, bool) and bool not in types)
        _check(ok, f"{kind}: field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(val).__name__}")
        out[name] = val
    return out


def decode(frames: list[Any]) -> Any:
    """Frames -> message, fully validated; raises WireError on anything malformed."""
    _check(len(frames) >= 1, "empty message")
    raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]
    size = memoryview(raw[0]).nbytes  # checked before the header is copied or parsed
    _check(size <= MAX_HEADER_BYTES, f"header of {size} bytes exceeds {MAX_HEADER_BYTES}")
    head = bytes(raw[0]) if not isinstance(raw[0], bytes) else raw[0]
    try:
        header = orjson.loads(head)
    except orjson.JSONDecodeError as e:
        raise WireError(f"header is not JSON: {e}") from None
    _check(isinstance(header, dict), "header is not an object")
    _check(header.get("v") == SCHEMA_VERSION, f"schema version {header.get('v')!r} != {SCHEMA_VERSION}")
    kind = header.get("msg")
    if kind in _HEADER_ONLY:
        _check(len(frames) == 1, f"{kind}: expected 1 frame, got {len(frames)}")
        return _decode_header_only(kind, header)
    _check(kind == "group", f"unknown message kind {kind!r}")
    return _decode_group(header, raw[1:])


def _decode_header_only(kind: str, header: dict) -> Any:
    body = _typed(header, _FIELDS[kind], kind)
    if kind == "assignment":
        items = []
        for i, it in enumerate(body["items"]):
            _check(isinstance(it, dict), f"assignment: items[{i}] is not an object")
            t = _typed(it, {"prompt_id": (int,), "prompt": (str,), "reference": (str,), "verifier": (str,),
                            "task_id": (str,), "prompt_token_ids": (list,), "source": (str,)}, f"assignment.items[{i}]")
            _check(all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in t["prompt_token_ids"]),
                   f"assignment.items[{i}]: prompt_token_ids must be token ids (ints >= 0)")
            items.append(PromptItem(**t))
        return WorkAssignment(items)
    if kind == "ack":
        _check(all(isinstance(g, str) for g in body["group_ids"]), "ack: group_ids must be strings")
        _check(all(isinstance(v, str) for v in body["rejected"].values()), "ack: rejected must map ids to reasons")
    if kind == "work_request":
        _check(body["credits"] >= 0, "work_request: credits must be >= 0")
        _check(all(isinstance(i, int) and not isinstance(i, bool) for i in body["returned"]),
               "work_request: returned must be prompt ids")
    if kind == "control":
        _check(body["kind"] in CONTROL_KINDS, f"control: unknown kind {body['kind']!r}")
    if kind == "heartbeat":
        _check(all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   for k, v in body["stats"].items()), "heartbeat: stats must map str to numbers")
    if kind == "snapshot":
        _check(all(isinstance(k, str) and isinstance(v, str) for k, v in body["verifiers"].items()),
               "snapshot: verifiers must map str to str")
    return _HEADER_ONLY[kind](**body)


def _decode_group(header: dict, frames: list[Any]) -> RolloutGroup:
    body = _typed(header, _GROUP_FIELDS, "group")
    specs = header.get("arrays")
    _check(isinstance(specs, list) and len(specs) == len(_ARRAYS), f"group: expected {len(_ARRAYS)} array specs")
    _check(len(frames) == len(_ARRAYS), f"group: expected {len(_ARRAYS)} array frames, got {len(frames)}")
    arrays = {}
    for name, spec, frame in zip(_ARRAYS, specs, frames):
        _check(isinstance(spec, dict) and spec.get("name") == name, f"group: array spec for {name!r} missing")
        dtype, shape = spec.get("dtype"), spec.get("shape")
        _check(dtype == _ARRAY_DTYPES[name], f"group: {name} dtype must be {_ARRAY_DTYPES[name]}, got {dtype!r}")
        _check(isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) and shape[0] >= 0
               and not isinstance(shape[0], bool), f"group: {name} shape must be [n >= 0], got {shape!r}")
        mv = memoryview(frame)
        nbytes = shape[0] * np.dtype(dtype).itemsize
        _check(mv.nbytes == nbytes, f"group: {name} frame has {mv.nbytes} bytes, shape {shape} needs {nbytes}")
        a = np.frombuffer(mv, dtype=np.dtype(dtype).newbyteorder("<")) if nbytes else np.empty(0, dtype)
        arrays[name] = a
    n = arrays["lengths"].shape[0]
    _check(n >= 1, "group: no completions")
    for name in ("rewards", "correct", "finish"):
        _check(arrays[name].shape[0] == n, f"group: {name} has {arrays[name].shape[0]} entries for N={n}")
    _check(arrays["prompt_ids"].shape[0] >= 1, "group: empty prompt")
    _check(bool((arrays["lengths"] >= 0).all()), "group: negative completion length")
    total = int(arrays["lengths"].sum(dtype=np.int64))
    _check(arrays["tokens"].shape[0] == total, f"group: tokens has {arrays['tokens'].shape[0]} ids, lengths sum to {total}")
    _check(arrays["logprobs"].shape[0] == total, f"group: logprobs has {arrays['logprobs'].shape[0]} values for {total} tokens")
    v = arrays["versions"]
    _check(v.shape[0] in (0, total), f"group: versions has {v.shape[0]} entries for {total} tokens (0 or one per token)")
    if v.shape[0] > 1:  # a completion's tokens never go back to older weights
        step = np.diff(v.astype(np.int16))
        within = np.ones(total - 1, bool)
        starts = np.cumsum(arrays["lengths"], dtype=np.int64)[:-1]
        within[starts[(starts >= 1) & (starts < total)] - 1] = False
        _check(bool((step[within] >= 0).all()), "group: versions go back to older weights within a completion")
    _check(bool(np.isfinite(arrays["logprobs"]).all()) and bool((arrays["logprobs"] <= 1e-4).all()),
           "group: logprobs must be finite and <= 0")
    _check(bool(np.isfinite(arrays["rewards"]).all()), "group: rewards must be finite")
    _check(bool((arrays["correct"] <= 1).all()), "group: correct must be 0 or 1")
    _check(bool((arrays["finish"] < len(FINISH_REASONS)).all()), "group: unknown finish reason code")
    _check(bool((arrays["tokens"] >= 0).all()) and bool((arrays["prompt_ids"] >= 0).all()), "group: negative token id")
    _check(all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in body["timings"].values()),
           "group: timings must map to numbers")
    _check(len(body["reasons"]) in (0, n) and all(isinstance(r, str) for r in body["reasons"]),
           "group: reasons must be empty or N strings")
    return RolloutGroup(**body, **arrays)
