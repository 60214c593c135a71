"""Verifiers: tasks and their reward functions.

Lives here: the verifier protocol (`base.py`), task generators and datasets, and the built-in
verifiers (`synthetic`, more to come: math, sandboxed code, reasoning-gym).
Must not import: vLLM, torch, `learner`, `actors` or `transport` — a verifier is a pure function of
text, so the same code scores training rollouts and `brorl eval`, in any process.
"""
