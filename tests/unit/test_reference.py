"""The fast training step (planning, packing, micro-batches, chunked log-probs) against the eager reference
(`learner/reference.py`) on the tiny model: the same gradient for every mini-batch of a step."""

import copy

import torch


def test_the_fast_step_matches_the_eager_reference(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from config.schema import JobConfig, LearnerConfig
    from learner.backends import make_backend
    from learner.planning import TrainGroup
    from learner.reference import reference_step
    from learner.train_step import Trainer
    from tests.support.train_fixtures import fixed_groups

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base, eos = fixed_groups(tiny_model_dir, n=4, groups=2, model=model)
    gen = torch.Generator().manual_seed(1)
    groups = []
    for k, g in enumerate(base):  # off-policy behaviour log-probs: the TIS weights differ from 1, some capped
        behav = [[x + 0.7 * float(torch.randn((), generator=gen)) for x in row] for row in g.behav_logp]
        rewards = [0.2, 0.8, 0.2, 0.5] if k == 0 else g.rewards  # partial credit, all incorrect
        groups.append(TrainGroup(g.prompt_ids, g.completion_ids, behav, rewards, g.correct,
                                 truncated=[k == 0, False, False, False]))  # one cut at max_tokens: masked
    g = groups[1]  # and one empty completion: in its group's baseline, nothing to train
    groups[1] = TrainGroup(g.prompt_ids, [[]] + g.completion_ids[1:], [[]] + g.behav_logp[1:], g.rewards, g.correct)
    cfg = LearnerConfig(num_minibatches=2, lr=1e-2, micro_batch_tokens=12, dual_clip_c=3.0,
                        advantage_whitening="tokens", overlong_filter=True)
    job = JobConfig(n_samples=4, prompts_per_step=2)

    ref_model = copy.deepcopy(model)
    start = [p.detach().clone() for p in model.parameters()]
    tr = Trainer(model, cfg, job, pad_id=eos)
    fast_grads, step = [], tr.backend.step

    def recording_step():
        fast_grads.append({n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None})
        return step()

    tr.backend.step = recording_step
    m = tr.step(groups)
    assert m["samples"] == 6 and m["micro_batches"] > 2  # 8 − the masked − the empty, over several passes

    backend = make_backend(ref_model, cfg)
    backend.set_lr(tr.lr)
    ref = reference_step(ref_model, backend.optimizer, groups, cfg)
    assert len(ref) == len(fast_grads) == 2
    # float32 sums in another order differ by ~1e-7 relative; AdamW's first update, g / (|g| + eps), turns that
    # into up to lr on a near-zero gradient's element, so the second mini-batch's gradient agrees less closely
    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp(min=1e-12))

    for k, (want, got) in enumerate(zip(ref, fast_grads)):
        assert want["grads"].keys() == got.keys()
        for name in want["grads"]:
            assert rel(got[name], want["grads"][name]) < (1e-5 if k == 0 else 1e-3), (k, name)
    # the second mini-batch's gradient is taken at the weights the first update left: the optimizer step too
    assert any(not torch.equal(p, q) for p, q in zip(tr.model.parameters(), start))  # the step did train
