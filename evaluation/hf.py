"""Held-out sampling with transformers, in the training process: the learner's in-run estimate and the
warm start use it, so neither needs an inference engine. It samples as `brorl eval`'s vLLM engine samples
(`evaluation.vllm`), so that the two estimate one pass@1."""

from __future__ import annotations

from evaluation import EvalSettings, render, summarize
from verifiers.base import Task


def sample(model, tokenizer, prompts: list[list[int]], s: EvalSettings) -> list[list[str]]:
    """k completions per prompt (token ids; a left-padded batch), drawn as the engine draws them: from the
    settings' temperature and top-p alone (none of the sampling defaults a model ships in generation_config.json,
    such as top_k or repetition_penalty, nor transformers' own top_k = 50), ending at the tokenizer's or the
    model's end-of-sequence tokens, within `max_model_len` tokens of prompt and completion, and cut before the
    first stop string."""
    import torch
    from transformers import GenerationConfig

    was_training = model.training
    model.eval()
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shipped = model.generation_config
    eos = shipped.eos_token_id
    ends = {*(eos if isinstance(eos, list) else [eos]), tokenizer.eos_token_id} - {None}
    room = [min(s.max_tokens, s.max_model_len - len(p)) if s.max_model_len else s.max_tokens for p in prompts]
    how = GenerationConfig(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0,
                           num_return_sequences=s.k, max_new_tokens=max(1, *room), eos_token_id=sorted(ends),
                           pad_token_id=tokenizer.eos_token_id)
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    model.generation_config = GenerationConfig()  # what generate fills unset settings from: neutral values only
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=how)
    finally:
        model.generation_config = shipped
        model.train(was_training)
    texts = []
    for row, toks in enumerate(out[:, width:].tolist()):
        toks = toks[:room[row // s.k]]
        toks = toks[:next((i for i, t in enumerate(toks) if t in ends), len(toks))]
        text = tokenizer.decode(toks, skip_special_tokens=True)
        texts.append(text[:min((i for i in map(text.find, s.stop) if i >= 0), default=len(text))])
    return [texts[i * s.k:(i + 1) * s.k] for i in range(len(prompts))]


def evaluate(model, tokenizer, tasks: list[Task], s: EvalSettings, renderer) -> dict:
    p = render(renderer, tasks)
    return summarize(p.tasks, sample(model, tokenizer, p.ids, s), s, p.left_out)
