"""The actor role end to end, with a real vLLM engine (CPU), real sockets and a real weight group.

One actor process (engine start-up costs ~20-40 s, so it is paid once per module) is driven by a
`FakeLearner` through named cases, in order: groups with behaviour log-probs, a weight update through the
transport, staleness gating under a learner that runs ahead, verifiers that raise / hang / kill their
worker, a rejected bad hot swap, a killed engine rebuilt in place, and SIGTERM with no orphan process left.
Each case brings the actor to the state it needs itself (its own weight push), so a failure in one does
not hide the next. Two short runs check N = 32 in adaptive waves; the second ends with SIGKILL of the actor
by pid, after which its engine and scoring workers must end too.
"""

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
import torch

from config.loader import load_config, to_toml
from learner.logprobs import pack, token_logprobs
from tests.support.fake_learner import FakeLearner
from tests.support.procs import stop_tree

ROOT = Path(__file__).resolve().parents[2]
# Behaviour log-probs against a transformers recompute on the same weights: vLLM and torch differ only
# by float32 rounding (~1e-6 per token, test_tiny_model.py), so the mismatch KL is ~1e-10; 1e-4 leaves
# room and is still 100x below what one training step of staleness gives on this model (~1e-2).
KL_BOUND = 1e-4


def mismatch_kl(model, groups) -> float:
    """Mean k3 estimate of KL(μ ‖ π) over all tokens, μ = the actor's reported log-probs."""
    P, C, B = [], [], []
    for g in groups:
        for comp, lp in zip(g.completions(), g.completion_logprobs()):
            if len(comp):
                P.append(g.prompt_ids.tolist())
                C.append(comp.tolist())
                B.append(lp.tolist())
    b = pack(P, C)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b)
    mu = torch.zeros_like(lp).masked_scatter(b.mask, torch.tensor([x for row in B for x in row]))
    d = (mu - lp)[b.mask]
    return float((torch.exp(-d) - 1 + d).mean())


def start_actor(cfg, tmp_path: Path, learner_url: str, actor_id: str) -> subprocess.Popen:
    cfg_path = tmp_path / f"{actor_id}.toml"
    cfg_path.write_text(to_toml(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / f"{actor_id}.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "cli", "actor", "--config", str(cfg_path),
                             "--learner", learner_url, "--actor-id", actor_id], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


async def stop_actor(proc: subprocess.Popen, fl: FakeLearner) -> None:
    """SIGTERM (killed if it has not stopped within 90 s), then the fake learner closes."""
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(proc.wait, 90)
    finally:
        if proc.poll() is None:
            proc.kill()
        fl.close()


def actor_cfg(model_dir: str, n: int, **extra):
    return load_config("tiny-cpu", {"model.path": model_dir, "job.n_samples": n, "actor.max_tokens": 6,
                                    "actor.prompts_per_request": 2, "verifiers.timeout_s": 2.0,
                                    "job.max_staleness": 1,
                                    "verifiers.allowed_modules": ["verifiers.*", "tests.support.verifier_mods.*"],
                                    **extra})


pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


class Scenario:
    def __init__(self, fl, proc, model, tiny_model_dir):
        self.fl, self.proc, self.model, self.model_dir = fl, proc, model, tiny_model_dir
        self.version = 0
        self.old_tree: list = []

    async def push(self, model) -> str:
        """A fresh rendezvous and the next version: the actor ends up in a group with these weights."""
        self.version += 1
        self.fl.model = model
        return await self.fl.push_weights(["a0"], version=self.version)

    def perturbed(self, seed: int):
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.3)
        return m

    def alive(self) -> None:
        assert self.proc.poll() is None, "the actor died"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sc(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fl = FakeLearner(model)
    proc = start_actor(actor_cfg(tiny_model_dir, 8), tmp_path_factory.mktemp("actor"), fl.work_url, "a0")
    yield Scenario(fl, proc, model, tiny_model_dir)
    stop_tree(proc)  # with its engine's processes: killed alone, the actor left them running
    fl.close()


async def test_groups_carry_behaviour_logprobs_of_disk_weights(sc):
    groups = await sc.fl.wait_groups(4, timeout_s=240)
    assert all(g.n == 8 and g.policy_version == 0 for g in groups)
    assert all(len(g.reasons) == 8 for g in groups)
    assert mismatch_kl(sc.model, groups) < KL_BOUND


async def test_weight_update_reaches_the_engine(sc):
    new = sc.perturbed(5)
    checksum = await sc.push(new)
    v = sc.version
    later = await sc.fl.wait_groups(3, where=lambda g: g.policy_version == v, timeout_s=180)
    assert mismatch_kl(new, later) < KL_BOUND
    assert mismatch_kl(sc.model, later) > 100 * KL_BOUND  # ...and not from the old ones
    await sc.fl.wait_heartbeat(lambda h: h.version == v and h.checksum == checksum, "with the new weights' checksum")


async def test_staleness_gate_stops_requests_until_the_weights_arrive(sc):
    """The learner announces a version 2 ahead (> max_staleness 1) without broadcasting yet: the actor must
    stop asking for work until the weights arrive, then resume."""
    await sc.push(sc.perturbed(6))  # the actor is in a group and up to date
    loop = asyncio.get_running_loop()
    sc.version += 2
    await sc.fl.sockets.control.publish("version", version=sc.version)
    t_pub = loop.time()
    await asyncio.sleep(4.0)
    late = [r for t, r in sc.fl.requests if t > t_pub + 1.0]
    assert late == [], f"actor asked for work while 2 versions behind: {late}"
    await sc.fl.broadcaster.broadcast()  # the actor has been waiting for exactly this
    v = sc.version
    await sc.fl.wait_groups(2, where=lambda g: g.policy_version == v, timeout_s=120)
    assert any(t > t_pub + 4.0 for t, _ in sc.fl.requests)  # work resumed after the update


@pytest.mark.parametrize("kind,reason", [("raises", "error: RuntimeError"), ("hangs", "timeout"),
                                         ("crashes", "worker crashed")])
async def test_misbehaving_verifier_scores_zero_and_actor_survives(sc, kind, reason):
    await sc.fl.sockets.control.publish("swap", name="synthetic", path=f"tests.support.verifier_mods.{kind}")
    bad = await sc.fl.wait_groups(1, timeout_s=120, where=lambda g: g.verifier_version == f"{kind}-1")
    g = bad[0]
    assert float(g.rewards.sum()) == 0.0 and all(r.startswith(reason) for r in g.reasons), g.reasons
    sc.alive()


async def test_bad_swap_rejected_previous_verifier_stays(sc):
    await sc.fl.sockets.control.publish("swap", name="synthetic", path="verifiers.synthetic")
    await sc.fl.wait_groups(1, timeout_s=60, where=lambda g: g.verifier_version == "1")
    await sc.fl.sockets.control.publish("swap", name="synthetic", path="tests.support.verifier_mods.broken")
    await sc.fl.wait_heartbeat(lambda h: "rejected" in h.error and "broken" in h.error, "reporting the rejected swap")
    # the previous verifier stays: groups keep coming scored by it and none by the rejected one (groups scored
    # before the first swap may still arrive on a busy machine: they carry the version before it)
    n_before = len(sc.fl.groups)
    await sc.fl.wait_groups(2, timeout_s=60, where=lambda g: g in sc.fl.groups[n_before:] and g.verifier_version == "1")
    assert not any("broken" in g.verifier_version for g in sc.fl.groups[n_before:])


async def test_killed_engine_is_rebuilt_in_place(sc):
    """SIGKILL the EngineCore: the actor rebuilds the engine and reports it, says hello again, takes no work
    on the disk weights, and after the learner's next rendezvous generates from the current weights."""
    sc.alive()
    sc.old_tree = psutil.Process(sc.proc.pid).children(recursive=True)
    core = [p for p in sc.old_tree if "EngineCore" in p.name() + " ".join(p.cmdline())]
    assert core, [p.name() for p in sc.old_tree]
    hellos = sc.fl.hellos.count("a0")
    loop = asyncio.get_running_loop()
    os.kill(core[0].pid, signal.SIGKILL)
    t_kill = loop.time()
    while sc.fl.hellos.count("a0") == hellos:
        sc.alive()
        assert loop.time() - t_kill < 240, "no hello from a rebuilt engine"
        await asyncio.sleep(0.2)
    assert any("engine died" in h.error and "restarting" in h.error for h in sc.fl.heartbeats)
    n_before = len(sc.fl.groups)
    new = sc.perturbed(7)
    await sc.push(new)
    v = sc.version
    fresh = await sc.fl.wait_groups(2, where=lambda g: g.policy_version == v, timeout_s=180)
    assert mismatch_kl(new, fresh) < KL_BOUND
    # between the death and the push nothing was generated on the disk weights (version 0)
    assert all(g.policy_version != 0 for g in sc.fl.groups[n_before:])
    sc.alive()


async def test_sigterm_exits_cleanly_leaving_no_orphans(sc):
    tree = [p.pid for p in psutil.Process(sc.proc.pid).children(recursive=True) + sc.old_tree]
    assert tree, "expected engine and scoring processes under the actor"
    sc.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(sc.proc.wait, 90) == 0
    await asyncio.sleep(2.0)
    alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"orphans after SIGTERM: {alive}"


async def test_actor_adaptive_groups_of_4_or_32_with_long_tailed_completion_budgets(tiny_model_dir, tmp_path):
    """N = 32 in adaptive waves (`job.rollouts = "adaptive"`, a first wave of 4): a prompt whose first 4
    agree is sent as a group of 4, the others as 32 whose first 4 were mixed, every token's log-prob the
    engine's own across both waves; and each request's `max_tokens` drawn per prompt (`actor.length_dist =
    "lognormal"`): every completion the engine cut for length, in either wave, ends exactly at its prompt's
    budget."""
    from transformers import AutoModelForCausalLM

    from actors.engine import request_max_tokens
    from transport import wire

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fl = FakeLearner(model)
    cfg = actor_cfg(tiny_model_dir, 32, **{"actor.max_tokens": 24, "actor.length_dist": "lognormal",
                                           "actor.length_median": 6, "job.rollouts": "adaptive", "job.first_wave": 4})
    proc = start_actor(cfg, tmp_path, fl.work_url, "a32")
    try:
        await fl.wait_groups(1, where=lambda g: g.n == 32, timeout_s=240)
        await fl.wait_groups(1, where=lambda g: g.n == 4, timeout_s=120)
        groups = await fl.wait_groups(4, timeout_s=120)
        assert {g.n for g in groups} == {4, 32}
        for g in groups:
            first = g.correct[:4].astype(bool)
            settled = first.all() or not first.any()
            assert settled == (g.n == 4), (g.n, g.correct)  # the rule: a settled first wave stops there
            assert len(g.reasons) == g.n == len(g.rewards) == len(g.lengths)
        assert mismatch_kl(model, groups) < KL_BOUND
        budgets = [request_max_tokens(cfg.actor, cfg.run.seed, g.prompt_id) for g in groups]
        assert len(set(budgets)) > 1, budgets  # the budgets differ by prompt
        cut = wire.FINISH_REASONS.index("length")
        for g, budget in zip(groups, budgets):
            assert g.lengths.max() <= budget, (g.prompt_id, budget, g.lengths)
            assert all(n == budget for n, f in zip(g.lengths, g.finish) if f == cut), (budget, g.lengths, g.finish)
    finally:
        await stop_actor(proc, fl)


async def test_actor_adaptive_waves_under_a_step_sample_budget_send_mixed_first_waves_as_groups(tiny_model_dir, tmp_path):
    """`job.step_sample_budget` smaller than one second wave (28 of N = 32 after a first wave of 4): no
    prompt is extended under the version, a mixed first wave is sent as its group of 4, and the actor's
    heartbeats count the capped waves. Then the actor is killed by pid (`killed_by_pid_its_engine_ends`, on
    this actor so that the check costs no engine start of its own)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    fl = FakeLearner(model)
    cfg = actor_cfg(tiny_model_dir, 32, **{"actor.max_tokens": 12, "job.rollouts": "adaptive", "job.first_wave": 4,
                                           "job.step_sample_budget": 16})
    proc = start_actor(cfg, tmp_path, fl.work_url, "a32b")
    try:
        mixed = await fl.wait_groups(1, where=lambda g: 0 < g.correct.sum() < g.n, timeout_s=240)
        assert mixed[0].n == 4, mixed[0].n  # mixed at its first wave, and not extended: the budget
        groups = await fl.wait_groups(4, timeout_s=120)
        assert {g.n for g in groups} == {4}
        await fl.wait_heartbeat(lambda h: h.stats.get("capped_waves", 0) >= 1, "a capped second wave counted")
        await asyncio.to_thread(killed_by_pid_its_engine_ends, proc)
    finally:
        await stop_actor(proc, fl)


def killed_by_pid_its_engine_ends(proc: subprocess.Popen) -> None:
    """SIGKILL of a `brorl actor` with no launcher around it (a supervisor that signals only its pid, or a user):
    its vLLM engine core and the core's worker end too (actors/engine_watch.py), where they used to run on
    holding their memory (with this tiny model 2.5 GiB of RSS; on a GPU, the memory its replacement needs)."""
    from actors.engine_watch import loadable
    from tests.support.faults import alive, described, tree, wait_for

    assert loadable(), "brorl is not installed (pip install -e .): vLLM finds no engine watch to load"
    def core(pid: int) -> bool:
        try:
            p = psutil.Process(pid)
            return "EngineCore" in p.name() + " ".join(p.cmdline())
        except psutil.Error:  # a short-lived child (a verifier self-test) that has just exited
            return False

    engine = tree(proc.pid)[1:]
    assert any(core(p) for p in engine), f"no vLLM engine core under the actor: {described(engine)}"
    proc.kill()
    proc.wait()
    # the core's watch polls each second, then SIGTERM (vLLM's shutdown) and SIGKILL 10 s later; slower under load
    try:
        wait_for(lambda: not alive(engine), 90, lambda: f"the killed actor's engine processes run on: {described(engine)}")
    finally:
        for pid in alive(engine):
            os.kill(pid, signal.SIGKILL)
