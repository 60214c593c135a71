"""The learner's no-progress diagnosis names the reason a batch is not forming."""

import numpy as np

from config.loader import load_config
from learner.batching import Batcher, Dispatcher
from learner.diagnose import why_no_batch
from learner.membership import Membership
from tests.support.transport_helpers import make_group


def _state(correct: list[int], groups: int):
    d = Dispatcher(load_config("tiny-cpu", {"job.prompts_per_step": 2}))
    b = Batcher(2)
    for i in range(groups):
        g = make_group(f"a:{i}", n=len(correct), seed=i)
        g.correct, g.rewards = np.array(correct, np.uint8), np.array(correct, np.float32)
        b.add(g)
    b.waiting = True
    return d, b, Membership(timeout_s=5)


def test_groups_that_dynamic_sampling_drops_whole_are_named_as_the_reason():
    msg = why_no_batch(*_state([0, 0, 0, 0], groups=5), version=0)
    assert msg.startswith("every one of the 5 groups received since the last step was all-wrong")
    assert "data.reasoning_end" in msg
    msg = why_no_batch(*_state([1, 1, 1, 1], groups=3), version=0)
    assert msg.startswith("every one of the 3 groups received since the last step was all-correct")
    # one group is not yet a pattern (fewer than B received); a mixed group is kept: other reasons apply
    assert not why_no_batch(*_state([0, 0, 0, 0], groups=1), version=0).startswith("every one")
    assert not why_no_batch(*_state([0, 1, 0, 0], groups=1), version=0).startswith("every one")


def test_the_diagnosis_has_a_kind_the_console_says_once_and_a_fix_apart():
    from learner.diagnose import BUSY, cause

    kind, why, fix = cause(*_state([0, 0, 0, 0], groups=5), version=0)
    assert kind == "all-wrong" and why.endswith("the task is too hard for the model, or no answer is ever scored")
    assert "data.reasoning_end" in fix and "data.reasoning_end" not in why
    d, b, m = _state([0, 1, 0, 0], groups=1)
    assert cause(d, b, m, version=0)[0] in BUSY  # nobody has said hello yet: actors may still be starting
    m.hello("a0", "i1")
    kind, why, fix = cause(d, b, m, version=0)  # one did, and is not alive (no heartbeat or request since)
    assert kind == "no-actor" and kind not in BUSY and "actors' logs" in fix


def test_a_task_stream_where_nothing_renders_stops_the_learner_with_the_fix():
    """Not a warning repeated for each work request: the dispatcher's loop ends with the reason (the learner's
    run then stops, and its fatal event names it)."""
    import asyncio
    from types import SimpleNamespace

    import pytest

    from learner.batching import NothingRenders, TaskStream
    from learner.intake import Intake
    from taskdata import RenderError
    from transport import events

    class Unrenderable:
        def render(self, task):
            raise RenderError(f"task {task.task_id}: the prompt has 99 tokens, more than the 8 ...")

    stream = TaskStream(load_config("tiny-cpu"), Unrenderable())
    stream.give_up_after = 50
    with pytest.raises(NothingRenders) as e:
        stream[0]
    from learner.service import TaskDied

    try:
        raise TaskDied("task learner:dispatcher died") from e.value
    except TaskDied as died:
        msg, fix = events.describe(died)
    assert msg.startswith("NothingRenders: 50 tasks in a row could not be rendered; the last: task ")
    assert "actor.max_model_len" in fix and "brorl data preview" in fix

    class FailingIntake(Intake):
        async def on_work_message(self, ident, msg, peer):
            raise e.value  # what a grant raises when the next task cannot be rendered

    async def recv():
        return b"a0", object()

    lrn = FailingIntake(sockets=SimpleNamespace(work=SimpleNamespace(recv=recv, last_peer=None)), members=None,
                        weights=None, dispatcher=None, batcher=None, admission=None, validator=None, desk=None,
                        heldout=None, record=None, version=lambda: 0, curve=False)
    with pytest.raises(NothingRenders):
        asyncio.run(asyncio.wait_for(lrn.serve_work(), 30))
