"""Verifiers: tasks and their reward functions.

Lives here: the verifier protocol (`base.py`), the registry with self-tested hot swap (`registry.py`), task
generators and JSONL datasets (`datasets.py`), the built-in verifiers (`synthetic`, `math`, sandboxed
`code`, `reasoning_gym`) and the code sandbox (`sandbox.py`); the code verifier's reference formats
(`code_formats.py`, test code: `code_asserts.py`), comparison (`code_compare.py`) and the program it runs in
the sandbox for call-based tests (`call_harness.py`, read as text, never imported).
Must not import: any other brorl package, nor vLLM or torch — a verifier is a pure function of text, so
the same code scores training rollouts and `brorl eval`, in any process.
"""
