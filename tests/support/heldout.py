"""The learner's held-out estimate (`heldout.jsonl`: transformers, in the learner) against `brorl eval` (a vLLM
engine) on the same checkpoint, prompts and samples per prompt: the two must agree within sampling error."""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

SIGMAS = 4.0
"""How many standard errors of their difference the two pass@1 may differ by."""
Z_FALSE_ALARM = 3.719
"""The standard normal's 1-in-10,000 upper quantile: the per-prompt rule's false alarm rate."""


def brorl_eval(checkpoint: str | Path, out: Path) -> dict:
    """`brorl eval --checkpoint CHECKPOINT --out OUT` (its `main`, in this process; a run folder is evaluated with
    its own `config.toml`) -> its result. The engine's core and worker run in this process too (vLLM's "uni"
    executor, as `bench.families` runs them): the same engine arguments, rendering, sampling and scoring, without
    two interpreters to start."""
    from actors.engine import in_process_engine, offline_env
    from cli.evaluate import add_parser, main

    offline_env()
    import vllm

    args = add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(
        ["--checkpoint", str(checkpoint), "--out", str(out)])
    t0, llm = time.monotonic(), vllm.LLM
    vllm.LLM = functools.partial(llm, distributed_executor_backend="uni")
    try:
        with in_process_engine():
            assert main(args, []) == 0
    finally:
        vllm.LLM = llm
    print(f"brorl eval in {time.monotonic() - t0:.1f} s")
    return json.loads(out.read_text())


def assert_agree(estimate: list[int], evaluated: list[int], k: int) -> tuple[float, float, float]:
    """Each prompt's count of correct samples out of `k` from the two (the same prompts, in order) agree within
    sampling error, overall and prompt by prompt, and both pass@1 are above 0 (0 == 0 proves nothing). If both
    sample prompt i alike, with success rate p_i, estimated from its 2k samples pooled (c_i correct):

    - pass@1 (the mean over n prompts of count / k): the difference of the two has variance
      sum_i 2 p_i (1 - p_i) / (k n^2), with p_i (1 - p_i) estimated without bias as c_i (2k - c_i) / (2k (2k - 1));
      the difference must stay within `SIGMAS` standard errors.
    - prompt by prompt: (a_i - b_i)^2 / (2k p_i (1 - p_i)) with p_i = c_i / 2k, summed over the m prompts that
      some sample solves and some fails, is about chi-square with m degrees of freedom; the sum must stay under
      that distribution's 1-in-10,000 quantile (Wilson-Hilferty). This sees a disagreement that moves prompts both
      ways, or that is small beside a weak model's pass@1, which the mean can hide.

    A prompt that both always or never solve adds nothing to either. Returns (estimate, evaluated, tolerance)."""
    n, m = len(estimate), 2 * k
    assert n == len(evaluated) > 0, (len(estimate), len(evaluated))
    var = sum(2 * (c := a + b) * (m - c) / (m * (m - 1)) / k for a, b in zip(estimate, evaluated)) / n ** 2
    p_est, p_eval, tol = sum(estimate) / (k * n), sum(evaluated) / (k * n), SIGMAS * math.sqrt(var)
    mixed = [(a, b) for a, b in zip(estimate, evaluated) if 0 < a + b < m]
    chi2 = sum((a - b) ** 2 / ((a + b) * (m - a - b) / m) for a, b in mixed)
    dof = len(mixed)
    limit = dof * (1 - 2 / (9 * dof) + Z_FALSE_ALARM * math.sqrt(2 / (9 * dof))) ** 3 if dof else 0.0
    print(f"held-out pass@1: the learner's estimate {p_est:.4f}, brorl eval {p_eval:.4f}, difference "
          f"{p_est - p_eval:+.4f}, tolerance {tol:.4f} ({n} prompts x {k} samples); per prompt: chi-square "
          f"{chi2:.1f}, limit {limit:.1f} ({dof} degrees of freedom); counts {estimate} and {evaluated}")
    assert p_est > 0 and p_eval > 0, (estimate, evaluated)
    assert abs(p_est - p_eval) <= tol, (p_est, p_eval, tol, estimate, evaluated)
    assert chi2 <= limit, (chi2, limit, estimate, evaluated)
    return p_est, p_eval, tol
