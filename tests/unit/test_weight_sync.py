"""The actor's weight-sync state machine and its verifier swaps, without vLLM.

`WeightSync` is driven the way the actor drives it (snapshots, control messages, receives); the receiver
is a stand-in that records joins and can block or fail a receive, since what is tested here is the logic
around the real `WeightReceiver` (tests/e2e/test_actor.py runs the real one into a vLLM engine)."""

import asyncio

import pytest

from actors.weight_sync import SyncState, WeightSync


class Receiver:
    def __init__(self, name="engine-1"):
        self.name = name
        self.joins: list[tuple[str, int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail: Exception | None = None

    async def join(self, info, offset, plan):
        self.joins.append((info["group_name"], offset))

    async def receive(self, version):
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return version, f"sum-{version}"


def make(max_staleness=1):
    rx = Receiver()
    tasks: list[asyncio.Task] = []
    sync = WeightSync("a0", max_staleness, rx, lambda coro, name: tasks.append(asyncio.create_task(coro)) or tasks[-1])
    return sync, rx, tasks


def rendezvous(group, members=("a0",)):
    return {"rendezvous": {"group_name": group}, "plan": {}, "offsets": {m: i + 1 for i, m in enumerate(members)}}


async def joined(sync, group="g1", members=("a0",)):
    sync.on_rendezvous(rendezvous(group, members))
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_fresh_actor_takes_no_work_until_the_weights_are_the_learners():
    sync, _, _ = make()
    assert sync.state is SyncState.NO_WEIGHTS and not sync.may_admit()
    sync.on_snapshot(3)  # a trained job: the disk weights are not version 3
    assert sync.state is SyncState.NO_WEIGHTS and sync.version == -1 and not sync.may_admit()
    sync2, _, _ = make()
    sync2.on_snapshot(0)  # nothing trained yet: the disk weights are version 0
    assert sync2.state is SyncState.READY and sync2.version == 0 and sync2.may_admit()


@pytest.mark.parametrize("k,latest,admit", [(0, 0, True), (0, 1, False), (1, 1, True), (1, 2, False), (4, 4, True),
                                            (4, 5, False)])
async def test_staleness_gate(k, latest, admit):
    sync, _, _ = make(max_staleness=k)
    sync.on_snapshot(0)
    sync.on_version(latest)  # announced, not (yet) broadcast to us: we are in no group
    assert sync.may_admit() is admit
    assert sync.gated_by_staleness() is (not admit)
    assert sync.has_weights()  # prompts already admitted may still finish on the weights we have


async def test_rendezvous_joined_once_and_only_when_named():
    sync, rx, _ = make()
    await joined(sync, "g1", ("a0", "a1"))
    await joined(sync, "g1", ("a0", "a1"))  # the same group again (e.g. in a snapshot): not re-joined
    await joined(sync, "g2", ("a1",))  # a group without us
    assert rx.joins == [("g1", 1)]


async def test_update_blocks_admission_until_received():
    sync, rx, _ = make()
    sync.on_snapshot(0)
    await joined(sync)
    rx.release.clear()
    sync.on_version(1)
    target = await asyncio.wait_for(sync.next_update(), 1)
    assert target == 1
    sync.begin_update()
    assert sync.state is SyncState.UPDATING and not sync.may_admit() and not sync.has_weights()
    receiving = asyncio.create_task(sync.receive(target))
    await asyncio.sleep(0.01)
    assert not sync.may_admit()
    rx.release.set()
    await receiving
    assert (sync.state, sync.version, sync.checksum) == (SyncState.READY, 1, "sum-1") and sync.may_admit()


async def test_announcement_outside_a_group_triggers_no_update():
    sync, _, _ = make()
    sync.on_snapshot(0)
    sync.on_version(1)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(sync.next_update(), 0.05)


async def test_failed_receive_leaves_weights_unknown():
    sync, rx, _ = make()
    sync.on_snapshot(0)
    await joined(sync)
    rx.fail = RuntimeError("gloo timeout")
    sync.on_version(1)
    with pytest.raises(RuntimeError, match="gloo"):
        await sync.receive(await sync.next_update())
    assert sync.state is SyncState.NO_WEIGHTS and sync.version == -1 and not sync.may_admit()
    assert "version 1" in sync.error and "gloo timeout" in sync.error
    rx.fail = None  # the learner regroups and broadcasts again: back to READY
    await joined(sync, "g2")
    sync.on_version(1)
    await sync.receive(await sync.next_update())
    assert sync.state is SyncState.READY and sync.version == 1


async def test_engine_restart_joins_with_the_new_engine():
    sync, old, _ = make()
    sync.on_snapshot(0)
    await joined(sync, "g1")
    sync.engine_restarting()
    assert sync.state is SyncState.RESTARTING and sync.version == -1 and not sync.may_admit()
    with pytest.raises(RuntimeError, match="restarted"):
        await sync.receive(2)
    await joined(sync, "g1")  # the dead engine's group: never re-joined
    sync.on_rendezvous(rendezvous("g2"))  # the learner regroups while the engine is still being rebuilt
    await asyncio.sleep(0.01)
    new = Receiver("engine-2")
    assert old.joins == [("g1", 1)] and new.joins == []
    sync.engine_restarted(new)
    await asyncio.sleep(0.01)
    assert new.joins == [("g2", 1)] and old.joins == [("g1", 1)]
    assert sync.state is SyncState.NO_WEIGHTS  # disk weights: no work until the broadcast
    sync.on_version(2)
    await sync.receive(await asyncio.wait_for(sync.next_update(), 1))
    assert sync.state is SyncState.READY and sync.version == 2
