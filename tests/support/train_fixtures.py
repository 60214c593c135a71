"""A fixed batch of groups on the synthetic task, for training tests (importable by subprocesses)."""

from __future__ import annotations

import random

import torch


def fixed_groups(model_dir: str, n: int = 8, groups: int = 4, seed: int = 0, model=None):
    """Groups whose completions are the right answer (correct) or a wrong one, behaviour log-probs
    taken from the model itself (on-policy), half correct per group."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner.logprobs import pack, token_logprobs
    from learner.planning import TrainGroup

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = model or AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompt = tok(f"{a}+{b}=")["input_ids"]
        right = tok(str(a + b))["input_ids"] + [tok.eos_token_id]
        wrong = tok(str(a + b + rng.randint(1, 5)))["input_ids"] + [tok.eos_token_id]
        comps = [right if i % 2 == 0 else wrong for i in range(n)]
        with torch.no_grad():
            lp, _ = token_logprobs(model, pack([prompt] * n, comps))
        behav = [lp[i, : len(c)].tolist() for i, c in enumerate(comps)]
        correct = [i % 2 == 0 for i in range(n)]
        out.append(TrainGroup(prompt, comps, behav, [float(c) for c in correct], correct, version=0))
    return out, tok.eos_token_id
