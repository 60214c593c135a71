"""Held-out evaluation: one definition of the tasks, the sampling settings and the pass@k arithmetic.

Used by the learner's in-run estimate (`run.eval_interval`, transformers, `hf.py`), by the warm start of
the tiny model (transformers) and by `brorl eval` (vLLM, `vllm.py`), so every pass@1 in a run folder or
the README means the same thing. Completions are scored through `verifiers.registry` — the scoring path
that serves training rollouts.

Lives here: `EvalSettings` (k, temperature, top-p, max tokens, stop, how a completion's answer is read),
`heldout_tasks` (`data.eval`'s files, or the eval split: disjoint from training by construction),
`pass_at_k` (the unbiased estimator) and `score` / `summarize` (overall and per data source). Prompts are
rendered by `taskdata.render` exactly as the actors' are.
Must not import: `learner`, `actors`, `transport` or `cli`; torch, transformers and vLLM only inside the
sampler modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from config.schema import BrorlConfig
from verifiers.base import Task

# The paper's evaluation protocol: k = 16 samples per prompt at temperature 0.6, top-p 0.95.
PAPER_TEMPERATURE = 0.6
PAPER_TOP_P = 0.95


@dataclass(frozen=True)
class EvalSettings:
    k: int = 16
    """Samples per prompt; pass@1 is their mean correctness, pass@k whether any is correct."""
    temperature: float = PAPER_TEMPERATURE
    top_p: float = PAPER_TOP_P
    max_tokens: int = 64
    """New tokens per sample (the actors' `actor.max_tokens`)."""
    stop: tuple[str, ...] = ()
    """Stop strings (the actors' `actor.stop`)."""
    reasoning_end: str = ""
    """`data.reasoning_end`: only the text after it is scored."""
    unclosed_reasoning: str = "wrong"
    """`data.unclosed_reasoning`."""


def settings(cfg: BrorlConfig, k: int | None = None) -> EvalSettings:
    """The job's evaluation settings: k = `run.eval_samples` unless given; length, stops and the reading of
    an answer as the actors'."""
    return EvalSettings(k=k or cfg.run.eval_samples, max_tokens=cfg.actor.max_tokens, stop=tuple(cfg.actor.stop),
                        reasoning_end=cfg.data.reasoning_end, unclosed_reasoning=cfg.data.unclosed_reasoning)


def heldout_tasks(cfg: BrorlConfig, n: int | None = None, seed: int | None = None) -> list[Task]:
    """`data.eval`'s tasks; else the first `n` (default `run.eval_prompts`) held-out tasks (`taskdata`)."""
    from taskdata import heldout_tasks as held

    return held(cfg, n, seed)


def render(renderer, tasks: list[Task]) -> list[list[int]]:
    """Every task's prompt token ids, rendered as the actors' are (`taskdata.render`)."""
    return [renderer.render(t).ids for t in tasks]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 − C(n−c, k) / C(n, k) (k ≤ n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def score(tasks: list[Task], completions: list[list[str]], s: EvalSettings = EvalSettings()) -> list[int]:
    """Correct completions per task, scored by each task's verifier through the registry, on the answer part
    of each completion (`taskdata.answer_region`, as the actors score)."""
    from taskdata import answer_region
    from verifiers.registry import Registry

    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but completions for {len(completions)}")
    reg = Registry()

    def ok(t: Task, c: str) -> bool:
        a = answer_region(c, s.reasoning_end, s.unclosed_reasoning)
        return a is not None and reg.score(t.verifier, a, t.reference)[0].correct

    return [sum(ok(t, c) for c in comps) for t, comps in zip(tasks, completions)]


def _rates(per_prompt: list[dict], k: int) -> dict:
    n = len(per_prompt)
    return {"prompts": n, "pass_at_1": sum(pass_at_k(p["k"], p["correct"], 1) for p in per_prompt) / n,
            f"pass_at_{k}": sum(pass_at_k(p["k"], p["correct"], min(k, p["k"])) for p in per_prompt) / n}


def summarize(tasks: list[Task], completions: list[list[str]], s: EvalSettings) -> dict:
    """pass@1 (mean over the k samples, then over prompts) and pass@k, overall and per data source (the
    paper's tables: one benchmark a row), with the per-prompt counts."""
    correct = score(tasks, completions, s)
    per_prompt = [{"task_id": t.task_id, "source": t.source or t.verifier, "correct": c, "k": len(comps)}
                  for t, c, comps in zip(tasks, correct, completions)]
    sources = sorted({p["source"] for p in per_prompt})
    return {"k": s.k, "temperature": s.temperature, "top_p": s.top_p, **_rates(per_prompt, s.k),
            "by_source": {src: _rates([p for p in per_prompt if p["source"] == src], s.k) for src in sources},
            "per_prompt": per_prompt}
