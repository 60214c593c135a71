"""The learner's compile warm-up around the compiler (`learner.compiling.WarmUp`): it runs once, at the first
step, tells every other rank to compile too, and a failure is raised (and tried again at the next step).
The compilation itself, on a real model and on DeepSpeed ranks, is tested in
tests/integration/test_train_step.py."""

from types import SimpleNamespace

import pytest

from learner.compiling import WarmUp


class FakeRanks:
    def __init__(self):
        self.sent = []

    def command(self, name, per_rank):
        self.sent.append((name, per_rank))
        return per_rank[0]


def trainer(compile=True, fails=0, world=3):
    t = SimpleNamespace(cfg=SimpleNamespace(compile=compile), ranks=FakeRanks(), world=world, calls=0)

    def warm_up():
        t.calls += 1
        if t.calls <= fails:
            raise RuntimeError("inductor: no C++ compiler")
        return 1.5
    t.warm_up = warm_up
    return t


def test_every_rank_warms_up_once():
    t, w = trainer(), WarmUp()
    w.ensure(t)
    w.ensure(t)  # the next steps: nothing more
    assert t.ranks.sent == [("warm_up", [None, None, None])]  # the other ranks compile too, told once
    assert t.calls == 1 and w.seconds == 1.5 and w.done


def test_without_compile_nothing_happens_and_a_failure_is_raised_then_tried_again():
    t, w = trainer(compile=False), WarmUp()
    w.ensure(t)
    assert t.ranks.sent == [] and t.calls == 0 and not w.done
    t, w = trainer(fails=1), WarmUp()
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        w.ensure(t)
    assert not w.done
    w.ensure(t)
    assert w.done and t.calls == 2
