"""bench.peers' bookkeeping: the steady state leaves the warm-up out, a rerun replaces its own row only, and
both peers get prompts of the asked length scored by the throughput rule."""

import json

import pytest

from bench import common, peers


def test_steady_state_leaves_the_warm_up_steps_out():
    st = peers.steady([30.0, 10.0, 12.0], warmup=1, samples_per_step=512)
    assert st == {"s_per_step": 11.0, "samples_per_s": 512 / 11.0, "measured_steps": 2}
    with pytest.raises(ValueError, match="none after the 2 warm-up"):
        peers.steady([30.0, 10.0], warmup=2, samples_per_step=512)


def test_a_rerun_replaces_its_own_row_and_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(peers, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "stamp", lambda: {"device": "test"})  # not torch's, vLLM's... imports
    drawn = []
    monkeypatch.setattr(peers, "plot", lambda runs, out: drawn.append(len(runs)))  # matplotlib: seconds
    row = {"peer": "trl", "shape": "small", "n": 16, "prompts_per_step": 2, "samples_per_step": 32, "prompt_len": 8,
           "completion_len": 4, "status": "ok", "samples_per_s": 3.0, "s_per_step_all": [2.0, 1.0]}
    peers.save("peers_t", row)
    peers.save("peers_t", {**row, "peer": "brorl", "samples_per_s": 5.0})
    peers.save("peers_t", {**row, "samples_per_s": 4.0})  # the same peer and N again
    runs = json.loads((tmp_path / "peers_t.json").read_text())["runs"]
    assert sorted((r["peer"], r["samples_per_s"]) for r in runs) == [("brorl", 5.0), ("trl", 4.0)]
    assert drawn == [1, 2, 2]  # the figure redrawn from every row after each run


def test_prompts_have_the_asked_length_and_the_reward_is_the_throughput_rule():
    rows = peers.prompts(4, 40, seed=0)
    assert [len(r["prompt"]) for r in rows] == [40] * 4
    assert peers.reward(["x", "y"], ["1.000000", "0.000000"]) == [1.0, 0.0]


def test_the_card_memory_sampler_keeps_the_fullest_cards_peak(tmp_path, monkeypatch):
    """`bench.common.GpuMemory` (bench.peers and bench.e2e): the peak over samples of the fullest card, from
    nvidia-smi's MiB lines; None where there is no nvidia-smi."""
    from bench.common import GpuMemory

    monkeypatch.setenv("PATH", str(tmp_path))
    with GpuMemory(every=0.05) as mem:
        pass
    assert mem.peak_gib is None  # no nvidia-smi here
    used = tmp_path / "used"
    used.write_text("1024\n3072\n")
    smi = tmp_path / "nvidia-smi"  # a stand-in printing one line per card, as the real one does
    smi.write_text(f"#!/bin/sh\nexec /bin/cat {used}\n")
    smi.chmod(0o755)
    mem = GpuMemory(every=0.05)
    mem.sample()
    used.write_text("2048\n1024\n")
    mem.sample()
    assert mem.peak_gib == 3.0


def test_a_benchmark_refuses_a_run_whose_held_out_curve_has_a_hole(tmp_path):
    """`bench.common.load_run`: an estimate that failed is an `error` row (the run trained on without it); the
    benchmarks built on the curve (staleness, BroRL against ProRL, saturation) say so instead of a KeyError."""
    import json

    import pytest

    from bench.common import load_run

    rows = [{"step": 0, "pass_at_1": 0.2}, {"step": 2, "version": 2, "error": "RuntimeError: CUDA out of memory"}]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match=r"failed at step\(s\) \[2\] \(RuntimeError: CUDA out of memory\)"):
        load_run(tmp_path)
    (tmp_path / "heldout.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert load_run(tmp_path)["heldout"] == rows[:1]


def test_the_time_sharing_bound_needs_the_learner_timed_alone():
    """`bench.e2e.timeshare_bound`: a co-run's own train seconds are slowed by the engine beside it, so without a
    time-shared run at that N there is no bound; with one, a step's raw generation time plus its train seconds."""
    from bench.e2e import timeshare_bound

    raws = {16: {"samples_per_s": 64.0}}
    co = {"n": 16, "share_gpu": "corun", "prompts_per_step": 32, "train_s_per_step": 9.0}
    runs = [co]
    timeshare_bound(runs, raws)
    assert co["timeshare_bound_samples_per_s"] is None and co["learner_alone_s_per_step"] is None
    ts = {"n": 16, "share_gpu": "timeshare", "prompts_per_step": 32, "train_s_per_step": 4.0}
    timeshare_bound(runs + [ts], raws)
    assert co["learner_alone_s_per_step"] == 4.0
    assert co["timeshare_bound_samples_per_s"] == ts["timeshare_bound_samples_per_s"] == 512 / (512 / 64 + 4.0)
