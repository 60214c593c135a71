"""`brorl eval`: pass@1 (averaged over k samples per prompt) and pass@k on held-out prompts.

Paper protocol: k = 16 samples per prompt, temperature 0.6, top_p 0.95. Prompts are the first
`run.eval_prompts` tasks of the eval split (disjoint from training by construction), scored through the
verifier registry — the same verifier code that scores training rollouts.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from config.schema import BrorlConfig


def evaluate(cfg: BrorlConfig, model_path: str, k: int | None = None, temperature: float = 0.6,
             top_p: float = 0.95, llm=None) -> dict:
    from actors.engine import engine_kwargs, offline_env, sampling_params
    from verifiers.datasets import task_source
    from verifiers.registry import Registry

    offline_env()
    k = k or cfg.run.eval_samples
    src = task_source(cfg.verifiers.task, cfg.run.seed, "eval", cfg.verifiers.difficulty)
    tasks = [next(src) for _ in range(cfg.run.eval_prompts)]
    if llm is None:
        from vllm import LLM

        model = cfg.model.model_copy(update={"path": str(model_path)})
        llm = LLM(**{**engine_kwargs(model, cfg.actor, seed=cfg.run.seed), "tokenizer": cfg.model.path})
    sp = sampling_params(cfg.actor, n=k, temperature=temperature, top_p=top_p, logprobs=None)
    outs = llm.generate([t.prompt for t in tasks], sp, use_tqdm=False)
    reg = Registry()
    per_prompt = []
    for t, o in zip(tasks, outs):
        correct = [reg.score(t.verifier, c.text, t.reference)[0].correct for c in o.outputs]
        per_prompt.append({"task_id": t.task_id, "correct": sum(correct), "k": len(correct)})
    n = len(per_prompt)
    return {
        "model": str(model_path), "prompts": n, "k": k, "temperature": temperature, "top_p": top_p,
        "pass_at_1": sum(p["correct"] / p["k"] for p in per_prompt) / n,
        f"pass_at_{k}": sum(p["correct"] > 0 for p in per_prompt) / n,
        "per_prompt": per_prompt,
    }


def main(cfg: BrorlConfig, checkpoint: str | None, out: str | None, k: int | None) -> int:
    res = evaluate(cfg, checkpoint or cfg.model.path, k=k)
    kk = res["k"]
    table = (f"| model | prompts | k | pass@1 | pass@{kk} |\n|---|---|---|---|---|\n"
             f"| {res['model']} | {res['prompts']} | {kk} | {100 * res['pass_at_1']:.1f}% | "
             f"{100 * res[f'pass_at_{kk}']:.1f}% |")
    print(table)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=2) + "\n")
        Path(out).with_suffix(".md").write_text(table + "\n")
    return 0
