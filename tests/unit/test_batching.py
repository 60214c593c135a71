"""The learner's bookkeeping without sockets: freshness-bounded grants, staleness admission."""

from config.loader import load_config
from learner.batching import Admission, Dispatcher
from tests.support.transport_helpers import make_group


class _Tasks:
    """Stands in for the task stream: any id is a task."""

    def __getitem__(self, i):
        from verifiers.base import Task

        return Task(task_id=str(i), prompt=f"{i}+1=", reference=str(i + 1), verifier="synthetic"), []


def _dispatcher(B: int, K: int) -> Dispatcher:
    cfg = load_config("tiny-cpu", {"job.prompts_per_step": B, "job.max_staleness": K})
    return Dispatcher(cfg, tasks=_Tasks())


def test_grants_stop_where_pending_prompts_could_not_be_trained_in_time():
    d = _dispatcher(B=4, K=0)
    # K = 0, actor and learner both at version 0: only this step's prompts
    assert len(d.grant("a", 100, 100, step=0, actor_version=0)) == 4
    assert d.grant("a", 100, 100, step=0, actor_version=0) == []
    d.commit(list(d.pending))  # step 0 trained on them
    # the learner is at step 1, the actor still holds version 0: anything it made now would be stale
    assert d.grant("a", 100, 100, step=1, actor_version=0) == []
    assert len(d.grant("a", 100, 100, step=1, actor_version=1)) == 4
    # K = 2: three steps' worth may run ahead; a lower keep rate (dynamic sampling) asks for more
    d2 = _dispatcher(B=4, K=2)
    assert len(d2.grant("a", 100, 100, step=0, actor_version=0)) == 12
    d3 = _dispatcher(B=4, K=2)
    d3.observe_keep_rate(kept=4, received=8)  # 0.7 * 1 + 0.3 * 0.5 = 0.85
    assert abs(d3.keep_rate - 0.85) < 1e-9
    assert len(d3.grant("a", 100, 100, step=0, actor_version=0)) == 15  # ceil(12 / 0.85)
    # prompts whose groups dynamic sampling dropped will never be trained: they free their places, or a
    # K = 0 learner would wait forever for its B kept groups (a deadlock the staleness sweep hit)
    d4 = _dispatcher(B=4, K=0)
    dropped = [i.prompt_id for i in d4.grant("a", 100, 100, step=0, actor_version=0)][:3]
    assert d4.grant("a", 100, 100, step=0, actor_version=0) == []
    assert all(d4.claim(pid, "a") for pid in dropped)  # their groups came (and were dropped)
    assert len(d4.grant("a", 100, 100, step=0, actor_version=0, settled=3)) == 3
    # credits and the batcher's room still bound a grant
    assert len(_dispatcher(4, 2).grant("a", 3, 100, step=0, actor_version=0)) == 3
    assert len(_dispatcher(4, 2).grant("a", 100, 2, step=0, actor_version=0)) == 2


def test_returned_prompts_are_granted_again_first():
    d = _dispatcher(B=4, K=1)
    first = [i.prompt_id for i in d.grant("a", 3, 100, step=0, actor_version=0)]
    d.give_back(first[:2])
    again = [i.prompt_id for i in d.grant("b", 3, 100, step=0, actor_version=0)]
    assert again[:2] == first[:2] and again[2] == 3


def test_returned_prompts_are_granted_again_even_at_the_freshness_bound():
    """Every pending prompt came back (their groups were dropped as stale): they must be granted again,
    not held back by the bound they themselves fill."""
    d = _dispatcher(B=2, K=1)
    first = [i.prompt_id for i in d.grant("a", 100, 100, step=0, actor_version=0)]
    assert len(first) == 4 and d.grant("a", 100, 100, step=0, actor_version=0) == []
    d.give_back(first)
    again = [i.prompt_id for i in d.grant("b", 100, 100, step=0, actor_version=0)]
    assert again == first  # the same prompts, and no fresh ones beyond the bound
    assert d.grant("b", 100, 100, step=0, actor_version=0) == []


def test_admission_drops_groups_beyond_the_bound_and_records_the_histogram():
    a = Admission(max_staleness=1)
    assert a.admit(make_group("x:0", version=3), step=4)
    assert not a.admit(make_group("x:1", version=2), step=4)
    keep, stale = a.check_batch([make_group("x:2", version=4), make_group("x:3", version=2)], step=4)
    assert [g.group_id for g in keep] == ["x:2"] and [g.group_id for g in stale] == ["x:3"]
    st = a.take_stats()
    assert st["drop_stale"] == 2.0 and st["staleness_0"] > 0


def test_a_group_is_used_only_from_the_actor_holding_its_prompt():
    d = _dispatcher(B=4, K=1)
    a = [i.prompt_id for i in d.grant("a", 2, 100, step=0, actor_version=0)]
    b = [i.prompt_id for i in d.grant("b", 2, 100, step=0, actor_version=0)]
    assert not d.claim(a[0], "b")  # b never held it
    assert d.claim(a[0], "a") and not d.claim(a[0], "a")  # once: a second group for it is not used
    assert d.give_back([b[0]], "a") == []  # a cannot hand back what b holds
    assert d.retire("b") == b  # b is gone: its prompts go back to the queue...
    assert d.claim(b[1], "b")  # ...a late group from b for a prompt still in the queue is still good,
    assert [i.prompt_id for i in d.grant("c", 1, 100, step=0, actor_version=0)] == [b[0]]  # the rest re-granted
    assert not d.claim(b[0], "b") and d.claim(b[0], "c")  # and only the new holder's group counts


async def test_batcher_looks_past_stale_groups_without_waiting_for_new_ones():
    """Kept groups that turn out too stale at batch time are skipped for the fresh ones behind them at
    once — not after the next arrival (which, with the freshness bound full, might never come)."""
    import asyncio

    from learner.batching import Batcher

    back = []
    b = Batcher(2, admission=Admission(max_staleness=1), give_back=back.extend)
    groups = [make_group(f"a:{i}", n=4, version=0 if i < 2 else 5, seed=i) for i in range(4)]
    for g in groups:
        g.correct[:] = g.rewards[:] = [1, 0, 1, 0]
        b.add(g)
    batch = await asyncio.wait_for(b.next_batch(step=5, interrupted=lambda: False), 1.0)
    assert [g.group_id for g in batch.groups] == ["a:2", "a:3"] and sorted(back) == [0, 1]


def test_a_restored_dispatcher_keeps_its_pending_prompts_until_they_are_consumed():
    d = _dispatcher(B=4, K=0)
    granted = [i.prompt_id for i in d.grant("a", 100, 100, step=0, actor_version=0)]
    d.commit(granted[:1])
    saved = d.state()
    assert saved == {"next_id": 4, "pending": [1, 2, 3]}
    r = _dispatcher(B=4, K=0)
    r.load_state(saved)
    # a checkpoint taken now, before anything is granted again, still holds them
    assert r.state() == saved
    # they are granted first, one at a time here, and a checkpoint between grants loses none of them
    assert [i.prompt_id for i in r.grant("b", 1, 100, step=1, actor_version=1)] == [1]
    assert r.state() == saved
    # and they count against freshness: K = 0 allows B = 4 in play, 3 are pending, so one fresh prompt
    assert [i.prompt_id for i in r.grant("b", 100, 100, step=1, actor_version=1)] == [2, 3, 4]
    assert r.grant("b", 100, 100, step=1, actor_version=1) == []
