"""Warm start (`brorl sft`, and the last part of `brorl make-tiny-model`): supervise the tiny model on
the task until held-out pass@1 lies in a band (default 15–60 %), so that RL has room to work — a random
model never answers correctly, and dynamic sampling would drop every group.

Training examples are `prompt + reference + <eos>` from the train split; the loss is cross-entropy on the
answer tokens. Every `eval_every` updates it estimates pass@1 on held-out prompts (k samples each at
temperature 0.6, the evaluation protocol of `evaluation`) with transformers, and stops at the first estimate inside the
band (at least `min_pass`, at most `max_pass`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from config.schema import BrorlConfig
from evaluation import EvalSettings, heldout_tasks
from evaluation.hf import evaluate


@dataclass
class SftResult:
    updates: int
    pass_at_1: float
    history: list[tuple[int, float]]


def warm_start(cfg: BrorlConfig, model_dir: str | Path, out_dir: str | Path | None = None, **kw) -> SftResult:
    """`_warm_start` on at most 8 CPU threads: the tiny model's matrices are too small to gain from more,
    only to pay their synchronisation (torch's default of a thread per core makes it slow on a many-core
    host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 8))
    try:
        return _warm_start(cfg, model_dir, out_dir, **kw)
    finally:
        torch.set_num_threads(threads)


def _warm_start(cfg: BrorlConfig, model_dir: str | Path, out_dir: str | Path | None = None, *, min_pass: float = 0.15,
                max_pass: float = 0.6, batch: int = 64, lr: float = 1e-3, max_updates: int = 3000,
                eval_every: int = 25, eval_prompts: int = 64, seed: int = 0, verbose: bool = True) -> SftResult:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from taskdata import PromptRenderer, task_source

    torch.manual_seed(seed)
    rng = random.Random(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    train = task_source(cfg.verifiers.task, seed + 1000, "train", cfg.verifiers.difficulty)
    eval_tasks = heldout_tasks(cfg, eval_prompts, seed=seed + 2000)
    renderer = PromptRenderer(tok, cfg.data)  # the tiny model has no chat template: plain text, as the actors see it
    # a quick estimate: 4 samples per prompt, the paper's T and top-p, scored in this thread (synthetic: quick)
    quick = EvalSettings(k=4, max_tokens=8, verifier_workers=0)
    history: list[tuple[int, float]] = []
    p = 0.0
    for upd in range(1, max_updates + 1):
        tasks = [next(train) for _ in range(batch)]
        seqs, labels = [], []
        for t in tasks:
            prompt = renderer.render(t).ids
            answer = tok(t.reference)["input_ids"] + [tok.eos_token_id]
            seqs.append(prompt + answer)
            labels.append([-100] * len(prompt) + answer)
        L = max(len(s) for s in seqs)
        ids = torch.tensor([s + [tok.eos_token_id] * (L - len(s)) for s in seqs])
        lab = torch.tensor([lb + [-100] * (L - len(lb)) for lb in labels])
        att = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if upd % eval_every == 0:
            p = evaluate(model, tok, eval_tasks, quick, renderer)["pass_at_1"]
            history.append((upd, p))
            if verbose:
                print(f"  sft update {upd}: loss {loss.item():.3f}, held-out pass@1 ≈ {100 * p:.1f}%", flush=True)
            if min_pass <= p <= max_pass:
                break
            if p > max_pass:  # overshot: a smaller step size next time would land inside; stop here anyway
                break
        rng.random()
    out = Path(out_dir or model_dir)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return SftResult(upd, p, history)
