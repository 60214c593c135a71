"""Verifier swaps and start-up self-tests go through `verifiers.check`: the module is imported and
self-tested in a separate, time-limited process, only if `verifiers.allowed_modules` allows it. A module
that fails to import, exits or hangs at import, or fails its self-test is rejected with the reason, the
verifier in force stays, and the process that asked lives on."""

import time

import pytest

from actors.actor import Actor
from actors.verifier_set import ActorRefused
from config.loader import load_config
from transport.zmq_transport import Endpoints
from verifiers.check import allowed, check
from verifiers.registry import VerifierLoadError

# a loaded machine imports math's verifier (sympy) in more than a few seconds: only the hang test runs at 4 s
ALLOW = {"verifiers.allowed_modules": ["verifiers.*", "tests.support.verifier_mods*"],
         "verifiers.check_timeout_s": 30.0}


def _actor(**over):
    return Actor(load_config("tiny-cpu", {**ALLOW, **over}), "a0", Endpoints())


def test_allow_list_matches_modules_not_attributes():
    pats = ["verifiers.*", "mylab.verifiers.*"]
    assert allowed("verifiers.math", pats) and allowed("mylab.verifiers.x:THING", pats)
    assert not allowed("os", pats) and not allowed("mylab.evil", pats) and not allowed("", pats)


async def test_bad_swaps_are_rejected_with_the_reason_and_the_previous_verifier_stays():
    actor = _actor(**{"verifiers.check_timeout_s": 4.0})
    await actor.checked.self_test()  # the tasks' verifier (synthetic) is checked and adopted
    assert actor.verifiers.in_force() == {"synthetic": "verifiers.synthetic@1"}
    cases = {"tests.support.verifier_mods.broken": "self-test 0 failed",
             "tests.support.verifier_mods.no_such_module": "cannot be imported",
             "tests.support.verifier_mods": "lacks NAME",
             "tests.support.verifier_mods.exits_at_import": "exit status 3",
             "tests.support.verifier_mods.hangs_at_import": "did not finish within 4 s",
             "os": "not in verifiers.allowed_modules"}
    for bad, why in cases.items():
        t0 = time.monotonic()
        assert await actor.swap_verifier("synthetic", bad) is False, bad
        assert time.monotonic() - t0 < 10, bad  # a hanging import costs the time limit, no more
        assert bad in actor.last_error and why in actor.last_error, (bad, actor.last_error)
        assert actor.verifiers.path("synthetic") == "verifiers.synthetic"
        assert actor.verifiers.in_force() == {"synthetic": "verifiers.synthetic@1"}


async def test_good_swap_replaces_and_is_acknowledged():
    actor = _actor()
    assert await actor.swap_verifier("synthetic", "tests.support.verifier_mods.raises") is True
    assert actor.verifiers.path("synthetic") == "tests.support.verifier_mods.raises"
    assert actor.verifiers.in_force()["synthetic"] == "tests.support.verifier_mods.raises@raises-1"
    assert await actor.swap_verifier("extra", "verifiers.math") is True  # a new name is added
    assert actor.verifiers.path("extra") == "verifiers.math"
    info = await check("verifiers.math", 60)
    assert info.reward_range == (0.0, 1.0) and info.name == "math"


async def test_an_actor_whose_verifier_fails_its_self_test_refuses_to_start(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text('{"prompt": "2+2=", "reference": "4", "verifier": "nonexistent"}\n')
    with pytest.raises(ActorRefused, match="tasks.jsonl:1: reference: verifier 'nonexistent'"):
        await _actor(**{"data.train": str(bad)}).checked.self_test()  # a row naming no verifier: refused at load
    # data this host cannot read (an actor on another machine): its verifiers are self-tested at first use
    actor = _actor(**{"data.train": str(tmp_path / "elsewhere.parquet")})
    await actor.checked.self_test()
    with pytest.raises(ActorRefused, match="'nonexistent', which is not registered"):
        await actor.checked.ensure("nonexistent")
    await actor.checked.ensure("math")
    assert "math" in actor.verifiers.in_force()
    with pytest.raises(VerifierLoadError, match="self-test 0 failed"):
        await check("tests.support.verifier_mods.broken", 30)


async def test_the_answer_after_the_reasoning_block_is_scored_in_the_scoring_pool():
    from actors.scoring import ScoringPool
    from config.data import DataConfig

    pool = ScoringPool(1, 10.0)
    try:
        data = DataConfig(reasoning_end="</think>")
        got = await pool.score_answers("verifiers.math", "1", ["<think>easy</think> \\boxed{4}",
                                                               "<think>\\boxed{4} but I keep thinking",
                                                               "<think>\\boxed{4}</think> no idea"], "4", data)
        assert [s.result.correct for s in got] == [True, False, False]
        assert got[1].result.reason == "reasoning not closed" and got[2].result.reason == "no answer"
        whole = await pool.score_answers("verifiers.math", "1", ["<think>\\boxed{4} ..."], "4",
                                         DataConfig(reasoning_end="</think>", unclosed_reasoning="score"))
        assert whole[0].result.correct
    finally:
        pool.close()


async def test_a_pools_start_and_a_verifiers_import_do_not_count_against_a_completions_time():
    """A fresh pool spawns its worker and the worker imports the verifier (3 s here) before any completion's
    `timeout_s` (1 s) starts: on a loaded machine a spawn alone outlasted the budget and every completion,
    a crashing verifier's too, was scored "timeout"."""
    from actors.scoring import ScoringPool
    from verifiers import synthetic

    ok, ref = synthetic.SELF_TEST[0][0], synthetic.SELF_TEST[0][1]
    pool = ScoringPool(1, 1.0)
    try:
        got = await pool.score("tests.support.verifier_mods.slow_import", "1", [ok, ok], ref)
        assert [(s.result.correct, s.version) for s in got] == [(True, "slow-import-1")] * 2, [s.result for s in got]
        assert pool.restarts == 0
        crashed = await pool.score("tests.support.verifier_mods.crashes", "1", [ok], ref)  # a fresh pool each try
        assert [s.result.reason for s in crashed] == ["worker crashed"] and pool.restarts == 2
    finally:
        pool.close()


async def test_a_completion_queued_behind_another_groups_hang_is_not_timed_out_with_it():
    """Two groups share the pool's one worker: the first's verifier hangs; the second, submitted just after,
    waits behind it. Only the hanging one times out; the other is scored once the pool is restarted (the
    e2e actor test once saw a crashing verifier's group scored "timeout", queued behind a hang)."""
    import asyncio

    from actors.scoring import ScoringPool
    from verifiers import synthetic

    ok, ref = synthetic.SELF_TEST[0][0], synthetic.SELF_TEST[0][1]
    pool = ScoringPool(1, 1.0)
    try:
        await pool.score("verifiers.synthetic", "1", [ok], ref)  # the worker is up and has both imported
        hung = asyncio.create_task(pool.score("tests.support.verifier_mods.hangs", "1", [ok] * 3, ref))  # 3 s
        await asyncio.sleep(0.2)
        behind = await pool.score("verifiers.synthetic", "1", [ok], ref)  # 1 s of its own, behind the 3 s
        assert [s.result.reason for s in await hung] == ["timeout"] * 3
        assert [(s.result.correct, s.result.reason) for s in behind] == [(True, synthetic.score(ok, ref).reason)]
    finally:
        pool.close()


async def test_actor_admits_only_when_running_unpaused_and_sync_allows():
    actor = Actor(load_config("tiny-cpu", {"job.max_staleness": 1}), "a0", Endpoints())
    assert not actor.may_admit()  # no weights yet
    actor.sync.on_snapshot(0)
    assert actor.may_admit()
    actor.paused = True
    assert not actor.may_admit()
    actor.paused = False
    actor.stopping.set()
    assert not actor.may_admit()


def test_an_actors_scoring_workers_end_when_it_is_killed_by_pid(tmp_path):
    """A process with a scoring pool (as an actor has) killed with SIGKILL: no shutdown reaches its workers, and
    they used to wait on their call queue for good (with multiprocessing's resource tracker); they end within
    their parent watch's poll."""
    import os
    import select
    import signal
    import subprocess
    import sys

    import psutil

    from tests.support.faults import alive, described, wait_for

    script = (
        "import asyncio, sys\n"
        "from actors.scoring import ScoringPool\n"
        "from verifiers import synthetic\n"
        "async def main():\n"
        "    pool = ScoringPool(2, 30.0)\n"
        "    ok, ref = synthetic.SELF_TEST[0][0], synthetic.SELF_TEST[0][1]\n"
        "    await pool.score('verifiers.synthetic', '1', [ok, ok], ref)\n"
        "    print(*pool._pool._processes, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n")
    (tmp_path / "holder.py").write_text(script)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    holder = subprocess.Popen([sys.executable, str(tmp_path / "holder.py")], cwd=root, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": root}, text=True)
    kids: list[int] = []
    try:
        assert select.select([holder.stdout], [], [], 120)[0], "the process did not score within 120 s"
        workers = [int(w) for w in holder.stdout.readline().split()]
        kids = [c.pid for c in psutil.Process(holder.pid).children(recursive=True)]
        # the pool's workers (one or two: the pool spawns another only while none is idle) are among its children,
        # with multiprocessing's resource tracker
        assert workers and set(workers) <= set(kids), (workers, described(kids))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        wait_for(lambda: not alive(kids), 30, lambda: f"the killed process's scoring workers run on: {described(kids)}")
    finally:
        holder.kill()
        for pid in alive(kids):
            os.kill(pid, signal.SIGKILL)
