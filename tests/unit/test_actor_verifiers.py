"""The actor's verifier hot swap goes through `verifiers.registry`: a module that fails to load or fails
its self-test is rejected with the reason, and the verifier in force stays; a good one replaces it."""

from actors.actor import Actor
from config.loader import load_config
from transport.zmq_transport import Endpoints


async def test_bad_swap_rejected_previous_stays():
    actor = Actor(load_config("tiny-cpu"), "a0", Endpoints())
    actor.verifiers.get("synthetic")
    assert actor.verifiers.in_force() == {"synthetic": "verifiers.synthetic@1"}
    for bad in ("tests.support.verifier_mods.broken", "no.such.module", "tests.support.verifier_mods"):
        assert actor.swap_verifier("synthetic", bad) is False
        assert "rejected" in actor.last_error and bad in actor.last_error
        assert actor.verifiers.path("synthetic") == "verifiers.synthetic"
        assert actor.verifiers.in_force() == {"synthetic": "verifiers.synthetic@1"}
    assert "self-test" in (actor.swap_verifier("synthetic", "tests.support.verifier_mods.broken") or actor.last_error)


async def test_good_swap_replaces_and_is_acknowledged():
    actor = Actor(load_config("tiny-cpu"), "a0", Endpoints())
    assert actor.swap_verifier("synthetic", "tests.support.verifier_mods.raises") is True
    assert actor.verifiers.path("synthetic") == "tests.support.verifier_mods.raises"
    assert actor.verifiers.in_force()["synthetic"] == "tests.support.verifier_mods.raises@raises-1"
    assert actor.swap_verifier("extra", "verifiers.math") is True  # a new name is added
    assert actor.verifiers.path("extra") == "verifiers.math"


async def test_actor_admits_only_when_running_unpaused_and_sync_allows():
    actor = Actor(load_config("tiny-cpu", {"learner.max_staleness": 1}), "a0", Endpoints())
    assert not actor.may_admit()  # no weights yet
    actor.sync.on_snapshot(0)
    assert actor.may_admit()
    actor.paused = True
    assert not actor.may_admit()
    actor.paused = False
    actor.stopping.set()
    assert not actor.may_admit()
