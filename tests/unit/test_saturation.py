"""bench.saturation's criterion and paired test: pure functions on held-out rows."""

import math

import pytest

from bench.saturation import noise, paired, saturation_step

K, N = 16, 64


def row(step: int, p: float) -> dict:
    """A held-out row whose every prompt solved a fraction p of its K samples (rounded)."""
    c = round(p * K)
    return {"step": step, "pass_at_1": c / K, "correct": [c] * N}


def test_noise_is_the_standard_error_of_the_mean_over_a_fixed_prompt_set():
    r = row(0, 0.5)
    assert noise(r, K) == pytest.approx(math.sqrt(N * 0.25 / K) / N)
    assert noise(row(0, 0.0), K) == 0.0  # nothing to sample: no noise


def test_saturation_is_the_first_window_whose_fitted_rise_is_within_noise():
    rising = [row(20 * i, 0.1 + 0.05 * i) for i in range(8)]  # +5 points per evaluation: never saturated
    assert saturation_step(rising, K) is None
    flat_after = [row(20 * i, min(0.1 + 0.1 * i, 0.5)) for i in range(10)]  # flat from step 80 on
    # the window of 5 evaluations ending at step 160 is the first wholly flat one
    assert saturation_step(flat_after, K) == 160
    assert saturation_step(flat_after, K, window=3) == 120


def test_paired_test_signs_and_significance():
    a = [0.2, 0.4, 0.6, 0.8] * 50
    up = paired(a, [x + 0.1 + 0.01 * (i % 3) for i, x in enumerate(a)])
    assert up["n"] == 200 and up["mean_diff"] == pytest.approx(0.11, abs=0.005) and up["t"] > 10 and up["p"] < 1e-6
    same = paired(a, [x + (0.05 if i % 2 else -0.05) for i, x in enumerate(a)])
    assert abs(same["mean_diff"]) < 1e-12 and same["p"] > 0.9
