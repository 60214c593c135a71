"""Learner: the BroRL update and the theory behind it.

Lives here: the pure loss and advantage functions (`algorithm.py`), chunked log-probs (`logprobs.py`),
the training step and its backends, the token-level simulator and the Theorem 1 / Lemma 1 checks
(`simulator.py`, `theory.py`), and the tiny-model builder used by tests and the default job.
Must not import: `actors` or vLLM — the learner reaches actors only through `transport`.
"""
