"""The fleet simulator's pure parts: its events run in time order, it applies the learner's own admission
and freshness rules, nothing is trained twice or staler than K, failures cost time but never the job."""

import math

import pytest

from fleet.sim import Fleet, Rates, Sim, simulate


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
    assert "samples_per_s" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--actors must be comma-separated int values, got 'x'"):
        main(["simulate-fleet", "--actors", "x", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--in-flight must be finish or keep"):
        main(["simulate-fleet", "--in-flight", "later", "--out", str(tmp_path)])


def test_gpu_rates_come_from_our_gpu_benchmarks_result_files():
    import json

    from fleet.calibration import RESULTS, gpu_rates

    r = gpu_rates()
    learner = json.loads((RESULTS / "learner_gpu.json").read_text())["mfu"][0]["tokens_per_s"]
    assert r.train_s_per_token == pytest.approx(1 / learner) and r.gen_tokens_per_s > 10_000 and r.sync_s_fixed > 0
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

    def step(i):  # 10 steps: 8 groups kept of 20 received, 4 of those dropped as too stale, 2 by the lease
        return {"train_s": 0.1 + 0.001 * (100 + 10 * i), "train_tokens": 100 + 10 * i, "wait_s": 0.2,
                "broadcast_s": 0.05 + 0.01 * i, "tokens": 2000, "generated": 320, "groups_received": 20,
                "groups_kept": 8, "drop_stale": 4, "drop_unleased": 2,
                # the actor's updates, cumulative: 0.3 s a step but 0.2 s at step 3; two runs pooled: the
                # second run's counter starts again (that drop is no update)
                "actor_update_s": (i % 5) * 0.3 - (0.1 if i % 5 >= 3 else 0.0) + 0.01}

    cal = calibrate([step(i) for i in range(10)], actor_idle_s=1.0, n=16, seqs_in_flight=256)
    r = cal["rates"]
    assert abs(r["load_s"] - (0.2 - 0.05)) < 1e-9  # the fastest update, less the transfer the simulator adds
    assert abs(r["train_s_per_token"] - 0.001) < 1e-9 and abs(r["train_s_fixed"] - 0.1) < 1e-9
    assert r["sync_s_fixed"] == 0.05  # the fastest update: nothing in flight to wait for
    assert cal["keep_rate"] == 8 / 14  # admission's drops are the simulator's own to make, not sampling's
    assert cal["mean_tokens"] == 2000 / 320
    loop = 10 * (0.2 + 0.05) + sum(0.1 + 0.001 * (100 + 10 * i) + 0.01 * i for i in range(10))
    assert abs(cal["busy_tokens_per_s"] - 20000 / (loop - 1.0)) < 1e-6


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
