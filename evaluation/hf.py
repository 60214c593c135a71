"""Held-out sampling with transformers, in the training process: the learner's in-run estimate and the
warm start use it, so neither needs an inference engine."""

from __future__ import annotations

from evaluation import EvalSettings, summarize
from verifiers.base import Task


def sample(model, tokenizer, prompts: list[str], s: EvalSettings) -> list[list[str]]:
    """k completions per prompt (left-padded batch, `generate` with the settings' sampling)."""
    import torch

    was_training = model.training
    model.eval()
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    try:
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=s.temperature, top_p=s.top_p,
                                 num_return_sequences=s.k, max_new_tokens=s.max_tokens,
                                 pad_token_id=tokenizer.eos_token_id)
    finally:
        model.train(was_training)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return [texts[i * s.k:(i + 1) * s.k] for i in range(len(prompts))]


def evaluate(model, tokenizer, tasks: list[Task], s: EvalSettings) -> dict:
    return summarize(tasks, sample(model, tokenizer, [t.prompt for t in tasks], s), s)
