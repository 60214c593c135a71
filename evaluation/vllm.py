"""Held-out sampling with a vLLM engine (`brorl eval`): the caller builds the engine exactly as an
actor's (`actors.engine.engine_kwargs`), this module only samples and scores."""

from __future__ import annotations

from evaluation import EvalSettings, summarize
from verifiers.base import Task


def sample(llm, prompts: list[str], s: EvalSettings) -> list[list[str]]:
    """k completions per prompt from an offline `vllm.LLM`."""
    from vllm import SamplingParams

    sp = SamplingParams(n=s.k, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
                        stop=list(s.stop) or None)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    return [[c.text for c in o.outputs] for o in outs]


def evaluate(llm, tasks: list[Task], s: EvalSettings) -> dict:
    return summarize(tasks, sample(llm, [t.prompt for t in tasks], s), s)
