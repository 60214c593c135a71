"""Role events (`transport/events.py`): what a role appends is read back whole, once, and printed as one line
naming the role, the cause and the fix; an exception becomes its root cause's message."""

import json

from taskdata import DataError
from transport import events


def test_events_are_read_back_once_and_a_line_being_written_waits(tmp_path):
    path = tmp_path / "events.jsonl"
    r = events.Reader(path)
    assert r.read() == []  # no file yet: nothing, no error
    events.emit("phase", "starting its vLLM engine", role="actor-0", path=path)
    events.emit("fatal", "DataError: x.parquet:\n  not a readable\tParquet file", "check data.train",
                role="learner", path=path)
    got = r.read()
    assert [(e["role"], e["level"]) for e in got] == [("actor-0", "phase"), ("learner", "fatal")]
    assert got[1]["message"] == "DataError: x.parquet: not a readable Parquet file"  # one line
    assert r.read() == []  # each event once
    with open(path, "a") as f:  # half a line (a writer mid-write), then garbage, then the rest
        f.write('{"level": "stall", "role": "learner", "mess')
    assert r.read() == []
    with open(path, "a") as f:
        f.write('age": "no step"}\nnot json\n' + json.dumps({"level": "shout", "message": "?"}) + "\n")
    assert [e["message"] for e in r.read()] == ["no step"]  # garbage and unknown levels are skipped
    r2 = events.Reader(path)
    r2.skip_to_end()
    assert r2.read() == []


def test_without_an_events_file_a_role_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv(events.ENV_FILE, raising=False)
    assert events.emit("fatal", "x") is None
    monkeypatch.setenv(events.ENV_FILE, str(tmp_path / "e.jsonl"))
    monkeypatch.setenv(events.ENV_ROLE, "actor-3")
    assert events.emit("error", "y")["role"] == "actor-3"
    assert events.Reader(tmp_path / "e.jsonl").read()[0]["message"] == "y"


def test_once_says_a_key_once_until_forgotten(monkeypatch, tmp_path):
    monkeypatch.setenv(events.ENV_FILE, str(tmp_path / "e.jsonl"))
    events.forget("stall:")
    assert events.once("stall:all-wrong", "stall", "a") is not None
    assert events.once("stall:all-wrong", "stall", "a again") is None
    assert events.once("stall:no-actor", "stall", "b") is not None  # another diagnosis is news
    events.forget("stall:")
    assert events.once("stall:all-wrong", "stall", "a after a step") is not None
    assert [e["message"] for e in events.Reader(tmp_path / "e.jsonl").read()] == ["a", "b", "a after a step"]


def test_an_exception_is_told_by_what_explains_it_with_a_fix():
    class Fixable(RuntimeError):
        fix = "do the thing"

    class Died(RuntimeError):
        wraps = True

    def raised(exc, cause=None):
        try:
            raise exc from cause
        except BaseException as e:
            return e

    data = raised(DataError("bad/nope.parquet: no such file or folder"))
    msg, fix = events.describe(raised(Died("task learner:dispatcher died"), data))  # a wrapper: its cause tells
    assert msg == "DataError: bad/nope.parquet: no such file or folder"
    assert "data.train" in fix and "brorl data preview" in fix  # suggested by its type (`FIXES`)
    port = raised(OSError(98, "port 5555 on 127.0.0.1 is in use: set transport.work_port to a free one"),
                  raised(ValueError("Address already in use")))
    assert events.describe(port)[0] == "OSError: [Errno 98] port 5555 on 127.0.0.1 is in use: set " \
                                       "transport.work_port to a free one"  # the explanation, not its cause
    assert events.describe(raised(RuntimeError("refused"), data))[1].startswith("correct data.train")  # the chain's
    assert events.describe(Fixable("no task renders")) == ("Fixable: no task renders", "do the thing")
    assert events.describe(KeyError()) == ("KeyError", "")


def test_a_console_line_names_role_level_cause_fix_and_log():
    ev = {"role": "learner", "level": "fatal", "message": "DataError: x", "fix": "correct data.train"}
    text = events.line(ev, "runs/x/logs/learner.log")
    assert text == ("[brorl run] learner FATAL: DataError: x — fix: correct data.train "
                    "(details: runs/x/logs/learner.log)")
    assert events.line({"role": "actor-0", "level": "phase", "message": "engine ready in 30 s", "fix": ""},
                       "runs/x/logs/actor-0.log") == "[brorl run] actor-0: engine ready in 30 s"
    long = events.emit("stall", "z" * 5000, role="learner", path="/dev/null")
    assert len(long["message"]) == events.MAX_CHARS and "\n" not in events.line(long)
