import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from config.schema import JobConfig, LearnerConfig
from learner.logprobs import pack, token_logprobs
from learner.planning import rank_slice
from learner.planning import TrainGroup
from learner.train_step import Trainer
from tests.support.train_fixtures import fixed_groups
from transport.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _margin(model, groups):
    """mean log-prob of correct completions minus that of incorrect ones."""
    good, bad = [], []
    with torch.no_grad():
        for g in groups:
            lp, _ = token_logprobs(model, pack([g.prompt_ids] * len(g.completion_ids), g.completion_ids))
            seq = lp.sum(1)
            for s, c in zip(seq.tolist(), g.correct):
                (good if c else bad).append(s)
    return sum(good) / len(good) - sum(bad) / len(bad)


def test_training_raises_correct_over_incorrect(tiny_model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, eos = fixed_groups(tiny_model_dir, model=model)
    before = _margin(model, groups)
    cfg = LearnerConfig(num_minibatches=2, lr=1e-3, logprob_chunk_mb=0.004)
    tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos)
    metrics = [tr.step(groups) for _ in range(4)]
    after = _margin(tr.model, groups)
    assert after > before + 1.0, (before, after)
    for m in metrics:
        assert all(torch.isfinite(torch.tensor(v)) for v in m.values()), m
        assert m["minibatches"] == 2 and m["samples"] == 32
    assert tr.state.step == 4


def test_the_step_trains_what_the_batcher_kept_and_refuses_an_empty_batch(tiny_model_dir):
    """Dynamic sampling is the batcher's alone (`learner.batching`): the step filters nothing again."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, eos = fixed_groups(tiny_model_dir, groups=2, model=model)
    g = groups[0]
    all_right = TrainGroup(g.prompt_ids, g.completion_ids, g.behav_logp, [1.0] * 8, [True] * 8)
    tr = Trainer(model, LearnerConfig(num_minibatches=2), JobConfig(n_samples=8, prompts_per_step=3), pad_id=eos)
    m = tr.step([all_right, groups[1], all_right])
    assert m["groups_kept"] == 3 and m["samples"] == 24 and "train_pass_rate" not in m
    with pytest.raises(ValueError, match="groups is empty"):
        tr.step([])
    with pytest.raises(ValueError, match="behav_logp"):
        TrainGroup([1], [[1, 2]], [[0.0]], [1.0], [True])


def test_long_completions_are_counted_filtered_and_penalised(tiny_model_dir):
    """Truncated completions (finish reason "length") are counted per step; overlong filtering masks them out of
    the loss (their group keeps them in its baseline); the soft overlong penalty lowers their reward; a step
    with nothing left to train is skipped and counted, never a crash."""
    import copy

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, eos = fixed_groups(tiny_model_dir, groups=2, model=model)
    longest = max(len(c) for g in groups for c in g.completion_ids)
    groups[0].truncated = [i % 2 == 0 for i in range(8)]  # four completions of the first group were cut
    cut, cut_tokens = 4, sum(len(c) for c, t in zip(groups[0].completion_ids, groups[0].truncated) if t)
    base = LearnerConfig(num_minibatches=1, lr=1e-3)
    plain = Trainer(copy.deepcopy(model), base, JobConfig(n_samples=8, prompts_per_step=2), max_tokens=longest, pad_id=eos).step(groups)
    assert plain["truncated_frac"] == cut / 16 and plain["completion_len_max"] == longest
    assert plain["samples"] == 16 and plain["overlong_masked"] == 0
    filt = Trainer(copy.deepcopy(model), base.model_copy(update={"overlong_filter": True}), JobConfig(n_samples=8, prompts_per_step=2),
                   max_tokens=longest, pad_id=eos).step(groups)
    assert filt["overlong_masked"] == cut and filt["samples"] == 16 - cut
    assert filt["train_tokens"] == plain["train_tokens"] - cut_tokens
    pen = Trainer(copy.deepcopy(model), base.model_copy(update={"overlong_buffer": 2}), JobConfig(n_samples=8, prompts_per_step=2),
                  max_tokens=longest, pad_id=eos).step(groups)
    assert pen["reward_mean"] < plain["reward_mean"]  # the cut completions lost reward (up to 1 each)
    # nothing left: every completion cut and filtered, or every completion empty
    everything = [copy.copy(g) for g in groups]
    for g in everything:
        g.truncated = [True] * 8
    tr = Trainer(copy.deepcopy(model), base.model_copy(update={"overlong_filter": True}), JobConfig(n_samples=8, prompts_per_step=2), pad_id=eos)
    m = tr.step(everything)
    assert m["step_empty"] == 1.0 and m["samples"] == 0 and tr.state.step == 1
    empty = [TrainGroup(g.prompt_ids, [[] for _ in range(8)], [[] for _ in range(8)], g.rewards, g.correct)
             for g in groups]
    assert tr.step(empty)["step_empty"] == 1.0 and tr.state.step == 2


def test_reference_reset_zeroes_kl(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, eos = fixed_groups(tiny_model_dir, model=model)
    cfg = LearnerConfig(num_minibatches=2, lr=1e-3, kl_coef=0.1, ref_reset_interval=2)
    tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=4), pad_id=eos)
    m1 = tr.step(groups)
    m2 = tr.step(groups)  # a reset happens after this step
    assert m2["ref_reset"] == 1.0 and m2["ref_kl"] > 0
    m3 = tr.step(groups)
    # right after the reset, the first mini-batch's KL to the reference is exactly zero; the
    # second mini-batch sees one update's worth, so the mean is far below the pre-reset value.
    assert m3["ref_kl"] < m2["ref_kl"] / 3
    packed = pack([groups[0].prompt_ids] * 8, groups[0].completion_ids)
    tr.reset_reference()
    with torch.no_grad():
        a, _ = token_logprobs(tr.model, packed)
        b, _ = token_logprobs(tr.state.ref_model, packed)
    assert torch.equal(a, b)
    assert m1["ref_kl"] == pytest.approx(0.0, abs=1e-12) or m1["ref_kl"] < m2["ref_kl"]


def test_lr_follows_sqrt_rule(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    cfg = LearnerConfig(lr=2e-6, lr_base_samples=512 * 16)
    tr = Trainer(model, cfg, JobConfig(n_samples=512, prompts_per_step=128))
    assert tr.lr == pytest.approx(2e-6 * (128 * 512 / (512 * 16)) ** 0.5)
    assert tr.backend.optimizer.param_groups[0]["lr"] == tr.lr


def test_an_optimizer_reset_keeps_the_scaled_learning_rate(tiny_model_dir):
    """A reference reset with `reset_optimizer_on_ref_reset` gives fresh AdamW moments at the step's
    sqrt-scaled rate, not at the configured base rate."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    cfg = LearnerConfig(lr=2e-6, lr_base_samples=512 * 16, kl_coef=0.1,
                        reset_optimizer_on_ref_reset=True)
    tr = Trainer(model, cfg, JobConfig(n_samples=512, prompts_per_step=128))
    assert tr.lr != cfg.lr
    tr.reset_reference()
    assert [g["lr"] for g in tr.backend.optimizer.param_groups] == [tr.lr] * len(tr.backend.optimizer.param_groups)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_every_rank_gets_a_part_of_every_mini_batch(world):
    """n >= world samples split over `world` ranks: contiguous, covering, sizes within one, none empty
    (5 samples on 4 ranks used to leave the last rank nothing)."""
    for n in range(world, 70):
        parts = [rank_slice(n, r, world) for r in range(world)]
        assert parts[0][0] == 0 and parts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        sizes = [b - a for a, b in parts]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (n, sizes)



def _run_worker(model_dir, out, backend, world, steps=2, micro_batch_tokens=0, device="cpu", zero_stage=2):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1", **({"DS_ACCELERATOR": "cpu"} if device == "cpu" else {})}
    procs = []
    for rank in range(world):
        e = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.support.ds_worker", model_dir, str(out), backend,
                                       str(steps), str(micro_batch_tokens), device, str(zero_stage)], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        logs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return json.loads(Path(str(out) + ".json").read_text()), torch.load(str(out) + ".pt")


@pytest.fixture(scope="module")
def torch_step(tiny_model_dir, tmp_path_factory):
    """The single-process torch step every DeepSpeed case is compared with (run once: it is the same for all)."""
    return _run_worker(tiny_model_dir, tmp_path_factory.mktemp("torch-step") / "torch", "torch", 1)


@pytest.mark.slow
@pytest.mark.parametrize("world,micro,mode,zero", [(1, 0, "deepspeed", 2),
                                                   (2, 40, "deepspeed", 2), (2, 40, "deepspeed-ranks-compiled", 2),
                                                   (3, 0, "deepspeed-ranks", 2), (2, 40, "deepspeed-ranks", 3)])
def test_deepspeed_matches_torch(tiny_model_dir, tmp_path, torch_step, world, micro, mode, zero):
    """DeepSpeed ZeRO-2 on 1, 2 or 3 gloo ranks gives the single-process torch step; with token-budget
    micro-batches (ranks cut their parts into as many passes each, gradients accumulated to one boundary)
    too; and so does the service's protocol, where rank 0 plans the step and hands each rank only its
    share ("deepspeed-ranks"), also compiled, every rank warmed up first ("deepspeed-ranks-compiled": the
    warm-up leaves the steps nothing to compile and changes nothing they compute); also under ZeRO-3
    (parameters partitioned, gathered by both ranks to read)."""
    ref_m, ref_w = torch_step
    ds_m, ds_w = _run_worker(tiny_model_dir, tmp_path / "ds", mode, world, micro_batch_tokens=micro, zero_stage=zero)
    assert ds_m["world"] == world
    if mode.endswith("compiled"):
        assert ds_m["warm_up_s"] > 0 and ds_m["compiled_in_steps"] == 0
    assert all(n > 2 for n in ds_m["micro_batches"]) if micro else ds_m["micro_batches"] == [2, 2]
    assert ds_m["losses"] == pytest.approx(ref_m["losses"], rel=1e-4, abs=1e-6)
    init = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    # Adam normalises each element's step to ~lr (1e-3 here), so float32 summation-order noise in a near-zero
    # gradient can move one element by a few % of a step (seen: 1.2e-5 in one of ~1M elements with 2 ranks;
    # 5.6e-5 under ZeRO-3, whose reduce-scatter sums in another order, on one CPU and not on another).
    # A real error (a rank's loss scaled wrongly, a slice lost) changes the whole update by tens of percent.
    moved = diff = update = 0.0
    for k, v in ref_w.items():
        torch.testing.assert_close(ds_w[k], v, rtol=1e-4, atol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
        moved = max(moved, (v - init[k]).abs().max().item())
        diff += (ds_w[k] - v).float().pow(2).sum().item()
        update += (v - init[k]).float().pow(2).sum().item()
    assert moved > 1e-4  # the update really changed the weights
    assert (diff / update) ** 0.5 < 1e-3, (diff / update) ** 0.5  # and both backends made the same update


def test_nonfinite_gradient_skips_the_update_and_is_counted(tiny_model_dir):
    """A NaN gradient (forced through a hook on one weight) never reaches the weights or the AdamW moments:
    the mini-batch is skipped and counted; a finite step afterwards trains as usual."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, eos = fixed_groups(tiny_model_dir)
    tr = Trainer(model, LearnerConfig(num_minibatches=2, lr=1e-3), JobConfig(n_samples=8, prompts_per_step=len(groups)),
                 pad_id=eos)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    p = next(tr.model.parameters())
    hook = p.register_hook(lambda g: g * float("nan"))
    m = tr.step(groups)
    assert m["nonfinite_skipped"] == 2 and m["step_skipped"] == 1.0 and tr.state.step == 1
    assert all(torch.equal(v, before[k]) for k, v in tr.model.state_dict().items())
    assert not tr.backend.optimizer.state
    hook.remove()
    m = tr.step(groups)
    assert m["nonfinite_skipped"] == 0 and m["step_skipped"] == 0.0 and torch.isfinite(torch.tensor(m["loss"]))
    assert any(not torch.equal(v, before[k]) for k, v in tr.model.state_dict().items())


def test_bf16_parameters_are_refused_and_bf16_compute_keeps_fp32_master_weights(tiny_model_dir):
    """AdamW on bf16 parameters at the BroRL rate rounds most updates away, so a bf16 model is refused;
    with float32 master weights and bf16 autocast, nearly every element moves."""
    groups, eos = fixed_groups(tiny_model_dir)
    cfg = LearnerConfig(num_minibatches=2, lr=5.7e-6, lr_base_samples=len(groups) * 8)
    with pytest.raises(ValueError, match="bfloat16 parameters.*round most RL-sized updates away"):
        Trainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16), cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)))
    losses = {}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos, compute_dtype=dtype)
        losses[dtype] = [tr.step(groups)["loss"] for _ in range(3)]
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())
        trained = [k for k, p in tr.model.named_parameters() if p.requires_grad]
        moved = sum(int((tr.model.state_dict()[k] != before[k]).sum()) for k in trained)
        total = sum(before[k].numel() for k in trained)
        assert moved / total > 0.9, (dtype, moved / total)
    # the passes really ran in bf16: close to the float32 losses, not equal to them
    assert losses[torch.bfloat16] != losses[torch.float32]
    assert losses[torch.bfloat16] == pytest.approx(losses[torch.float32], rel=0.1, abs=0.02)


def _varied_groups(tiny_model_dir, prompt_repeat: int = 1):
    """The fixed groups with completions of different lengths (completion i gets i % 5 more tokens), so that
    micro-batches are padded (or not, or single rows); `prompt_repeat`: a longer prompt."""
    groups, eos = fixed_groups(tiny_model_dir)
    for g in groups:
        g.prompt_ids = g.prompt_ids * prompt_repeat
        g.completion_ids = [c + [eos] * (i % 5) for i, c in enumerate(g.completion_ids)]
        g.behav_logp = [b + [-1.5] * (i % 5) for i, b in enumerate(g.behav_logp)]
    return groups, eos


def _one_step(tiny_model_dir, groups, eos, warm_up=False, reuse_old=True, **over):
    """One step's metrics and the accumulated gradient of each mini-batch, as the optimizer got it (in
    float64, so that summation order leaves no visible trace). `warm_up` (`learner.compile`): the compile
    warm-up first (as the first step runs it), which must change no weight and leave no gradient; the
    metrics then say how many frames the rest of the step compiled (`compiled_in_step`)."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    cfg = LearnerConfig(**{"num_minibatches": 2, "lr": 1e-3, **over})
    tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos)
    tr.reuse_old = reuse_old
    no_grad_passes, logp = [0], tr._logp

    def counting_logp(model, packed, grad):
        no_grad_passes[0] += not grad
        return logp(model, packed, grad)
    tr._logp = counting_logp
    if warm_up:
        before = {k: v.clone() for k, v in tr.model.state_dict().items()}
        tr.compiling.ensure(tr)
        assert tr.compiling.seconds > 0
        assert all(torch.equal(v, before[k]) for k, v in tr.model.state_dict().items())
        assert all(p.grad is None for p in tr.model.parameters())
    grads, step = [], tr.backend.step

    def recording_step():
        grads.append({k: p.grad.clone() for k, p in tr.model.named_parameters() if p.grad is not None})
        return step()
    tr.backend.step = recording_step
    frames = counters["frames"]["ok"]
    passes_before = no_grad_passes[0]
    m = tr.step(groups)
    m["no_grad_passes"] = no_grad_passes[0] - passes_before
    if warm_up:
        m["compiled_in_step"] = counters["frames"]["ok"] - frames
    return m, grads


@pytest.mark.parametrize("minibatches", [1, 3])
def test_reusing_the_first_minibatch_forward_as_pi_old_is_exact(tiny_model_dir, minibatches):
    """π_old of the first mini-batch taken from its training forward (no no-grad pass for it) gives the loss,
    the metrics and every mini-batch's gradient of the step that recomputes it, bit for bit; with one
    mini-batch the step runs no no-grad pass at all."""
    groups, eos = _varied_groups(tiny_model_dir)
    over = {"num_minibatches": minibatches, "micro_batch_tokens": 64}
    ref_m, ref_g = _one_step(tiny_model_dir, groups, eos, reuse_old=False, **over)
    m, g = _one_step(tiny_model_dir, groups, eos, **over)
    assert len(g) == len(ref_g) == minibatches
    per_mb = ref_m["no_grad_passes"] // minibatches  # micro-batches per mini-batch (as many in each, here)
    assert ref_m["no_grad_passes"] >= minibatches and m["no_grad_passes"] == ref_m["no_grad_passes"] - per_mb
    assert m.pop("no_grad_passes") != ref_m.pop("no_grad_passes")
    assert m.keys() == ref_m.keys()
    # the step's model FLOPs (learner/flops.py) leave out the skipped forward: fewer, by a forward of the first
    # mini-batch's samples; a CPU has no known peak, so no MFU
    flops, ref_flops = (x.pop("model_tflops") * x.pop("train_s") for x in (m, ref_m))
    assert 0 < flops < ref_flops and "mfu" not in m
    assert ref_flops - flops == pytest.approx(ref_flops / (4 * minibatches), rel=0.5)
    assert m == ref_m
    for mine, ref in zip(g, ref_g):
        assert mine.keys() == ref.keys()
        for k, v in ref.items():
            assert torch.equal(mine[k], v), k


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean"])
def test_token_budget_micro_batches_and_checkpointing_equal_the_unsplit_step(tiny_model_dir, loss_agg):
    """Micro-batches of at most a few padded tokens (gradient accumulation), activation checkpointing and
    the LM head's logits kept for backward (`learner.logprob_recompute = False`) give the loss and the gradients of one pass over each whole mini-batch, with less padding."""
    groups, eos = _varied_groups(tiny_model_dir)
    ref_m, ref_g = _one_step(tiny_model_dir, groups, eos, loss_agg=loss_agg)
    for over in ({"micro_batch_tokens": 40}, {"micro_batch_tokens": 1}, {"activation_checkpointing": True},
                 {"micro_batch_tokens": 64, "activation_checkpointing": True},
                 {"micro_batch_tokens": 64, "activation_checkpointing": True, "activation_checkpointing_fraction": 0.5},
                 {"micro_batch_tokens": 64, "logprob_recompute": False}):
        m, g = _one_step(tiny_model_dir, groups, eos, loss_agg=loss_agg, **over)
        assert m["micro_batches"] > ref_m["micro_batches"] or "micro_batch_tokens" not in over, over
        assert m["loss"] == pytest.approx(ref_m["loss"], rel=1e-10, abs=1e-12), over
        assert m["train_tokens"] == ref_m["train_tokens"]
        assert len(g) == len(ref_g) == 2 and all(set(a) == set(b) for a, b in zip(g, ref_g))
        for mine, ref in zip(g, ref_g):  # each mini-batch's gradient, as the optimizer got it
            for k, v in ref.items():
                torch.testing.assert_close(mine[k], v, rtol=1e-9, atol=1e-12, msg=lambda s: f"{over} {k}: {s}")
        if over.get("micro_batch_tokens", 0) > 1:
            assert m["padding_frac"] < ref_m["padding_frac"], (m["padding_frac"], ref_m["padding_frac"])


def test_a_checkpointing_fraction_recomputes_that_share_of_the_layers_only(tiny_model_dir):
    """`learner.activation_checkpointing_fraction = 0.5`: half the decoder layers, spread over the depth,
    run their forward again in backward; the others run it once."""
    from learner.backends import enable_activation_checkpointing

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    layers = model.get_decoder().layers
    assert enable_activation_checkpointing(model, 0.5) == [1, 3]
    calls = [0] * len(layers)
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
    model(torch.arange(12)[None]).logits.sum().backward()
    assert calls == [1, 2, 1, 2]
    model2 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert enable_activation_checkpointing(model2, 1.0) == [0, 1, 2, 3]
    assert enable_activation_checkpointing(model2, 0.25) == [3]


def test_compiled_layers_and_log_probs_give_the_eager_step(tiny_model_dir):
    """`learner.compile`: the compiled decoder layers and log-prob chunks (dynamic shapes: micro-batches of
    several lengths) give the eager step's loss and gradients, with activation checkpointing on too (half the
    layers recomputed, half not); 1-row micro-batches after those stay within the compiled variants torch
    keeps (`COMPILE_VARIANTS`). The compile warm-up before each compiled step leaves the step nothing to
    compile (padded micro-batches, unpadded ones, single rows) and changes nothing it computes."""
    import learner.kernels as kernels

    groups, eos = _varied_groups(tiny_model_dir)
    longest = max(len(g.prompt_ids) + len(c) for g in groups for c in g.completion_ids)
    over = {"micro_batch_tokens": 2 * longest - 1,  # the longest samples alone, the others in pairs or more
            "activation_checkpointing": True, "activation_checkpointing_fraction": 0.5}
    ref_m, ref_g = _one_step(tiny_model_dir, groups, eos, **over)
    torch._dynamo.reset()
    # every variant a step meets stays compiled: hitting torch's recompile limit fails the step here
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        m, g = _one_step(tiny_model_dir, groups, eos, warm_up=True, compile=True, **over)
        one_row, _ = _one_step(tiny_model_dir, groups, eos, warm_up=True, compile=True, micro_batch_tokens=1,
                               activation_checkpointing=True)  # 1-row micro-batches, masks dropped
    assert one_row["micro_batches"] > m["micro_batches"] > 2 * 2 and m["padding_frac"] > 0
    assert m["compiled_in_step"] == one_row["compiled_in_step"] == 0  # the warm-up compiled it all
    assert m["compiled_frames"] == one_row["compiled_frames"] == 0  # and the step's own metric says so
    assert {"stats", "grad"} <= set(kernels._compiled)  # the compiled chunk of the default log-prob path ran
    assert m["micro_batches"] == ref_m["micro_batches"] > 2
    # Qwen2's RMSNorm rounds to float32 and back in eager mode; the fused kernel may skip that round trip,
    # so the two differ by float32 rounding (~1e-7 relative), far below what a wrong or dropped row moves
    assert m["loss"] == pytest.approx(ref_m["loss"], rel=1e-5)
    for mine, ref in zip(g, ref_g):
        for k, v in ref.items():
            scale = v.abs().max().item()
            torch.testing.assert_close(mine[k], v, rtol=1e-4, atol=1e-5 * max(scale, 1e-3), msg=lambda s: f"{k}: {s}")


def _steps(tiny_model_dir, plan, **over):
    """Steps of one trainer (`plan`: the groups and `micro_batch_tokens` of each; the compile warm-up first with
    `learner.compile`): each step's metrics and each optimizer step's gradient, as in `_one_step`."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    cfg = LearnerConfig(**{"num_minibatches": 2, "lr": 1e-3, **over})
    tr = Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(plan[0][0])), pad_id=plan[0][2])
    tr.compiling.ensure(tr)
    grads, step = [], tr.backend.step

    def recording_step():
        grads.append({k: p.grad.clone() for k, p in tr.model.named_parameters() if p.grad is not None})
        return step()
    tr.backend.step = recording_step
    out = []
    for groups, budget, _ in plan:
        tr.cfg.micro_batch_tokens = budget
        out.append(tr.step(groups))
    return out, grads


def test_compiled_packed_steps_give_the_eager_ones_and_compile_nothing_after_the_warm_up(tiny_model_dir):
    """`learner.compile` with `learner.packing`: the warm-up's packed rows (several samples or one, a padding tail
    or none, with and without gradients) are every variant the steps meet — steps of other lengths, of passes of
    one sample, of many and of a whole mini-batch, half the layers recomputed, compile nothing — and each compiled
    step gives the eager packed step's loss and gradients."""
    varied, eos = _varied_groups(tiny_model_dir)
    longer, _ = _varied_groups(tiny_model_dir, prompt_repeat=2)
    longest = max(len(g.prompt_ids) + len(c) for g in varied for c in g.completion_ids)
    plan = [(varied, 2 * longest - 1, eos), (longer, 1, eos), (varied, 0, eos)]  # (groups, token budget, pad id)
    over = {"packing": True, "activation_checkpointing": True, "activation_checkpointing_fraction": 0.5}
    ref, ref_g = _steps(tiny_model_dir, plan, **over)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):  # (the log-prob chunks' compiled variants
        got, g = _steps(tiny_model_dir, plan, compile=True, **over)      # of the test above are reused)
    assert [m["compiled_frames"] for m in got] == [0.0, 0.0, 0.0]  # the warm-up compiled it all
    assert ref[1]["micro_batches"] == 32 > ref[0]["micro_batches"] > ref[2]["micro_batches"] == 2
    for m, r in zip(got, ref):
        assert m["micro_batches"] == r["micro_batches"]
        assert m["loss"] == pytest.approx(r["loss"], rel=1e-5)  # RMSNorm's float32 round trip, as above
    assert len(g) == len(ref_g) == 6
    for mine, theirs in zip(g, ref_g):
        for k, v in theirs.items():
            scale = v.abs().max().item()
            torch.testing.assert_close(mine[k], v, rtol=1e-4, atol=1e-5 * max(scale, 1e-3), msg=lambda s: f"{k}: {s}")


def test_compile_refuses_the_shared_prompt_and_zero3_and_a_fraction_needs_checkpointing():
    from config.schema import BrorlConfig

    for bad in ({"compile": True, "share_prompt": True},
                {"compile": True, "backend": "deepspeed", "zero_stage": 3}):
        with pytest.raises(ValueError, match="learner.compile"):
            BrorlConfig(learner=bad)
    from config.loader import load_config

    assert load_config("tiny-cpu", {"learner.compile": True, "learner.packing": True}).learner.packing  # (above)
    with pytest.raises(ValueError, match="learner.packing with learner.share_prompt"):
        BrorlConfig(learner={"packing": True, "share_prompt": True})
    with pytest.raises(ValueError, match="activation_checkpointing_fraction = 0.5 with learner.activation_checkpointing off"):
        BrorlConfig(learner={"activation_checkpointing_fraction": 0.5})


def test_micro_batches_respect_the_budget_and_even_out_across_ranks():
    from learner.microbatch import even_out, micro_batches

    seq_len = [5, 9, 3, 9, 20, 1, 7, 7]
    runs = micro_batches(list(range(8)), seq_len, 18)
    assert sorted(i for r in runs for i in r) == list(range(8))
    assert all(len(r) * max(seq_len[i] for i in r) <= 18 or len(r) == 1 for r in runs)
    assert runs[0] == [4]  # 20 tokens: over the budget, alone
    assert micro_batches([3, 1], seq_len, 0) == [[1, 3]]  # no budget: one run (longest first)
    even = even_out([[0, 1, 2], [3]], 4)
    assert len(even) == 4 and sorted(i for r in even if r for i in r) == [0, 1, 2, 3]
    assert even_out([[0]], 3) == [[0], None, None]  # passes that weigh nothing keep ranks in step


@pytest.fixture
def float64_norms(monkeypatch):
    """transformers' Qwen2RMSNorm computes in float32 even in a float64 model; sharing a prompt sums its
    tokens' gradients before that norm instead of after, which float32 rounds at ~1e-7. In float64
    throughout, the shared and unshared computations agree to ~1e-13."""
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
    monkeypatch.setattr(qwen2.Qwen2RMSNorm, "forward", forward)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_shared_prompt_gives_the_unshared_logprobs_and_gradients(tiny_model_dir, float64_norms, checkpointing):
    """The prompt computed once (its keys and values reused by every completion, completions of different
    lengths, one of none) gives each token's log-prob and every parameter's gradient as the unshared
    computation does, also when the decoder layers are recomputed in backward (activation checkpointing)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    g = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(0, vocab, (9,), generator=g).tolist()
    comps = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (6, 1, 0, 3, 6, 2)]
    out = []
    for share in (False, True):
        model.zero_grad()
        batch = pack([prompt] * len(comps), comps, share_prompt=share)
        assert (batch.prompt is not None) == share
        lp, ent = token_logprobs(model, batch)
        weights = torch.randn(lp.shape, generator=g.manual_seed(1), dtype=lp.dtype)
        (lp * weights).sum().backward()
        out.append((lp.detach(), ent, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}))
    (lp0, ent0, g0), (lp1, ent1, g1) = out
    torch.testing.assert_close(lp1, lp0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent1, ent0, rtol=1e-12, atol=1e-12)
    assert set(g1) == set(g0) and len(g0) > 10
    for k, v in g0.items():
        torch.testing.assert_close(g1[k], v, rtol=1e-10, atol=1e-11, msg=k)
    with pytest.raises(ValueError, match="one prompt"):
        pack([prompt, prompt[1:]], comps[:2], share_prompt=True)


def test_a_step_with_shared_prompts_equals_the_unshared_step(tiny_model_dir, float64_norms):
    """`learner.share_prompt`: micro-batches of one group each, its prompt computed once; the step's loss and
    every mini-batch's gradient are those of the unshared step, and the decoder processes fewer tokens."""
    groups, eos = _varied_groups(tiny_model_dir, prompt_repeat=4)  # a longer shared prompt
    ref_m, ref_g = _one_step(tiny_model_dir, groups, eos)
    for over in ({"share_prompt": True}, {"share_prompt": True, "micro_batch_tokens": 30},
                 {"share_prompt": True, "activation_checkpointing": True}):
        m, grads = _one_step(tiny_model_dir, groups, eos, **over)
        assert m["loss"] == pytest.approx(ref_m["loss"], rel=1e-10, abs=1e-12), over
        assert m["train_tokens"] == ref_m["train_tokens"]
        assert m["micro_batches"] >= len(groups) // 2  # a mini-batch holds ~half the groups: one pass each
        assert m["decoder_tokens"] < ref_m["decoder_tokens"], (m["decoder_tokens"], ref_m["decoder_tokens"])
        for mine, ref in zip(grads, ref_g):
            for k, v in ref.items():
                torch.testing.assert_close(mine[k], v, rtol=1e-9, atol=1e-12, msg=lambda s: f"{over} {k}: {s}")
    from learner.microbatch import micro_batches
    runs = micro_batches(list(range(6)), [10, 12, 11, 14, 10, 13], 15, group=[0, 1, 0, 1, 0, 1],
                         prompt_len=[8] * 6)
    assert all(len({i % 2 for i in r}) == 1 for r in runs)  # one group per run
    assert all(8 + len(r) * (max([10, 12, 11, 14, 10, 13][i] for i in r) - 8) <= 15 or len(r) == 1 for r in runs)


@pytest.mark.slow
def test_a_deepspeed_start_builds_no_op_so_a_stale_build_lock_cannot_hang_it(tmp_path):
    """DeepSpeed's CPU backend JIT-built a shared-memory op at every start under torch's build lock; a rank
    killed while holding it left the lock behind, and every later start on the machine waited forever. The
    learner builds nothing now: a start succeeds beside a stale lock, and leaves no build behind."""
    ext = tmp_path / "torch_extensions"
    stale = ext / "deepspeed_shm_comm" / "lock"  # where torch's JIT build of that op takes its lock
    stale.parent.mkdir(parents=True)
    stale.write_text("")
    code = ("import torch; from config.loader import load_config; from learner.backends import DeepSpeedBackend; "
            "b = DeepSpeedBackend(torch.nn.Linear(4, 4), load_config('tiny-cpu', {'learner.backend': 'deepspeed'}).learner); "
            "print('started', b.world_size)")
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "TORCH_EXTENSIONS_DIR": str(ext)})
    assert r.returncode == 0 and "started 1" in r.stdout, r.stderr[-2000:]
    assert sorted(p.name for p in ext.rglob("*")) == ["deepspeed_shm_comm", "lock"]  # nothing was built


def _lora_trainer(model_dir, groups, eos, dtype=torch.float32, **over):
    from learner.lora import add_adapters

    torch.manual_seed(0)
    cfg = LearnerConfig(**{"num_minibatches": 2, "lr": 1e-2, "lora_rank": 8, "lora_alpha": 16.0, **over})
    model = add_adapters(AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype), cfg)
    return Trainer(model, cfg, JobConfig(n_samples=8, prompts_per_step=len(groups)), pad_id=eos,
                   compute_dtype=dtype)


def test_lora_trains_the_adapters_only_and_serves_the_merged_model(tiny_model_dir, tmp_path):
    """`learner.lora_rank`: the base stays bit-identical across steps and gets no gradient; only the adapters
    have AdamW state; the weights the actors get are the base model's names with W + (alpha / r)·B·A (peft's own
    merge, on a copy, as the reference), and that model computes the trained model's log-probs. A resume from
    the saved adapters and optimizer state continues exactly: the next step equals the uninterrupted one's."""
    import copy

    from peft.tuners.lora import LoraLayer

    from learner.lora import is_adapter, load_adapters, save_adapters

    groups, eos = fixed_groups(tiny_model_dir)
    names = list(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict())
    tr = _lora_trainer(tiny_model_dir, groups, eos)
    model = tr.model
    base = {k: v.clone() for k, v in model.state_dict().items() if not is_adapter(k)}
    adapters = {n for n, p in model.named_parameters() if is_adapter(n)}
    assert adapters and {n for n, p in model.named_parameters() if p.requires_grad} == adapters
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if n in adapters)
    for _ in range(2):
        tr.step(groups)
    assert all(torch.equal(v, base[k]) for k, v in model.state_dict().items() if k in base)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in adapters)
    opt = tr.backend.optimizer
    assert {id(p) for p in opt.state} == {id(p) for n, p in model.named_parameters() if n in adapters}
    # the served weights: the model's own names, merged; equal to peft's merge of a copy
    served = tr.lora.state_dict()
    assert list(served) == names
    ref = copy.deepcopy(model)
    for m in ref.modules():
        if isinstance(m, LoraLayer):
            m.merge()
    ref_sd = {k.replace(".base_layer.", "."): v for k, v in ref.state_dict().items() if not is_adapter(k)}
    unmerged = {k.replace(".base_layer.", "."): v for k, v in base.items()}
    moved = [k for k in names if not torch.equal(served[k], unmerged[k])]
    targeted = [k for k in names if k.endswith(".weight") and k.split(".")[-2] in tr.cfg.lora_targets]
    assert moved == targeted and len(targeted) >= 7  # every targeted projection carries its adapter's update
    for k in names:
        torch.testing.assert_close(served[k], ref_sd[k], rtol=1e-6, atol=1e-7, msg=lambda s: f"{k}: {s}")
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plain.load_state_dict(served)
    b = pack([g.prompt_ids for g in groups], [g.completion_ids[0] for g in groups])
    with torch.no_grad():
        torch.testing.assert_close(token_logprobs(plain, b)[0], token_logprobs(model, b)[0], rtol=1e-5, atol=1e-5)
    # resume: base from the model folder, adapters and optimizer state from the "checkpoint"
    save_adapters(model, tmp_path)
    state = copy.deepcopy(tr.state_dict())
    again = _lora_trainer(tiny_model_dir, groups, eos)
    load_adapters(again.model, tmp_path)
    again.load_state_dict(state)
    tr.step(groups)
    again.step(groups)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.model.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_a_lora_base_in_bf16_keeps_float32_adapters_and_lora_refusals(tiny_model_dir):
    """On a GPU the frozen base is held in the compute dtype: the trainer accepts it (only what AdamW updates
    must be float32) and serves bf16; what LoRA does not support is refused when the config loads."""
    from config.schema import BrorlConfig

    groups, eos = fixed_groups(tiny_model_dir, groups=1)
    tr = _lora_trainer(tiny_model_dir, groups, eos, dtype=torch.bfloat16)
    assert {p.dtype for p in tr.model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in tr.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {t.dtype for _, t in tr.lora.named_shapes()} == {torch.bfloat16}
    for bad, why in (({"backend": "deepspeed"}, "deepspeed"), ({"kl_coef": 0.1}, "kl_coef"),
                     ({"lora_targets": ["q_proj", "lm_head"]}, "lm_head"), ({"lora_targets": []}, "empty")):
        with pytest.raises(ValueError, match=f"learner.lora_rank.*{why}|lora_targets.*{why}"):
            BrorlConfig(learner={"lora_rank": 8, **bad})
    with pytest.raises(ValueError, match="lora_targets.*nothing_here"):
        _lora_trainer(tiny_model_dir, groups, eos, lora_targets=["nothing_here"])
    # a target of another family's naming (Phi-3's fused qkv_proj) beside one that matches: refused, not half applied
    with pytest.raises(ValueError, match=r"lora_targets \['qkv_proj'\] match no layer.*'q_proj'"):
        _lora_trainer(tiny_model_dir, groups, eos, lora_targets=["q_proj", "qkv_proj"])
