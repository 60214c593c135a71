"""What `brorl run` does until the asynchronous learner service exists: one synchronous round of the
BroRL loop with the parts that are built — vLLM generates N completions per prompt with behaviour
log-probs, the synthetic verifier scores them, dynamic sampling filters, and the learner takes one
training step — then it says plainly which parts of the full job are not built yet.
"""

from __future__ import annotations

import time

from config.schema import BrorlConfig

NOT_YET = [
    "actor processes streaming groups over ZeroMQ (transport)",
    "weight broadcast from learner to actors",
    "the asyncio learner service, checkpoints and resume",
    "`brorl eval` and the plots of a full run",
]


def run_demo(cfg: BrorlConfig) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from actors.engine import engine_kwargs, offline_env, sampling_params
    from learner.train_step import Group, Trainer
    from verifiers import synthetic

    offline_env()
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(**engine_kwargs(cfg.model, cfg.actor, seed=cfg.run.seed))
    tok = llm.get_tokenizer()
    tasks = synthetic.generate(cfg.run.seed, cfg.verifiers.difficulty, "train")
    batch = [next(tasks) for _ in range(cfg.learner.prompts_per_step)]
    t1 = time.perf_counter()
    outs = llm.generate([t.prompt for t in batch], sampling_params(cfg.actor))
    gen_s = time.perf_counter() - t1
    groups = []
    for task, out in zip(batch, outs):
        comps, behav, rewards, correct = [], [], [], []
        for c in out.outputs:
            res = synthetic.score(c.text, task.reference)
            comps.append(list(c.token_ids))
            behav.append([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)])
            rewards.append(res.reward)
            correct.append(res.correct)
        groups.append(Group(list(out.prompt_token_ids), comps, behav, rewards, correct, version=0))
    n_samples = sum(len(g.rewards) for g in groups)
    print(f"generated {n_samples} samples ({len(groups)} prompts × N={cfg.actor.n_samples}) in {gen_s:.1f} s; "
          f"accuracy {sum(sum(g.correct) for g in groups) / n_samples:.3f}")
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=getattr(torch, cfg.model.dtype))
    trainer = Trainer(model, cfg.learner, n_samples=cfg.actor.n_samples, temperature=cfg.actor.temperature,
                      pad_id=tok.eos_token_id)
    try:
        m = trainer.step(groups)
        keys = ["pass_rate", "loss", "tis_mean", "mismatch_kl", "clip_frac_high", "clip_frac_low", "entropy",
                "grad_norm", "lr", "train_s"]
        print("training step: " + ", ".join(f"{k}={m[k]:.4g}" for k in keys if k in m))
    except ValueError as e:  # e.g. every group all-wrong: dynamic sampling keeps nothing
        print(f"no training step: {e}")
    print(f"done in {time.perf_counter() - t0:.1f} s.\nnot built yet: " + "; ".join(NOT_YET) + ".")
    return 0
