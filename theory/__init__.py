"""The paper's theory, runnable: the section 4.1 token-level simulator (`simulator.py`, `brorl simulate`
through `report.py`) and Theorem 1 / Lemma 1 as checkable functions (`theorems.py`).

Must not import: any other brorl package — the theory stands on torch alone, so it can be read and
checked without the system around it.
"""
