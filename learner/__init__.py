"""The learner role: admit groups, train on them, publish the weights.

Lives here: the service (`service.py`: the loop of the design diagram and its background tasks), the
bookkeeping between sockets and training step (`batching.py`: dispatcher, admission, awaitable batcher,
membership), the pure loss and advantage functions (`algorithm.py`), chunked log-probs (`logprobs.py`),
the training step and its backends (`train_step.py`, `backends.py`), checkpoints (`checkpoint.py`),
metrics (`metrics.py`) and the per-step report (`report.py`).
Must not import: `actors`, `tinymodel` or `cli` — the learner reaches actors only through `transport`.
"""
