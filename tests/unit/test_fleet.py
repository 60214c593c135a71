"""The fleet simulator's pure parts: its events run in time order, it applies the learner's own admission
and freshness rules, nothing is trained twice or staler than K, failures cost time but never the job."""

import math
import statistics
from types import SimpleNamespace

import pytest

from fleet.model import Fleet, Rates
from fleet.sim import Sim, simulate


def small(**over) -> Fleet:
    return Fleet(**{"actors": 2, "n": 8, "prompts_per_step": 4, "prompts_per_request": 2, "mean_tokens": 64,
                    "steps": 20, "seed": 1, **over})


def test_events_run_in_time_order_and_the_job_reaches_its_steps(monkeypatch):
    import heapq

    import fleet.sim as sim_mod

    seen = []

    def heappop(h):
        item = heapq.heappop(h)
        seen.append(item[0])
        return item
    monkeypatch.setattr(sim_mod, "heapq", type("H", (), {"heappop": staticmethod(heappop),
                                                        "heappush": staticmethod(heapq.heappush)}))
    res = Sim(small()).run()
    assert len(seen) > 100 and seen == sorted(seen) and res.steps == 20
    assert res.samples_per_s > 0 and 0 <= res.learner_wait_share <= 1 and 0 <= res.actor_idle_share <= 1


@pytest.mark.parametrize("K", [0, 1, 3])
@pytest.mark.parametrize("mode", ["finish", "keep"])
def test_no_trained_group_is_staler_than_K_and_none_is_trained_twice(K, mode):
    sim = Sim(small(max_staleness=K, in_flight=mode, length_sigma=1.0))
    trained: list[int] = []
    commit = sim.dispatcher.commit

    def spy(consumed):
        trained.extend(consumed)
        commit(consumed)
    sim.dispatcher.commit = spy
    res = sim.run()
    assert max(int(k) for k in res.staleness_hist) <= K
    assert len(trained) == len(set(trained))  # the learner's own dispatcher: no prompt consumed twice
    assert res.trained_samples_per_s <= res.samples_per_s + 1e-9


def test_staleness_bound_buys_throughput_when_generation_is_the_bottleneck():
    slow_gen = Rates(gen_tokens_per_s=2_000, train_s_per_token=2e-5, train_s_fixed=0.2)
    on = simulate(small(max_staleness=0, rates=slow_gen, actors=4))
    off = simulate(small(max_staleness=2, rates=slow_gen, actors=4))
    assert off.samples_per_s > on.samples_per_s and off.staleness_mean > on.staleness_mean == 0.0


def test_keeping_requests_in_flight_beats_finishing_them_with_long_tails():
    tails = dict(length_sigma=1.2, mean_tokens=256, max_tokens=8192, max_staleness=2, actors=4)
    finish = simulate(small(in_flight="finish", **tails))
    keep = simulate(small(in_flight="keep", **tails))
    assert keep.actor_idle_share < finish.actor_idle_share and keep.samples_per_s > finish.samples_per_s


def test_failed_actors_lose_their_prompts_to_the_queue_not_the_job():
    res = simulate(small(actors=4, mtbf_s=30.0, restart_s=5.0, steps=30))
    assert res.failures > 0 and res.steps == 30


def test_the_same_seed_gives_the_same_run():
    assert simulate(small(length_sigma=0.8)).as_dict() == simulate(small(length_sigma=0.8)).as_dict()
    assert simulate(small(length_sigma=0.8)).as_dict() != simulate(small(length_sigma=0.8, seed=2)).as_dict()


def test_a_job_that_cannot_progress_is_an_error_not_a_hang():
    sim = Sim(small(keep_rate=0.0))  # dynamic sampling keeps nothing: no step can ever form
    sim.STALL_S = 100.0
    with pytest.raises(RuntimeError, match="stalled at step 0"):
        sim.run()
    assert math.isfinite(sim.now)


def test_the_command_runs_a_grid_and_names_bad_input(tmp_path, capsys):
    import json

    from cli import main

    assert main(["simulate-fleet", "--actors", "1,3", "--max-staleness", "0,1", "--steps", "6", "--seeds", "1",
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fleet.json").read_text())["rows"]
    assert [(r["actors"], r["max_staleness"]) for r in rows] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert all(r["samples_per_s"] > 0 and r["bottleneck"] for r in rows)
    assert all(abs(sum(r["staleness_hist"].values()) - 1) < 1e-9 for r in rows)  # shares of trained samples
    assert [set(r["staleness_hist"]) <= {str(k) for k in range(r["max_staleness"] + 1)} for r in rows] == [True] * 4
    assert (tmp_path / "fleet.png").stat().st_size > 10_000  # the plot of the grid
    assert "samples_per_s" in (out := capsys.readouterr().out) and "lag_mean" in out
    with pytest.raises(SystemExit, match=r"--actors must be comma-separated int values, got 'x'"):
        main(["simulate-fleet", "--actors", "x", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--in-flight must be finish or keep"):
        main(["simulate-fleet", "--in-flight", "later", "--out", str(tmp_path)])
    # shared cores: the calibration's contention, or the flag's (0: roles on devices of their own)
    assert main(["simulate-fleet", "--contention", "0", "--steps", "6", "--seeds", "1", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "fleet.json").read_text())["rates"]["contention"] == 0.0
    with pytest.raises(SystemExit, match="--contention must be >= 0, got -1.0"):
        main(["simulate-fleet", "--contention", "-1", "--out", str(tmp_path)])
    # the model's size: its updates take longer by the GB (the gpu-1.5b rates' cost per GB)
    assert main(["simulate-fleet", "--calibration", "gpu-1.5b", "--model-gb", "3,300", "--actors", "3",
                 "--learner-gpus", "1", "--n", "16", "--prompts-per-step", "4", "--mean-tokens", "64", "--steps", "6",
                 "--seeds", "1", "--out", str(tmp_path)]) == 0
    small_model, big_model = json.loads((tmp_path / "fleet.json").read_text())["rows"]
    assert (small_model["model_gb"], big_model["model_gb"]) == (3.0, 300.0)
    assert big_model["learner_sync_share"] > 5 * small_model["learner_sync_share"]
    with pytest.raises(SystemExit, match="--model-gb must be >= 0, got '-3'"):
        main(["simulate-fleet", "--model-gb", "-3", "--out", str(tmp_path)])


def test_the_command_tries_every_split_of_a_machines_gpus_and_marks_the_best(tmp_path, capsys):
    import json

    from cli import main

    assert main(["simulate-fleet", "--gpus", "4", "--calibration", "gpu-1.5b", "--n", "16,512", "--prompts-per-step", "8",
                 "--mean-tokens", "64", "--steps", "6", "--seeds", "1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fleet.json").read_text())["rows"]
    assert sorted((r["learner_gpus"], r["actors"], r["n"]) for r in rows) == [
        (lg, 4 - lg, n) for lg in (1, 2, 3) for n in (16, 512)]  # only splits of the 4 GPUs, each N
    for n in (16, 512):
        split = [r for r in rows if r["n"] == n]
        best = [r for r in split if r["best_split"] == "best"]
        assert len(best) == 1 and best[0]["trained_samples_per_s"] == max(r["trained_samples_per_s"] for r in split)
    assert "best_split" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--gpus needs at least 2"):
        main(["simulate-fleet", "--gpus", "1", "--out", str(tmp_path)])


def test_gpu_rates_come_from_our_gpu_benchmarks_result_files():
    import json

    from fleet.calibration import GPU_MODEL_GB, RESULTS, gpu_rates

    r = gpu_rates()
    learner = json.loads((RESULTS / "learner_gpu.json").read_text())["mfu"][0]["tokens_per_s"]
    assert r.train_s_per_token == pytest.approx(1 / learner) and r.gen_tokens_per_s > 10_000 and r.sync_s_fixed > 0
    # the update's time, a line over the GB sent, gives each measured model size's back (1.5B and 7B: 3, 14 GB)
    for row in json.loads((RESULTS / "weight_sync_nccl.json").read_text())["rows"]:
        if row["GB"] >= 3:
            assert r.sync_s_fixed + r.sync_s_per_gb * row["GB"] == pytest.approx(row["total_s"], rel=0.15), row
    sim = Sim(Fleet(model_gb=GPU_MODEL_GB, rates=r))
    assert sim._transfer_s(8) == pytest.approx(r.sync_s_fixed + r.sync_s_per_gb * 3.0 + 8 * r.sync_s_per_member)
    res = simulate(Fleet(actors=12, learner_gpus=4, n=512, prompts_per_step=16, prompts_per_request=1,
                         mean_tokens=1024, length_sigma=0.5, max_tokens=4096, in_flight="keep", steps=4, rates=r))
    assert res.steps == 4 and res.samples_per_s > 0


def test_the_staleness_sweep_reports_the_mean_and_spread_of_its_runs():
    from bench.staleness import SPREAD, combine

    def run(sps, wait, st, hist):
        return {"max_staleness": 2, "seed": 0, "steady_samples_per_s": sps, "steady_wait_share": wait,
                "staleness_mean": st, "samples_per_s": sps / 2, "staleness_hist": hist, "_steady": [{"x": 1}]}

    row = combine([run(600.0, 0.1, 1.5, {"0": 0.5, "1": 0.5}), run(400.0, 0.3, 2.5, {"2": 1.0})])
    assert (row["steady_samples_per_s"], row["samples_per_s"], row["max_staleness"]) == (500.0, 250.0, 2)
    assert abs(row["steady_samples_per_s_std"] - 141.421356) < 1e-5 and set(SPREAD) <= {k[:-4] for k in row if k.endswith("_std")}
    assert row["staleness_hist"] == {"0": 0.25, "1": 0.25, "2": 0.5}
    assert len(row["runs"]) == 2 and all("_steady" not in r for r in row["runs"])  # kept, minus the raw metrics


def test_calibration_reads_rates_and_dynamic_samplings_keep_rate_from_the_steps():
    from fleet.calibration import calibrate

    def step(i):  # 10 steps of two runs, pooled (steps 4-8 twice: the actor's counters start again)
        return {"step": 4 + i % 5, "train_s": 0.1 + 0.001 * (100 + 10 * i), "train_tokens": 100 + 10 * i,
                "wait_s": 0.2, "broadcast_s": 0.05 + 0.01 * i, "tokens": 2000, "generated": 320,
                # 20 groups reached dynamic sampling, which dropped 6 (1 all correct, 5 all wrong); 8 were
                # trained, 4 dropped as too stale (on arrival: not received), 2 for their lease
                "groups_received": 20, "drop_all_correct": 1, "drop_all_wrong": 5, "groups_kept": 8,
                "drop_stale": 4, "drop_unleased": 2,
                # the actor's cumulative counters: updates 0.3 s a step but 0.2 s at step 7; scoring 0.5 s
                "actor_update_s": (i % 5) * 0.3 - (0.1 if i % 5 >= 3 else 0.0) + 0.01, "actor_score_s": (i % 5) * 0.5}

    cal = calibrate([step(i) for i in range(10)], actor_idle_s=1.0, n=16, seqs_in_flight=256)
    r = cal["rates"]
    assert abs(r["load_s"] - (0.2 - 0.05)) < 1e-9  # the fastest update, less the transfer the simulator adds
    assert abs(r["train_s_per_token"] - 0.001) < 1e-9 and abs(r["train_s_fixed"] - 0.1) < 1e-9
    assert r["sync_s_fixed"] == 0.05  # the fastest update: nothing in flight to wait for
    assert abs(cal["keep_rate"] - 14 / 20) < 1e-12  # dynamic sampling's own: admission's drops are the simulator's
    assert abs(r["score_s_per_group"] - 0.5 / 20) < 1e-12  # a step scores 320 / 16 groups in 0.5 s
    assert r["contention"] == 0.0  # not asked for: roles on devices of their own
    assert cal["mean_tokens"] == 2000 / 320
    loop = 10 * (0.2 + 0.05) + sum(0.1 + 0.001 * (100 + 10 * i) + 0.01 * i for i in range(10))
    assert abs(cal["busy_tokens_per_s"] - 20000 / (loop - 1.0)) < 1e-6


def test_calibration_on_a_shared_host_measures_how_much_generation_slows_the_learner():
    """A step takes 1.2 s, plus β = 1/3 of each second the actor generated meanwhile (its busy seconds in
    the step, from its idle counter, less the learner's waiting): contention β / (1 - β) = 0.5."""
    from fleet.calibration import calibrate, fit_step

    rows, t, idle = [], 0.0, 0.0
    for i, overlap in enumerate([0.0, 0.3, 0.9, 0.1, 0.6, 0.0, 1.2, 0.4]):
        train, wait = 1.2 + overlap / 3, 0.25
        step_s = wait + train + 0.05
        t, idle = t + step_s, idle + step_s - (wait + overlap)  # busy: the wait, and `overlap` of the step
        rows.append({"step": i + 4, "time": t, "actor_idle_s": idle, "train_s": train, "train_tokens": 300,
                     "wait_s": wait, "broadcast_s": 0.05, "tokens": 900, "generated": 320, "groups_received": 20,
                     "drop_all_correct": 0, "drop_all_wrong": 6})
    per_token, fixed, contention = fit_step(rows, shared_host=True)
    assert per_token == 0.0 and abs(fixed - 1.2) < 1e-9 and abs(contention - 0.5) < 1e-9
    assert fit_step(rows)[2] == 0.0  # roles on devices of their own: no contention fitted
    assert abs(calibrate(rows, 1.0, 16, 256, shared_host=True)["rates"]["contention"] - 0.5) < 1e-9


def test_shared_cores_re_time_the_running_groups_and_the_step():
    """With contention c, a group runs 1 + c times slower while the learner trains, and the step while a
    group runs: what is left of each is stretched (or shrunk back) when that changes."""
    sim = Sim(Fleet(actors=1, rates=Rates(contention=0.5)))
    g = SimpleNamespace(policy_version=0)
    sim.actors[0].inflight = {7: [10.0, g]}
    sim.now, sim.training = 4.0, True
    sim._train = [6.0, 1, []]  # a step under way, to end at 6 s unslowed
    sim._contend()
    assert sim._slow == (1.5, 1.5)
    assert sim.actors[0].inflight[7][0] == 4.0 + 6.0 * 1.5  # 6 s left of the group, 1.5 × as long
    assert sim._train[0] == 4.0 + 2.0 * 1.5 and sim._train[1] == 2  # re-timed: the old event is void
    sim.now, sim.training = 6.0, False  # the step ends: the group speeds up again
    sim._contend()
    assert sim.actors[0].inflight[7][0] == 6.0 + (13.0 - 6.0) / 1.5


def test_shared_cores_cost_an_off_policy_job_more_than_an_on_policy_one():
    """Generating a step takes about as long as training it. On-policy (K = 0) the actor mostly waits while
    the learner trains, so sharing cores costs the job less (only what it generates beyond the step's need
    overlaps); with K = 1 they run side by side, and both slow down."""
    def sps(k, c):
        return statistics.mean(simulate(Fleet(actors=1, n=16, prompts_per_step=8, prompts_per_request=8,
                                              max_staleness=k, mean_tokens=64, steps=30, seed=s,
                                              rates=Rates(gen_tokens_per_s=2000, gen_half_seqs=16, train_s_fixed=6.0,
                                                          contention=c))).samples_per_s for s in range(3))
    loss = {k: 1 - sps(k, 0.5) / sps(k, 0.0) for k in (0, 1)}
    assert loss[1] > 0.15 and loss[1] > loss[0] + 0.04, loss


def test_a_prompts_completions_share_one_length_or_draw_their_own():
    """`lengths = "prompt"` (the throughput task's budget per prompt): a group lasts as long as its one
    draw, not as long as the longest of N draws, so the same fleet generates faster."""
    base = dict(actors=1, n=16, mean_tokens=256, length_sigma=1.0, max_tokens=1024, steps=20)
    per_prompt = Sim(Fleet(**base, lengths="prompt"))._lengths()
    per_completion = Sim(Fleet(**base, lengths="completion"))._lengths()
    assert len(per_prompt) == len(per_completion) == 16
    assert len(set(per_prompt)) == 1 and len(set(per_completion)) > 1
    fast = simulate(Fleet(**base, lengths="prompt")).samples_per_s
    assert fast > 1.3 * simulate(Fleet(**base, lengths="completion")).samples_per_s
    with pytest.raises(ValueError, match="lengths"):
        Sim(Fleet(**base, lengths="group"))._lengths()


def test_steps_can_vary_as_the_measured_ones_did():
    """`train_s_spread`: each simulated step takes its fitted time times a factor drawn from the measured
    steps' (a run with compiler stalls); `step_spread` gives those factors."""
    from fleet.calibration import step_spread

    def train_s_per_step(spread):
        res = simulate(small(rates=Rates(train_s_fixed=1.0, train_s_per_token=0.0, train_s_spread=spread)))
        return res.learner_train_share * res.sim_s / res.steps

    assert train_s_per_step(()) == pytest.approx(1.0)
    assert train_s_per_step((3.0,)) == pytest.approx(3.0)
    assert 1.0 < train_s_per_step((1.0, 5.0)) < 5.0  # drawn, not averaged away or fixed
    rows = [{"train_s": 0.1 + 0.001 * t * f, "train_tokens": t} for t, f in ((100, 1), (200, 3), (300, 1))]
    assert step_spread(rows, 0.001, 0.1, 0.0) == pytest.approx((1.0, 0.7 / 0.3, 1.0))


@pytest.mark.parametrize("mode", ["finish", "keep"])
def test_adaptive_rollouts_spend_a_first_wave_on_settled_prompts_and_two_waves_on_the_rest(mode):
    """`first_wave`: a settled prompt costs its first wave and is dropped; a mixed one holds the engine for its
    first wave, then the rest of N, and is kept. Every group generated is one of those two sizes, and at the
    same settled share as fixed N's dropped share, more of what is generated is trained."""
    sim = Sim(small(n=32, first_wave=4, settled_first=0.5, in_flight=mode, length_sigma=0.5, steps=30))
    sizes: list[tuple[int, bool]] = []
    arrive = sim.arrive

    def spy(g):
        sizes.append((g.n, g.settled))
        arrive(g)
    sim.arrive = spy
    res = sim.run()
    assert sizes and {n for n, _ in sizes} == {4, 32} and all((n == 4) == settled for n, settled in sizes)
    assert 0.3 < sum(s for _, s in sizes) / len(sizes) < 0.7
    fixed = simulate(small(n=32, keep_rate=0.5, in_flight=mode, length_sigma=0.5, steps=30))
    assert res.trained_samples_per_s / res.samples_per_s > fixed.trained_samples_per_s / fixed.samples_per_s


def test_without_a_first_wave_the_adaptive_settings_change_nothing():
    """Fixed N ignores the adaptive rule's settings and draws no random number for them."""
    a, b = simulate(small(length_sigma=0.5)), simulate(small(length_sigma=0.5, settled_first=0.9))
    assert a == b


def test_the_h200_calibration_is_the_loops_own_run_with_its_raw_engines_tokens_per_s(tmp_path):
    """`--calibration h200-1.5b` is what `bench.fleet --only gpu` calibrates from the H200 loop at N = 512: the
    engine at the raw run's tokens/s (not its samples/s at the loop's length: the two runs' completions drew
    other budgets), the learner's step and the update from the run."""
    import json

    from bench.fleet import H200_CALIBRATION, _gpu_validate_one
    from cli import main
    from fleet.calibration import H200_DEFAULT, RESULTS, load

    stem, n = H200_CALIBRATION
    rows, cals = _gpu_validate_one(stem, seeds=1)
    e2e = json.loads((RESULTS / f"{stem}.json").read_text())
    raw = next(r for r in e2e["raw"] if r["n"] == n)
    seqs = n * (e2e["samples_per_step"] // n)
    assert cals[n]["rates"]["gen_tokens_per_s"] == pytest.approx(raw["tokens_per_s"] * (seqs + 128) / seqs)
    assert raw["samples_per_s"] * cals[n]["mean_tokens"] < 0.8 * raw["tokens_per_s"]  # why samples/s would not do
    saved = load(H200_DEFAULT)
    assert saved["stamp"]["from"] == f"bench/results/{stem}.json"
    assert {k: v for k, v in saved["rates"].items() if k != "train_s_spread"} == pytest.approx(
        {k: v for k, v in cals[n]["rates"].items() if k != "train_s_spread"})
    assert [r["n"] for r in rows] == [n] and rows[0]["samples_per_s_measured"] == e2e["runs"][0]["samples_per_s"]
    assert main(["simulate-fleet", "--gpus", "4", "--calibration", "h200-1.5b", "--n", str(n), "--prompts-per-step", "4",
                 "--steps", "4", "--seeds", "1", "--out", str(tmp_path)]) == 0
    assert len(json.loads((tmp_path / "fleet.json").read_text())["rows"]) == 3  # 1 + 3, 2 + 2, 3 + 1
