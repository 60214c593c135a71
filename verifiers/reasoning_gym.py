"""Any reasoning-gym dataset, generated locally with a seed and scored with its own `score_answer`.

The reference is JSON naming how to regenerate the entry — {"dataset": NAME, "seed": S, "size": K,
"index": I} — so nothing but four numbers and a name travels with a sample; the entry (with the
metadata `score_answer` needs) is rebuilt deterministically and cached per (dataset, seed, size). Or it is
the entry itself, as reasoning-gym writes it ({"question", "answer", "metadata": {"source_dataset": NAME,
...}}: a user's exported data), scored by that dataset's `get_score_answer_fn`.
The answer is the text inside the last <answer>...</answer>, else after the last "Answer:", else the
whole stripped completion. correct iff score_answer gives 1.0.
"""

from __future__ import annotations

import functools
import json
import re

from verifiers.base import VerifierResult

NAME = "reasoning_gym"
VERSION = "1"
_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@functools.lru_cache(maxsize=64)
def dataset(name: str, seed: int, size: int):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size)


def reference_for(name: str, seed: int, size: int, index: int) -> str:
    return json.dumps({"dataset": name, "seed": seed, "size": size, "index": index})


def extract_answer(completion: str) -> str:
    tags = _TAG.findall(completion)
    if tags:
        return tags[-1].strip()
    if "Answer:" in completion:
        return completion.rsplit("Answer:", 1)[1].strip()
    return completion.strip()


def _entry(reference: str):
    """(entry, scoring function) of a reference in either form."""
    import reasoning_gym

    ref = json.loads(reference)
    if not isinstance(ref, dict):
        raise ValueError("a reasoning-gym reference is a JSON object")
    if "index" in ref:
        ds = dataset(ref["dataset"], int(ref["seed"]), int(ref["size"]))
        return ds[int(ref["index"])], ds.score_answer
    name = (ref.get("metadata") or {}).get("source_dataset")
    if not name or "answer" not in ref:
        raise ValueError("neither {dataset, seed, size, index} nor an entry with answer and metadata.source_dataset")
    return ref, reasoning_gym.get_score_answer_fn(name)


def describe(reference: str) -> str:
    entry, _ = _entry(reference)
    name = (entry.get("metadata") or {}).get("source_dataset", "?")
    return f"reasoning-gym {name}: answer {str(entry.get('answer'))[:80]!r}, scored by the dataset's score_answer"


def check_reference(reference: str) -> str:
    try:
        _entry(reference)
    except Exception as e:  # malformed JSON, an unknown dataset name
        return f"not a reasoning-gym reference ({type(e).__name__}: {e})"
    return ""


def score(completion: str, reference: str) -> VerifierResult:
    entry, score_answer = _entry(reference)
    answer = extract_answer(completion)
    if not answer:
        return VerifierResult(0.0, False, "no answer")
    value = float(score_answer(answer, entry))
    ok = value >= 1.0
    return VerifierResult(value, ok, "match" if ok else ("partial" if value > 0 else "mismatch"))


SELF_TEST = [
    ("<answer>-4</answer>", reference_for("basic_arithmetic", 1, 3, 0), True),
    ("<answer>17</answer>", reference_for("basic_arithmetic", 1, 3, 0), False),
]
