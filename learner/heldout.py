"""The learner's own held-out estimate (`run.eval_interval`): pass@1 of the current policy with
transformers (`evaluation.hf`), before the first step, every that many steps and at the last, into
`heldout.jsonl` and the step's metrics (`heldout_pass_at_1`, `heldout_pass_at_<k>` with k = `run.eval_samples`,
and `heldout_pass_at_1/<source>` per data source). Prompts are rendered as the actors' are (one too long for
`actor.max_model_len` is left out: `heldout_left_out`); completions are sampled as `brorl eval`'s vLLM engine
samples them (`evaluation.hf.sample`) and scored as it scores them, in
verifier worker processes (`evaluation`); a verifier that cannot score gives no estimate for that step (an
error on the console, an `error` row in `heldout.jsonl`) rather than reading as wrong answers, and training
goes on. `wall_s` counts training time only: from the first group's arrival,
less the time spent here."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

from config.schema import BrorlConfig
from learner.metrics import open_append

log = logging.getLogger("brorl.learner")


class HeldoutEstimate:
    def __init__(self, cfg: BrorlConfig, renderer):
        self.cfg, self.renderer = cfg, renderer
        self.tasks = None  # loaded at the first estimate
        self.t_first: float | None = None  # first group's arrival: the origin of wall_s
        self.eval_s = 0.0

    def due(self, version: int) -> bool:
        every = self.cfg.run.eval_interval
        return bool(every) and (version % every == 0 or version == self.cfg.learner.steps)

    async def run(self, model, tokenizer, version: int, generated: float) -> dict[str, float]:
        """Estimate at `version`; returns the metrics for the step's report."""
        import torch

        from evaluation import EvaluationError, heldout_tasks, settings
        from evaluation.hf import evaluate

        if self.tasks is None:
            self.tasks = heldout_tasks(self.cfg)

        def run() -> dict:
            with torch.random.fork_rng():  # sampling here must not shift the training RNG stream
                torch.manual_seed(self.cfg.run.seed + version)
                return evaluate(model, tokenizer, self.tasks, settings(self.cfg), self.renderer)

        t0 = time.monotonic()
        try:
            res = await asyncio.to_thread(run)
        except Exception as e:  # a verifier that cannot score (no estimate is better than a false one), or the
            # estimate itself failed (out of memory beside the engine): the step goes on to its checkpoint, else a
            # resumed learner would retrain up to the same estimate and fail there again, restart after restart
            from transport import events

            why = str(e) if isinstance(e, EvaluationError) else f"{type(e).__name__}: {e}"
            log.error("held-out estimate at step %d cannot be made: %s", version, why,
                      exc_info=not isinstance(e, EvaluationError))
            events.emit("error", f"held-out estimate at step {version} cannot be made (training goes on "
                                 f"without it): {why}", fix="see the learner's log; `brorl eval` on a checkpoint "
                                                            "scores the same prompts")
            with open_append(Path(self.cfg.run.run_dir) / "heldout.jsonl") as f:
                f.write(json.dumps({"step": version, "version": version, "error": why}) + "\n")
            return {}
        p, wall = res["pass_at_1"], 0.0 if self.t_first is None else t0 - self.t_first - self.eval_s
        k = res["k"]
        row = {"step": version, "version": version, "generated": generated, "wall_s": wall,
               "eval_s": time.monotonic() - t0, "pass_at_1": p, "k": k, "pass_at_k": res[f"pass_at_{k}"],
               "correct": [q["correct"] for q in res["per_prompt"]],
               "by_source": {s: r["pass_at_1"] for s, r in res["by_source"].items()},
               "left_out": res["left_out"], "verifier_timeouts": res["timeouts"]}
        if self.t_first is not None:
            self.eval_s += row["eval_s"]
        with open_append(Path(self.cfg.run.run_dir) / "heldout.jsonl") as f:
            f.write(json.dumps(row) + "\n")
        log.info("held-out pass@1 at step %d: %.3f", version, p)
        per_source = row["by_source"] if len(row["by_source"]) > 1 else {}
        return {"heldout_pass_at_1": p, f"heldout_pass_at_{k}": row["pass_at_k"], "heldout_left_out": res["left_out"],
                "heldout_verifier_timeouts": res["timeouts"],
                **{f"heldout_pass_at_1/{s}": v for s, v in per_source.items()}}
