"""The learner's compile warm-up around the compiler (`learner.compiling.WarmUp`): it runs once, in a thread,
tells every other rank to compile too, and a failure reaches the first step. The compilation itself, on a real
model, is tested in tests/integration/test_train_step.py."""

import threading
from types import SimpleNamespace

import pytest

from learner.compiling import WarmUp


class FakeRanks:
    def __init__(self):
        self.sent = []

    def command(self, name, per_rank):
        self.sent.append((name, per_rank))
        return per_rank[0]


def trainer(compile=True, fails=False, world=3):
    t = SimpleNamespace(cfg=SimpleNamespace(compile=compile), ranks=FakeRanks(), world=world, threads=[])

    def warm_up():
        t.threads.append(threading.current_thread().name)
        if fails:
            raise torch_error
        return 1.5
    t.warm_up = warm_up
    return t


torch_error = RuntimeError("inductor: no C++ compiler")


def test_every_rank_warms_up_once_in_a_thread_of_its_own():
    t, w = trainer(), WarmUp()
    w.start(t)
    w.start(t)  # a second start does nothing
    w.join()
    w.join()
    assert t.ranks.sent == [("warm_up", [None, None, None])]  # the other ranks compile too, told once
    assert t.threads == ["learner-compile"] and w.seconds == 1.5


def test_without_compile_nothing_happens_and_a_failure_reaches_the_first_step():
    t, w = trainer(compile=False), WarmUp()
    w.start(t)
    w.join()
    assert t.ranks.sent == [] and t.threads == [] and w.seconds == 0.0
    t, w = trainer(fails=True), WarmUp()
    w.start(t)
    with pytest.raises(RuntimeError, match="learner.compile: compiling before the first step failed: inductor") as e:
        w.join()
    assert e.value.__cause__ is torch_error
