"""Held-out sampling with a vLLM engine (`brorl eval`): the caller builds the engine exactly as an
actor's (`actors.engine.engine_kwargs`), this module only samples and scores."""

from __future__ import annotations

from evaluation import EvalSettings, render, summarize
from verifiers.base import Task


def sample(llm, prompts: list[list[int]], s: EvalSettings) -> list[list[str]]:
    """k completions per prompt (token ids) from an offline `vllm.LLM`."""
    from vllm import SamplingParams

    sp = SamplingParams(n=s.k, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                        stop=list(s.stop) or None)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [[c.text for c in o.outputs] for o in outs]


def evaluate(llm, tasks: list[Task], s: EvalSettings, renderer) -> dict:
    p = render(renderer, tasks)
    return summarize(p.tasks, sample(llm, p.ids, s), s, p.left_out)
