"""Actors: vLLM engines that generate N completions per prompt, continuously.

Lives here: engine construction from config (`engine.py`) and, as the actor role grows, the loop that
asks the learner for work, samples groups with behaviour log-probs, scores them and streams them out.
Must not import: `learner` (an actor knows the learner only through `transport` messages).
"""
