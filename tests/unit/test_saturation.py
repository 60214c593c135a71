"""bench.saturation's criterion and paired test: pure functions on held-out rows."""

import math

import pytest

from bench.arms import paired
from bench.saturation import noise, saturation_step

K, N = 16, 64


def row(step: int, p: float) -> dict:
    """A held-out row whose every prompt solved a fraction p of its K samples (rounded)."""
    c = round(p * K)
    return {"step": step, "pass_at_1": c / K, "correct": [c] * N}


def test_noise_is_the_standard_error_of_the_mean_over_a_fixed_prompt_set():
    r = row(0, 0.5)
    assert noise(r, K) == pytest.approx(math.sqrt(N * 0.25 / K) / N)
    assert noise(row(0, 0.0), K) == 0.0  # nothing to sample: no noise


def test_saturation_is_where_the_window_mean_sets_no_new_best_for_a_while():
    rising = [row(20 * i, 0.1 + 0.03 * i) for i in range(20)]  # +3 points per evaluation: never saturated
    assert saturation_step(rising, K) is None
    flat_after = [row(20 * i, min(0.1 + 0.1 * i, 0.5)) for i in range(16)]  # flat from step 80 on
    # the window mean (4 evaluations) is last bettered at step 140 (all four at 0.5); 6 evaluations later
    assert saturation_step(flat_after, K) == 260
    assert saturation_step(flat_after, K, window=2, patience=3) == 160
    # a dip shorter than the patience and its recovery: not a plateau; the bests after it (up to step 220)
    # restart the count
    swing = [row(20 * i, p) for i, p in enumerate([0.1, 0.2, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.4, 0.4, 0.4, 0.4]
                                                   + [0.4] * 6)]
    assert saturation_step(swing, K) == 340
    # a stall of 10 evaluations, then a climb of 20 points: the stall was not saturation (the first firing, at
    # step 220, is withdrawn); the plateau after the climb is, once it has lasted the patience
    stall = [0.1, 0.2, 0.3] + [0.3] * 10
    assert saturation_step([row(20 * i, p) for i, p in enumerate(stall + [0.5] * 10)], K) == 440
    assert saturation_step([row(20 * i, p) for i, p in enumerate(stall + [0.5] * 4)], K) is None  # still climbing
    assert saturation_step([row(20 * i, p) for i, p in enumerate(stall)], K) == 220


def test_paired_test_signs_and_significance():
    a = [0.2, 0.4, 0.6, 0.8] * 50
    up = paired(a, [x + 0.1 + 0.01 * (i % 3) for i, x in enumerate(a)])
    assert up["n"] == 200 and up["mean_diff"] == pytest.approx(0.11, abs=0.005) and up["t"] > 10 and up["p"] < 1e-6
    same = paired(a, [x + (0.05 if i % 2 else -0.05) for i, x in enumerate(a)])
    assert abs(same["mean_diff"]) < 1e-12 and same["p"] > 0.9


def test_arms_records_compare_prompt_by_prompt_and_summarise_over_seeds():
    from bench.arms import record, rows, tests

    def res(start, end, gen):
        h = [{"pass_at_1": sum(c) / 16 / len(c), "pass_at_k": sum(x > 0 for x in c) / len(c), "correct": c,
              "generated": g, "wall_s": w} for c, g, w in ((start, 0, 0.0), (end, gen, 10.0))]
        return {"metrics": [{"generated": gen, "samples": 256, "pass_rate": 0.5}], "heldout": h}

    runs = [record("a", s, res([4, 0, 8, 16], [4, 0, 8, 16], 1000), 16) for s in (0, 1)]
    runs += [record("b", s, res([4, 0, 8, 16], [8, 2, 12, 16], 400), 16) for s in (0, 1)]
    assert runs[2]["gain"] == pytest.approx(38 / 64 - 28 / 64) and runs[2]["generated"] == 400
    assert runs[2]["curve"] == [(0, 0.0, runs[2]["pass_at_1_start"]), (400, 10.0, runs[2]["pass_at_1_end"])]
    t = tests(runs, ["a", "b"], "a", 16)
    assert t["pass@1: b vs a"]["n"] == 8 and t["pass@1: b vs a"]["mean_diff"] == pytest.approx(10 / 4 / 16)
    assert t["pass@16: b vs a"]["mean_diff"] == pytest.approx(1 / 4)  # the prompt with 0 right now has 2
    assert t["pass@1: a, end vs start"]["mean_diff"] == 0
    r = rows(runs, ["a", "b"], 16, {"generated ×2": ("generated", 2)})
    assert r[1]["generated"] == "400.0 ± 0.0" and r[1]["generated ×2"] == "800.0 ± 0.0" and r[0]["arm"] == "a"


def test_records_outlive_the_run_folders_and_are_reused_only_for_the_same_overrides(tmp_path):
    from bench.arms import ROOT, Records

    path = tmp_path / "x_runs.jsonl"
    o = {"job.n_samples": 16, "model.path": str(ROOT / "runs" / "bench" / "p1" / "model")}
    first = Records(path, reuse=False)
    first.put("prorl-s0", o, {"gain": 0.1})
    first.put("prorl-s0", o, {"gain": 0.2})  # a later line of a name replaces the earlier one
    # paths under the checkout are kept relative to it: another clone's records match
    assert '"./runs/bench/p1/model"' in path.read_text() and str(ROOT) not in path.read_text()
    again = Records(path, reuse=True)  # a later session: only the file is left
    assert again.get("prorl-s0", o) == {"gain": 0.2}
    assert again.get("prorl-s0", {**o, "job.n_samples": 32}) is None  # other settings: run it again
    assert again.get("prorl-s1", o) is None
    # another experiment's run of the same settings is found by its overrides, whatever its name
    assert again.find(o) == ("prorl-s0", {"gain": 0.2}) and again.find({**o, "job.n_samples": 32}) is None
    assert Records(path, reuse=False).get("prorl-s0", o) is None and path.read_text() == ""  # a fresh experiment


def test_the_token_level_prediction_runs_each_arm_at_its_own_updates_and_rate():
    from bench.saturation import ARMS, BASE_LR, token_level_prediction

    pred = token_level_prediction(ARMS, 0.37, 61_440, seeds=2, vocab=200)
    assert set(pred) == set(ARMS)
    assert pred["ProRL (N=16)"]["steps"] == 240 and pred["BroRL (N=512)"]["steps"] == 30
    assert pred["BroRL (N=512, η0)"]["lr"] == BASE_LR and pred["BroRL (N=512)"]["lr"] == pytest.approx(BASE_LR * math.sqrt(8))
    # free logits, exact-ish gradients at N = 512: every arm gains, and the larger rate gains more in as many steps
    assert all(p["gain_points"] > 0 for p in pred.values())
    assert pred["BroRL (N=512)"]["gain_points"] > pred["BroRL (N=512, η0)"]["gain_points"]


def test_a_records_training_stats_say_how_far_each_update_moved_the_policy():
    from bench.arms import rows, train_stats

    m = [{"approx_kl": kl, "clip_frac_low": 0.1, "grad_norm": 2.0, "entropy": e, "truncated_frac": 0.0}
         for kl, e in ((0.01, 1.0), (0.03, 0.8), (0.05, 0.5), (0.07, 0.2))]
    st = train_stats(m, ends=2)
    assert st["approx_kl"] == pytest.approx(0.04) and st["entropy_start"] == pytest.approx(0.9)
    assert st["entropy_end"] == pytest.approx(0.35) and st["clip_frac_low"] == pytest.approx(0.1)
    base = {"steps": 4, "pass_at_1_start": 0.5, "pass_at_1_end": 0.5, "gain": 0.0, "pass_at_k_start": 1.0,
            "pass_at_k_end": 1.0, "generated": 10, "pass_rate": 1.0, "train_wall_s": 1.0}
    r = rows([{"arm": "a", "seed": 0, **base, **st}, {"arm": "b", "seed": 0, **base}], ["a", "b"], 16)
    assert r[0]["update KL"] == "0.0400 ± 0.0000" and r[0]["entropy end"] == "0.350 ± 0.000" and "update KL" not in r[1]  # (records stored before the stats)
