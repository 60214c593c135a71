"""How a row of a user's file becomes a task: the field maps of the layouts other frameworks use, and the
map from a row's data source to the verifier that scores it.

| layout | prompt | reference | data source | verifier |
|---|---|---|---|---|
| brorl | `prompt` | `reference` | `data_source` | `verifier` |
| verl | `prompt` (chat messages) | `reward_model.ground_truth` | `data_source` | by data source |
| openrlhf | `input` | `label` | `datasource` | by data source |
| problem-answer | `problem` | `answer` (else `solution`, `tests`) | `source` / `data_source` | by data source |
| question-solution | `question` | `solution` (else `answer`, `input_output`, `test`) | `source` / `data_source` | by data source |
| prompt-tests | `prompt` | `test` (else `test_list`, `tests`) | `data_source` | by data source |
| ifeval | `prompt` | `{instruction_id_list, kwargs}` | "ifeval" | ifeval |
| custom | `prompt_key` | `answer_key` | `source_key` | by data source |

"auto" picks the first layout whose columns a file has, in the order above. A prompt is a string or a list
of chat messages ({"role", "content"}); a reference that is not a string (code tests, IFEval's
instructions) is passed on as JSON. A row the code verifier scores takes its test columns
(`CODE_TEST_COLUMNS`) as the reference where the layout's own column is a prose answer. Every failure names
the field (`BadRow`); the loader adds file and row.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any

from verifiers.base import Task


class BadRow(ValueError):
    """A row that cannot become a task; the message names the field."""


@dataclass(frozen=True)
class Fields:
    prompt: str
    answer: tuple[str, ...]
    """Reference columns, the first one present wins (dotted: nested)."""
    source: tuple[str, ...] = ("data_source",)
    verifier: str = ""
    """A column naming the verifier (brorl's own layout)."""


LAYOUTS: dict[str, Fields] = {
    "brorl": Fields("prompt", ("reference",), ("data_source",), verifier="verifier"),
    "verl": Fields("prompt", ("reward_model.ground_truth",), ("data_source",)),
    "openrlhf": Fields("input", ("label",), ("datasource", "data_source")),
    "problem-answer": Fields("problem", ("answer", "solution", "tests"), ("source", "data_source")),
    "question-solution": Fields("question", ("solution", "answer", "input_output", "test"),
                                ("source", "data_source")),
    "prompt-tests": Fields("prompt", ("test", "test_list", "tests"), ("data_source",)),
    "ifeval": Fields("prompt", ("instruction_id_list",), ()),
}

# a code row's test columns (DeepCoder `tests`, TACO / APPS `input_output`, KodCode / HumanEval `test`, MBPP
# `test_list`, PrimeIntellect `verification_info`) and their companions: the reference of a row the code
# verifier scores, in place of a prose `answer` / `solution` (not where answer_key names the column)
CODE_TEST_COLUMNS = ("input_output", "verification_info", "tests", "test_cases", "test_list", "test", "functional")
CODE_COMPANIONS = ("entry_point", "fn_name", "test_setup_code")

# data source (fnmatch, case-insensitive) -> verifier: after `data.verifier_map`, first match wins
BUILTIN_VERIFIER_MAP: tuple[tuple[str, str], ...] = (
    ("*reasoning_gym*", "reasoning_gym"), ("*reasoning-gym*", "reasoning_gym"),
    ("*ifeval*", "ifeval"), ("*instruction*follow*", "ifeval"),
    ("*gpqa*", "science"), ("*science*", "science"), ("*mmlu*", "science"), ("*sciq*", "science"),
    ("*scibench*", "science"), ("*chem*", "science"), ("*physic*", "science"), ("*biolog*", "science"),
    ("*code*", "code"), ("*apps*", "code"), ("*taco*", "code"), ("*livecodebench*", "code"),
    ("*codeforces*", "code"), ("*leetcode*", "code"), ("*primeintellect*", "code"), ("*humaneval*", "code"),
    ("*mbpp*", "code"), ("*evalplus*", "code"),
    ("*math*", "math"), ("*gsm8k*", "math"), ("*aime*", "math"), ("*amc*", "math"), ("*olympiad*", "math"),
    ("*minerva*", "math"), ("*deepscaler*", "math"), ("*numina*", "math"), ("*orz*", "math"), ("*skywork*", "math"),
)


def detect(columns: set[str]) -> str:
    """The first layout whose prompt and reference columns the file has."""
    if {"prompt", "instruction_id_list", "kwargs"} <= columns:
        return "ifeval"
    for name, f in LAYOUTS.items():
        if name == "ifeval":
            continue
        top = {c.split(".")[0] for c in f.answer}
        if f.prompt in columns and top & columns and (not f.verifier or f.verifier in columns):
            return name
    raise BadRow(f"no known layout fits the columns {sorted(columns)}: set layout (verl, openrlhf, "
                 f"problem-answer, question-solution, prompt-tests, brorl) or layout = \"custom\" with prompt_key and answer_key")


def fields_of(layout: str, prompt_key: str = "", answer_key: str = "", source_key: str = "") -> Fields:
    base = LAYOUTS.get(layout, Fields("prompt", ("answer",), ("data_source",)))
    return Fields(prompt_key or base.prompt, (answer_key,) if answer_key else base.answer,
                  (source_key,) if source_key else base.source, base.verifier)


def get(row: dict, dotted: str) -> Any:
    node: Any = row
    for part in dotted.split("."):
        if isinstance(node, str) and part:  # verl keeps some nested fields as JSON strings
            try:
                node = json.loads(node)
            except json.JSONDecodeError:
                return None
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def messages_of(value: Any) -> tuple[tuple[str, str], ...]:
    """Chat messages from a list of {"role", "content"} (verl's prompt column); BadRow if malformed."""
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRow(f"prompt: message {i} is not a {{'role': str, 'content': str}} object")
        out.append((m["role"], m["content"]))
    if not any(r == "user" for r, _ in out):
        raise BadRow("prompt: the messages hold no user message")
    if not [c for r, c in out if r == "user"][-1].strip():
        raise BadRow("prompt: the last user message is empty")
    return tuple(out)


def verifier_for(source: str, user_map: dict[str, str]) -> str:
    """The verifier of a data source: `data.verifier_map` first (fnmatch patterns), then the built-in map."""
    s = source.lower()
    for pattern, name in [*user_map.items(), *BUILTIN_VERIFIER_MAP]:
        if fnmatch.fnmatchcase(s, pattern.lower()):
            return name
    return ""


def to_task(row: dict, f: Fields, *, task_id: str, default_source: str, verifier: str,
            user_map: dict[str, str]) -> Task:
    """One row as a task, or BadRow naming the field."""
    raw = get(row, f.prompt)
    if isinstance(raw, str):
        if not raw.strip():
            raise BadRow(f"{f.prompt}: empty prompt")
        prompt, messages = raw, ()
    elif isinstance(raw, (list, tuple)) and raw:
        messages = messages_of(raw)
        prompt = [c for r, c in messages if r == "user"][-1]
    else:
        raise BadRow(f"{f.prompt}: missing, or not a string or a list of chat messages")
    if f is LAYOUTS["ifeval"] or (f.answer == ("instruction_id_list",)):
        ids, kwargs = row.get("instruction_id_list"), row.get("kwargs")
        if not isinstance(ids, (list, tuple)) or not ids:
            raise BadRow("instruction_id_list: missing or empty")
        ref: Any = {"instruction_id_list": list(ids), "kwargs": list(kwargs or [{}] * len(ids))}
        source, verifier = default_source or "ifeval", verifier or "ifeval"
    else:
        source = next((str(v) for k in f.source if (v := get(row, k)) not in (None, "")), default_source)
        if not verifier and f.verifier:
            verifier = str(row.get(f.verifier) or "")
        verifier = verifier or verifier_for(source, user_map)
        tests = {k: _plain(row[k]) for k in CODE_TEST_COLUMNS if row.get(k) is not None and row.get(k) != ""}
        if verifier == "code" and tests and f.answer in _PROSE_ANSWERS:
            ref = tests | {k: _plain(row[k]) for k in CODE_COMPANIONS if row.get(k) not in (None, "")}
        else:
            key = next((k for k in f.answer if get(row, k) is not None), f.answer[0])
            ref = get(row, key)
            if ref is None or (isinstance(ref, str) and not ref.strip()):
                raise BadRow(f"{key}: missing or empty reference")
        if not verifier:
            raise BadRow(f"no verifier for data source {source!r}: name it in data.verifier_map "
                         f"(e.g. {{\"{source}\" = \"math\"}}) or set the file's verifier")
    reference = ref if isinstance(ref, str) else json.dumps(_plain(ref))
    return Task(prompt, reference, verifier, task_id, source=source, messages=messages)


_PROSE_ANSWERS = {LAYOUTS[n].answer for n in ("problem-answer", "question-solution", "prompt-tests")}


def _plain(v: Any) -> Any:
    """Values from Parquet / Arrow as JSON-able Python (numpy arrays and scalars included)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
