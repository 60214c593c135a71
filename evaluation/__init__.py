"""Held-out evaluation: one definition of the tasks, the sampling settings and the pass@k arithmetic.

Used by the learner's in-run estimate (`run.eval_interval`, transformers, `hf.py`), by the warm start of
the tiny model (transformers) and by `brorl eval` (vLLM, `vllm.py`), so every pass@1 in a run folder or
the README means the same thing. Completions are scored by each task's registered verifier in worker
processes (`verifiers.batch`: a verifier's main thread, as the actors' scoring workers), whichever thread
asks. A verifier that cannot score (it raises) stops the evaluation with `EvaluationError`: an error is
never counted as a wrong answer. A prompt that cannot be rendered for the model (too long for
`actor.max_model_len`, chat messages without a chat template) is left out, counted and named in the result.

Lives here: `EvalSettings` (k, temperature, top-p, max tokens, stop, context length, how a completion's answer is
read),
`heldout_tasks` (`data.eval`'s files, or the eval split: disjoint from training by construction),
`pass_at_k` (the unbiased estimator) and `score` / `summarize` (overall and per data source). Prompts are
rendered by `taskdata.render` exactly as the actors' are.
Must not import: `learner`, `actors`, `transport` or `cli`; torch, transformers and vLLM only inside the
sampler modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    max_model_len: int = 0
    """Tokens of prompt and completion together (`actor.max_model_len`): the engine ends a completion there; 0: no
    limit but `max_tokens`."""
    reasoning_end: str = ""
    """`data.reasoning_end`: only the text after it is scored."""
    unclosed_reasoning: str = "wrong"
    """`data.unclosed_reasoning`."""
    verifier_workers: int = 1
    """Scoring processes (`verifiers.workers`); 0: in the calling thread, without a time limit."""
    verifier_timeout_s: float = 5.0
    """Time per completion and scoring process (`verifiers.timeout_s`); past it a completion is wrong ("timeout")."""


class EvaluationError(RuntimeError):
    """The evaluation cannot give a number: a verifier could not score, or no prompt could be used."""


@dataclass
class Prompts:
    """The tasks that render for the model, their token ids, and those left out (task_id, source, reason)."""

    tasks: list[Task]
    ids: list[list[int]]
    left_out: list[dict] = field(default_factory=list)


def settings(cfg: BrorlConfig, k: int | None = None) -> EvalSettings:
    """The job's evaluation settings: k = `run.eval_samples` unless given; length, stops and the reading of
    an answer as the actors'."""
    return EvalSettings(k=k or cfg.run.eval_samples, max_tokens=cfg.actor.max_tokens, stop=tuple(cfg.actor.stop),
                        max_model_len=cfg.actor.max_model_len,
                        reasoning_end=cfg.data.reasoning_end, unclosed_reasoning=cfg.data.unclosed_reasoning,
                        verifier_workers=cfg.verifiers.workers, verifier_timeout_s=cfg.verifiers.timeout_s)


def heldout_tasks(cfg: BrorlConfig, n: int | None = None, seed: int | None = None) -> list[Task]:
    """`data.eval`'s tasks; else the first `n` (default `run.eval_prompts`) held-out tasks (`taskdata`)."""
    from taskdata import heldout_tasks as held

    return held(cfg, n, seed)


def render(renderer, tasks: list[Task]) -> Prompts:
    """Every task's prompt token ids, rendered as the actors' are (`taskdata.render`); a task that cannot be
    rendered (`RenderError`: too long, chat messages without a template) is left out with its reason.
    EvaluationError when none is left."""
    from taskdata import RenderError

    out = Prompts([], [])
    for t in tasks:
        try:
            ids = renderer.render(t).ids
        except RenderError as e:
            out.left_out.append({"task_id": t.task_id, "source": t.source or t.verifier, "reason": str(e)})
            continue
        out.tasks.append(t)
        out.ids.append(ids)
    if tasks and not out.tasks:
        raise EvaluationError(f"all {len(tasks)} held-out prompts are left out, e.g. {out.left_out[0]['reason']}")
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 − C(n−c, k) / C(n, k) (k ≤ n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def results(tasks: list[Task], completions: list[list[str]], s: EvalSettings = EvalSettings()) -> list[list]:
    """Each completion's `VerifierResult`, scored by its task's registered verifier in worker processes
    (`verifiers.batch`) on its answer part (`taskdata.answer_region`, as the actors score); a completion whose
    reasoning never closes is wrong unscored, as the actors score it. EvaluationError if the verifier raised
    on any (it cannot run, or a reference is bad)."""
    from taskdata import answer_region
    from verifiers.base import VerifierResult
    from verifiers.batch import is_error, score_all
    from verifiers.registry import Registry

    if len(tasks) != len(completions):
        raise ValueError(f"{len(tasks)} tasks but completions for {len(completions)}")
    reg = Registry()
    answers = [[answer_region(c, s.reasoning_end, s.unclosed_reasoning) for c in comps] for comps in completions]
    paths = {}
    for t in tasks:
        if (paths.setdefault(t.verifier, reg.path(t.verifier))) is None:
            raise EvaluationError(f"task {t.task_id} names verifier {t.verifier!r}, which is not registered")
    scored = iter(score_all([(paths[t.verifier], [a for a in ans if a is not None], t.reference)
                             for t, ans in zip(tasks, answers)], s.verifier_workers, s.verifier_timeout_s))
    out = []
    for t, ans in zip(tasks, answers):
        got = iter(next(scored))
        row = [VerifierResult(0.0, False, "reasoning not closed") if a is None else next(got) for a in ans]
        bad = [r for r in row if is_error(r)]
        if bad:
            raise EvaluationError(f"verifier {t.verifier!r} ({paths[t.verifier]}) could not score {len(bad)} of "
                                  f"the completions of task {t.task_id}: {bad[0].reason} (an evaluation does not "
                                  f"count that as a wrong answer: fix the verifier or the reference)")
        out.append(row)
    return out


def score(tasks: list[Task], completions: list[list[str]], s: EvalSettings = EvalSettings()) -> list[int]:
    """Correct completions per task (`results`)."""
    return [sum(r.correct for r in rs) for rs in results(tasks, completions, s)]


def _rates(per_prompt: list[dict], k: int) -> dict:
    n = len(per_prompt)
    return {"prompts": n, "pass_at_1": sum(pass_at_k(p["k"], p["correct"], 1) for p in per_prompt) / n,
            f"pass_at_{k}": sum(pass_at_k(p["k"], p["correct"], min(k, p["k"])) for p in per_prompt) / n}


def summarize(tasks: list[Task], completions: list[list[str]], s: EvalSettings,
              left_out: list[dict] | None = None) -> dict:
    """pass@1 (mean over the k samples, then over prompts) and pass@k, overall and per data source (the
    paper's tables: one benchmark a row), with the per-prompt counts, the completions a verifier timed out
    on (scored wrong) and the prompts left out (`render`)."""
    res = results(tasks, completions, s)
    per_prompt = [{"task_id": t.task_id, "source": t.source or t.verifier, "correct": sum(r.correct for r in rs),
                   "k": len(comps), "timeouts": sum(r.reason == "timeout" for r in rs)}
                  for t, rs, comps in zip(tasks, res, completions)]
    left_out = left_out or []
    sources = sorted({p["source"] for p in per_prompt})

    def rates(rows, src=None):
        return {**_rates(rows, s.k), "timeouts": sum(p["timeouts"] for p in rows),
                "left_out": sum(src is None or x["source"] == src for x in left_out)}

    return {"k": s.k, "temperature": s.temperature, "top_p": s.top_p, **rates(per_prompt),
            "by_source": {src: rates([p for p in per_prompt if p["source"] == src], src) for src in sources},
            "per_prompt": per_prompt, "left_out_prompts": left_out}
