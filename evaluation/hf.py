"""Held-out sampling with transformers, in the training process: the learner's in-run estimate and the
warm start use it, so neither needs an inference engine."""

from __future__ import annotations

from evaluation import EvalSettings, render, summarize
from verifiers.base import Task


def sample(model, tokenizer, prompts: list[list[int]], s: EvalSettings) -> list[list[str]]:
    """k completions per prompt (token ids; a left-padded batch, `generate` with the settings' sampling)."""
    import torch

    was_training = model.training
    model.eval()
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=s.temperature,
                                 top_p=s.top_p, num_return_sequences=s.k, max_new_tokens=s.max_tokens,
                                 pad_token_id=tokenizer.eos_token_id)
    finally:
        model.train(was_training)
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return [texts[i * s.k:(i + 1) * s.k] for i in range(len(prompts))]


def evaluate(model, tokenizer, tasks: list[Task], s: EvalSettings, renderer) -> dict:
    p = render(renderer, tasks)
    return summarize(p.tasks, sample(model, tokenizer, p.ids, s), s, p.left_out)
