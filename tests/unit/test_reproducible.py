"""`run.reproducible`: the learner's bookkeeping decides what to generate and what to train from what the run
has seen, never from when an actor asked or in which order groups arrived."""

import asyncio

import pytest

from config.loader import load_config
from learner.batching import Admission, Batcher, Dispatcher
from tests.support.transport_helpers import make_group
from tests.unit.test_batching import _Tasks


def _ordered(B: int) -> tuple[Dispatcher, Batcher, list[int]]:
    d = Dispatcher(load_config("tiny-cpu", {"job.prompts_per_step": B, "job.max_staleness": 0,
                                            "run.reproducible": True}), tasks=_Tasks())
    back: list[int] = []

    def give_back(pids):
        back.extend(pids)
        d.give_back(pids)

    return d, Batcher(B, admission=Admission(0), give_back=give_back, wave_done=d.wave_done), back


def _answer(d: Dispatcher, b: Batcher, pids: list[int], mixed: set[int]) -> None:
    """The actor's groups for `pids`: mixed (kept) for those in `mixed`, all-wrong (dropped) otherwise."""
    for pid in pids:
        g = make_group(f"a:{pid}", n=4, seed=pid)
        g.correct[:] = g.rewards[:] = [1, 0, 1, 0] if pid in mixed else [0, 0, 0, 0]
        assert d.claim(pid, "a")
        b.add(g)


def _run_step(credits: list[int], arrival: str) -> tuple[list[int], list[int], list[int]]:
    """One step at B = 4 whatever the actor's asks (`credits`) and the groups' arrival order: the prompts
    granted, the batch's prompts and those handed back."""
    d, b, back = _ordered(4)
    d.keep_rate = 0.5
    mixed = {0, 2, 3, 5, 6, 7, 9, 11, 12}
    granted, waves = [], 0
    batch = None
    while batch is None:
        wave = []
        for c in credits:  # the actor asks in pieces; a wave is handed out whatever the pieces
            wave += [i.prompt_id for i in d.grant("a", c, 0, step=0, actor_version=0, kept=len(b.kept))]
        assert d.grant("a", 100, 100, step=0, actor_version=0, kept=len(b.kept)) == []  # not while it is out
        waves += 1
        granted += wave
        _answer(d, b, wave[::-1] if arrival == "reversed" else wave, mixed)
        loop = asyncio.new_event_loop()
        try:
            batch = loop.run_until_complete(asyncio.wait_for(b.next_batch(0, lambda: d.wave_left == 0 and not d.outstanding
                                                                          and len(b.kept) < 4), 1.0))
        finally:
            loop.close()
    return granted, [g.prompt_id for g in batch.groups], back


@pytest.mark.parametrize("credits,arrival", [([100], "in order"), ([1, 2, 3, 100], "reversed"), ([3, 100], "in order")])
def test_waves_and_batches_do_not_depend_on_asks_or_arrival_order(credits, arrival):
    granted, trained, back = _run_step(credits, arrival)
    # wave 1: ceil(4 / 0.5) = 8 prompts, 0-7: kept 0 2 3 5 6 7 (6 >= B): the batch is the four lowest ids,
    # the two others (made with this step's weights, stale for the next at K = 0) go back to the queue in order
    assert granted == list(range(8))
    assert trained == [0, 2, 3, 5] and back == [6, 7]


def test_a_short_wave_is_followed_by_one_sized_from_what_is_still_missing():
    d, b, _ = _ordered(4)
    d.keep_rate = 1.0
    first = [i.prompt_id for i in d.grant("a", 100, 0, step=0, actor_version=0, kept=0)]
    assert first == [0, 1, 2, 3]
    _answer(d, b, first, mixed={1})  # one kept of four
    assert d.wave_done()
    second = [i.prompt_id for i in d.grant("a", 100, 0, step=0, actor_version=0, kept=len(b.kept))]
    assert second == [4, 5, 6]  # ceil((4 - 1) / 1.0)
    # while the learner trains a step (the intake passes kept = B then) no wave starts: its prompts would be
    # generated with the weights that step replaces
    d3, _, _ = _ordered(4)
    assert d3.grant("a", 100, 100, step=0, actor_version=0, kept=4) == [] and d3.wave_left == 0
    # an actor holding older weights gets no wave (K = 0)
    d2, _, _ = _ordered(4)
    assert d2.grant("a", 100, 100, step=1, actor_version=0) == []


def test_reproducible_needs_one_actor_and_no_staleness():
    for over in ({"actor.num_actors": 2}, {"job.max_staleness": 1}):
        with pytest.raises(ValueError, match="run.reproducible needs actor.num_actors = 1"):
            load_config("tiny-cpu", {"run.reproducible": True, "job.max_staleness": 0, **over})
