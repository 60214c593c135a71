"""`actor.share_gpu = "timeshare"`: the learner's "compute" messages pause the engine (requests kept) through
`EngineGate`, which a kept weight update shares; the hold ends with that step's weights, or when the learner
says it computes nothing; held time is neither generation nor idle time."""

import asyncio
import time
from types import SimpleNamespace

from actors.in_flight import InFlightPolicy, TokenVersions
from actors.stats import ActorStats, EngineLoad
from actors.timeshare import EngineGate
from config.loader import load_config
from learner.service import LearnerService


class FakeEngine:
    def __init__(self):
        self.calls: list[str] = []
        self.paused = False

    async def pause_generation(self, *, mode, clear_cache):
        assert (mode, clear_cache) == ("keep", False)  # requests frozen, their KV kept
        self.calls.append("pause")
        self.paused = True

    async def resume_generation(self):
        self.calls.append("resume")
        self.paused = False

    async def abort(self, rids):
        self.calls.append("abort")

    async def reset_prefix_cache(self):
        self.calls.append("reset")


class FakeSync:
    def __init__(self, engine):
        self.version, self.error, self.engine = 0, "", engine
        self.receiver = SimpleNamespace(output_counts=self._counts)

    async def _counts(self):
        assert self.engine.paused  # counted with the engine paused: exactly the outgoing weights' tokens
        return {}

    def begin_update(self):
        pass

    async def receive(self, target):
        assert self.engine.paused or self.engine.calls[-1:] == ["resume"]
        self.version = target


def policy(mode: str, generating: int):
    engine = FakeEngine()
    cfg = load_config("tiny-cpu", {"actor.in_flight_on_update": mode, "actor.share_gpu": "timeshare"})
    load = EngineLoad()
    for _ in range(generating):
        load.begin()
    sup = SimpleNamespace(engine=engine, check=lambda e=None: False)
    p = InFlightPolicy(cfg, sup, FakeSync(engine), load, ActorStats(), TokenVersions(), lambda t: t)
    return p, engine, load


async def test_a_learner_step_pauses_the_engine_until_its_weights_are_in():
    p, engine, load = policy("keep", generating=2)
    await p.learner_computes(1)
    assert engine.calls == ["pause"] and load.held
    await p.apply(1, {"r": None})  # the hold passes into the update: paused throughout, one resume at its end
    assert engine.calls == ["pause", "resume"] and not load.held and p.gate.held == {}


async def test_a_hold_for_a_later_step_outlives_an_older_update():
    p, engine, _ = policy("keep", generating=1)
    await p.learner_computes(2)  # the learner computes step 2 while version 1 is still being loaded
    await p.apply(1, {"r": None})
    assert engine.calls == ["pause"] and p.gate.held == {"learner": 2}
    await p.learner_computes(0)  # the learner ends the step (no weights for this actor): generation resumes
    assert engine.calls == ["pause", "resume"] and p.gate.held == {}
    await p.learner_computes(0)  # nothing held: nothing to do
    assert engine.calls == ["pause", "resume"]


async def test_an_update_that_finishes_requests_first_resumes_the_engine_before_waiting():
    p, engine, load = policy("finish", generating=1)
    await p.learner_computes(1)
    update = asyncio.create_task(p.apply(1, {"r": None}))
    await asyncio.sleep(0.01)
    assert engine.calls == ["pause", "resume"] and not update.done()  # running, so the request can finish
    load.end()
    await asyncio.wait_for(update, 1)
    assert engine.calls[-1] == "reset" and p.sync.version == 1


async def test_corun_ignores_the_learners_compute_and_a_new_engine_is_not_held():
    p, engine, _ = policy("keep", generating=0)
    p.timeshare = False
    await p.learner_computes(3)
    assert engine.calls == []
    p.timeshare = True
    await p.learner_computes(3)
    p.gate.reset()  # the engine died and was rebuilt
    assert p.gate.held == {} and not p.load.held


async def test_held_time_is_counted_apart_from_idle_time():
    load = EngineLoad()
    gate = EngineGate(lambda: FakeEngine(), load)
    load.begin()
    load.start_clock()
    await gate.hold("learner", 1)
    time.sleep(0.05)
    await gate.release("learner")
    held = load.held_s()
    assert held >= 0.05 and load.idle_s() == 0.0  # a request was in the engine: held, never idle
    load.end()
    time.sleep(0.01)
    assert load.idle_s() >= 0.01 and load.held_s() == held


async def test_the_learner_announces_its_compute_only_when_time_sharing():
    sent = []

    async def publish(kind, **payload):
        sent.append((kind, payload))
        stub.sockets.control.computing = payload["step"]

    for share, want in (("corun", []), ("timeshare", [("compute", {"step": 4}), ("compute", {"step": 0})])):
        sent.clear()
        stub = SimpleNamespace(cfg=load_config("tiny-cpu", {"actor.share_gpu": share}),
                               sockets=SimpleNamespace(control=SimpleNamespace(computing=0, publish=publish)))
        for step in (4, 4, 0, 0):  # said once per change
            await LearnerService.computing(stub, step)
        assert sent == want
