"""The paper's qualitative simulator claims (section 4.1), on a reduced configuration that runs in CI
time (d = 16,000, |P| = 1,250, T = 300; the default run is d = 128,000, |P| = 10,000, T = 1000).
Only claims that the full default run also reproduces are asserted (docs/theory.md)."""

import subprocess
import sys
from pathlib import Path

import pytest

from theory.simulator import SimConfig, correct_set, initial_logits, simulate_one

REDUCED = SimConfig(vocab=16_000, n_correct=1_250, steps=300)


@pytest.fixture(scope="module", params=[0, 1])
def runs(request):
    cfg = SimConfig(**{**REDUCED.__dict__, "seed": request.param})
    return {n: simulate_one(cfg, n) for n in (4, 16, 512, 6400)}


def test_larger_n_grows_correct_mass_faster(runs):
    gain = {n: t.q_pos[-1] - t.q_pos[0] for n, t in runs.items()}
    assert gain[6400] > gain[512] > gain[16]
    assert gain[512] > 0 and gain[6400] > 0


def test_larger_n_increases_more_correct_tokens(runs):
    pct = {n: t.pct_increased[-1] for n, t in runs.items()}
    assert pct[6400] >= pct[512] > pct[16] > pct[4] - 1e-9
    assert pct[6400] == 100.0


def test_no_worst_case_drop_at_largest_n(runs):
    big, small = runs[6400], runs[4]
    assert big.worst_drop[-1] == 0.0  # knowledge shrinkage gone at the largest N
    assert small.worst_drop[-1] > 0.0  # ...but present at small N


def test_initialisation_and_correct_set():
    cfg = SimConfig(vocab=1000, n_correct=100)
    mask = correct_set(cfg)
    assert mask.sum() == 100 and not mask[0]
    z = initial_logits(cfg, mask)
    assert z[0] == 5 and (z[mask] == 3).all() and z[~mask][1:].abs().sum() == 0
    assert (initial_logits(SimConfig(vocab=1000, n_correct=100, init="uniform"), mask) == 0).all()
    with pytest.raises(ValueError, match="n_correct"):
        correct_set(SimConfig(vocab=10, n_correct=10))


def test_brorl_simulate_writes_csv_and_png(tmp_path):
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-m", "cli", "simulate", "--out", str(tmp_path), "--n", "4,64",
                        "--steps", "20", "--vocab", "2000", "--correct", "200"], capture_output=True, text=True,
                       cwd=root)
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "simulate.csv").read_text().splitlines()
    assert rows[0].startswith("N,step,q_pos") and len(rows) == 1 + 2 * 21
    assert (tmp_path / "simulate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Q_pos(T)" in r.stdout
