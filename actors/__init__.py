"""Actors: vLLM engines that generate N completions per prompt, continuously.

Lives here: engine construction from config and the wire group built from an engine's output
(`engine.py`), the actor role (`actor.py`: a few named loops) and its collaborators — the weight-sync
state machine (`weight_sync.py`), the engine supervisor (`supervisor.py`), the verifier scoring pool
(`scoring.py`) and the actor's counters (`stats.py`).
Must not import: `learner`, `evaluation`, `tinymodel` or `cli` (an actor knows the learner only through
`transport` messages).
"""
