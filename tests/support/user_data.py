"""A user's data, made locally in the layouts other frameworks write (nothing from a hub):

    train.parquet     verl: `prompt` as chat messages, `reward_model.ground_truth`, `data_source` — math
                      (openai/gsm8k), code (codecontests, APPS-style inputs/outputs) and science (gpqa) rows,
                      and two bad rows (no reference; a code test any silent program passes)
    ifeval_hf/        a `datasets` DatasetDict saved with save_to_disk: IFEval's own columns
    other.jsonl       other field names (`question_text`, `gold`, `task`): reasoning-gym entries as reasoning-gym
                      exports them, read with layout = "custom"; one line that is not JSON
    heldout.parquet   verl: held-out math and science rows

`four_layouts` writes math rows in each layout a newcomer brings: verl Parquet, OpenRLHF JSONL, a
DeepScaleR-style JSON list and a `datasets` save_to_disk folder. `arithmetic` writes the built-in task's problems
as verl Parquet chat rows, which the warm tiny model solves through `ARITHMETIC_TEMPLATE`.
"""

from __future__ import annotations

import json
from pathlib import Path

MATH = [("What is 2+3?", "5"), ("What is 7-4?", "3"), ("What is 3*3?", "9"), ("What is 8/2?", "4"),
        ("What is 6+1?", "7"), ("What is 9-5?", "4")]
SCIENCE = [("Which gas do plants absorb? (A) O2 (B) CO2 (C) N2", "B"),
           ("What is H2O? (A) salt (B) acid (C) water", "C"),
           ("Which is a noble gas? (A) Ne (B) Na (C) Cl", "A")]
CODE = [("Read n and print 2n.", {"inputs": ["2\n", "5\n"], "outputs": ["4\n", "10\n"]}),
        ("Read n and print n+1.", {"inputs": ["1\n"], "outputs": ["2\n"]})]


def _verl(prompt: str, source: str, truth, i: int) -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": prompt}], "ability": "x",
            "reward_model": {"style": "rule", "ground_truth": truth if isinstance(truth, str) else json.dumps(truth)},
            "extra_info": {"split": "train", "index": i}}


def write(root: str | Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import reasoning_gym
    from datasets import Dataset, DatasetDict

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows = [_verl(p, "openai/gsm8k", a, i) for i, (p, a) in enumerate(MATH[:4])]
    rows += [_verl(p, "codecontests", t, 10 + i) for i, (p, t) in enumerate(CODE)]
    rows += [_verl(p, "gpqa", a, 20 + i) for i, (p, a) in enumerate(SCIENCE[:2])]
    rows += [{**_verl("Bad row: no answer", "openai/gsm8k", "", 30)},
             _verl("Print nothing.", "codecontests", {"inputs": ["1\n"], "outputs": [""]}, 31)]
    paths = {"train": root / "train.parquet", "ifeval": root / "ifeval_hf", "other": root / "other.jsonl",
             "heldout": root / "heldout.parquet"}
    pq.write_table(pa.Table.from_pylist(rows), paths["train"])
    held = [_verl(p, "openai/gsm8k", a, i) for i, (p, a) in enumerate(MATH[4:])] + \
           [_verl(SCIENCE[2][0], "gpqa", SCIENCE[2][1], 9)]
    pq.write_table(pa.Table.from_pylist(held), paths["heldout"])
    ifeval = {"key": [1, 2], "prompt": ["Write a short note without commas.", "Say hi in lower case."],
              "instruction_id_list": [["punctuation:no_comma"], ["change_case:english_lowercase"]],
              "kwargs": [[{}], [{}]]}
    DatasetDict({"train": Dataset.from_dict(ifeval)}).save_to_disk(str(paths["ifeval"]))
    ds = reasoning_gym.create_dataset("basic_arithmetic", seed=3, size=3)
    lines = [json.dumps({"question_text": ds[i]["question"], "gold": ds[i], "task": "reasoning_gym"}) for i in range(3)]
    paths["other"].write_text("\n".join(lines[:2] + ["{not json"] + lines[2:]) + "\n")
    return paths


def sources(paths: dict[str, Path]) -> dict[str, object]:
    """The `data.train` / `data.eval` overrides a user writes for these files."""
    return {"data.train": [{"path": str(paths["train"]), "weight": 2.0},
                           {"path": str(paths["ifeval"])},
                           {"path": str(paths["other"]), "layout": "custom", "prompt_key": "question_text",
                            "answer_key": "gold", "source_key": "task"}],
            "data.eval": [str(paths["heldout"])]}


def four_layouts(root: str | Path) -> dict[str, Path]:
    """verl Parquet (`prompt` chat messages, `reward_model.ground_truth`), OpenRLHF JSONL (`input`, `label`,
    `datasource`), a DeepScaleR JSON list (`[{"problem", "answer", "solution"}, ...]`) and a save_to_disk
    Dataset (`question`, `solution`, `data_source`): MATH's rows in each."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = {"verl": root / "verl.parquet", "openrlhf": root / "openrlhf.jsonl",
             "deepscaler": root / "deepscaler.json", "hf": root / "hf_math"}
    pq.write_table(pa.Table.from_pylist([_verl(p, "openai/gsm8k", a, i) for i, (p, a) in enumerate(MATH)]),
                   paths["verl"])
    paths["openrlhf"].write_text("".join(json.dumps({"input": p, "label": a, "datasource": "gsm8k"}) + "\n"
                                         for p, a in MATH))
    paths["deepscaler"].write_text(json.dumps([{"problem": p, "answer": a, "solution": f"So {a}."} for p, a in MATH],
                                              indent=2))
    Dataset.from_dict({"question": [p for p, _ in MATH], "solution": [a for _, a in MATH],
                       "data_source": ["math"] * len(MATH)}).save_to_disk(str(paths["hf"]))
    return paths


ARITHMETIC_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
"""A chat template (`data.chat_template`) for the tiny model, which has none: a user message becomes its text
alone, the prompt the warm start trained on (`3+4=`)."""


def arithmetic(root: str | Path) -> dict[str, Path]:
    """The built-in task's problems of one-digit operands as a user brings them: verl Parquet rows, `prompt` as chat
    messages, data source openai/gsm8k (the math verifier). train.parquet: the task's train split; heldout.parquet:
    every problem of its eval split."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verifiers.synthetic import problem_split

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list[dict]] = {"train": [], "eval": []}
    for a in range(10):
        for op in "+-":
            for b in range(10):
                split = rows[problem_split(a, op, b)]
                split.append(_verl(f"{a}{op}{b}=", "openai/gsm8k", str(a + b if op == "+" else a - b), len(split)))
    paths = {"train": root / "train.parquet", "eval": root / "heldout.parquet"}
    for name, path in paths.items():
        pq.write_table(pa.Table.from_pylist(rows[name]), path)
    return paths
