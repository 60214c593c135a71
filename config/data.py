"""The `[data]` section: the user's task files, how their rows map to prompts and verifiers, and how a
prompt is rendered for the model and its completions read back.

    [[data.train]]                      # one table per file; several mix by `weight`
    path = "data/math.parquet"          # JSONL, Parquet, or an HF `datasets` folder (save_to_disk)
    [[data.eval]]
    path = "data/aime.parquet"

On the command line a source is its path: `--data.train train.parquet` or `--data.train '["a.parquet",
"b.jsonl"]'`. The layouts a file may use (verl, OpenRLHF, problem/answer, question/solution, brorl's own) are
`taskdata/layouts.py`'s; `brorl data preview` shows how rows are read.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from config.section import Section

LAYOUTS = ("auto", "brorl", "verl", "openrlhf", "problem-answer", "question-solution", "prompt-tests", "ifeval",
           "custom")


class DataSource(Section):
    path: str
    """A JSONL file, a Parquet file, or a folder written by `datasets`' `save_to_disk` (a Dataset or a
    DatasetDict). Relative paths are taken from the working directory."""

    weight: float = Field(1.0, gt=0.0)
    """Share of the training stream drawn from this source, relative to the other sources' weights."""

    layout: Literal[LAYOUTS] = "auto"  # type: ignore[valid-type]
    """How a row's fields are read: "auto" recognises the layouts below by their columns; "verl" (`prompt`
    as chat messages, `reward_model.ground_truth`, `data_source`), "openrlhf" (`input` / `label`, or the keys
    set here), "problem-answer", "question-solution", "prompt-tests" (`prompt` and a code test column:
    HumanEval, MBPP), "brorl" (`prompt`, `reference`, `verifier`), or
    "custom" (`prompt_key` and `answer_key` name the columns)."""

    prompt_key: str = ""
    """Column of the prompt (a string, or a list of chat messages) when it is not the layout's own."""

    answer_key: str = ""
    """Column of the reference answer (dotted for nested fields: "reward_model.ground_truth")."""

    source_key: str = ""
    """Column that names each row's data source (verl's `data_source`); it picks the verifier through
    `data.verifier_map` and labels per-source metrics. Empty: the layout's own, else the file's stem."""

    verifier: str = ""
    """The verifier of every row of this file, whatever `data_source` says (e.g. "science")."""

    split: str = ""
    """For a `DatasetDict` folder: the split to read (default: "train" for data.train, else the only one
    or "test")."""

    limit: int = Field(0, ge=0)
    """Read at most this many rows (0: all)."""


class DataConfig(Section):
    train: list[DataSource] = Field(default_factory=list)
    """Training files. Empty: the procedural task of `verifiers.task`."""

    eval: list[DataSource] = Field(default_factory=list)
    """Held-out files for the evaluations before and after training, `run.eval_interval` and `brorl eval`.
    Empty: the held-out share of the training files (or the generator's eval split)."""

    verifier_map: dict[str, str] = Field(default_factory=dict)
    """A row's data source -> verifier name, taken before the built-in map (`taskdata/layouts.py`: e.g.
    "openai/gsm8k" and names containing "math" -> math, "ifeval" -> ifeval). Keys are fnmatch patterns."""

    on_bad_row: Literal["skip", "fatal"] = "skip"
    """A row that cannot be read (no prompt, no answer, no verifier, a reference its verifier refuses): skip
    it (named in the log and counted) or stop at load with its file, row and field."""

    heldout_share: float = Field(0.0, ge=0.0, lt=1.0)
    """Without `data.eval`: the share of training rows held out for evaluation (by a hash of the prompt,
    so the split is the same on every run). 0: 0.1 if `data.eval` is empty, else none."""

    chat_template: bool | str = True
    """How a prompt becomes the model's text. true: the tokenizer's own chat template
    (`apply_chat_template(..., add_generation_prompt=True)`) when it has one, else plain text (a row of chat
    messages is then refused). A Jinja template — the text itself or the path of a `.jinja` file (read at
    load) — for a model that has none. "plain": no template at all; a row of chat messages becomes its
    messages' text, one paragraph each. false: plain text, and rows of chat messages are refused."""

    system_prompt: str = ""
    """A system message put before every prompt that has none (with the chat template), or text put before
    every prompt (without)."""

    prompt_format: str = "{prompt}"
    """The user message made from a row's prompt text: `{prompt}` stands for it (e.g. "{prompt}\\nPut the
    final answer in \\\\boxed{{}}."). Rows that are chat messages are used as they are."""

    reasoning_end: str = ""
    """The marker that closes a reasoning block (e.g. "</think>"): verifiers score only the text after its
    first occurrence. Empty: the whole completion is scored."""

    unclosed_reasoning: Literal["wrong", "score"] = "wrong"
    """A completion that never writes `reasoning_end`: "wrong" (reward 0, reason "reasoning not closed") or
    "score" (the whole completion is scored)."""

    @field_validator("train", "eval", mode="before")
    @classmethod
    def _paths(cls, v):
        """A path, or a list of paths and tables: `--data.train a.parquet` is `[{path = "a.parquet"}]`."""
        if isinstance(v, str):
            v = [p for p in v.split(",") if p.strip()] if v.strip() else []
        if isinstance(v, list):
            return [{"path": x.strip()} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("chat_template", mode="before")
    @classmethod
    def _template(cls, v):
        """A path names a template file, read here (the roles get its text); other text must be Jinja."""
        if not isinstance(v, str) or v in ("plain",) or "{{" in v or "{%" in v:
            return v
        from pathlib import Path

        if v.strip().lower() in ("true", "false"):
            return v.strip().lower() == "true"
        p = Path(v).expanduser()
        if not p.is_file():
            raise ValueError(f"{v!r} is no file here and no Jinja template: give true, false, \"plain\", a Jinja "
                             f"template ({{% for message in messages %}}...) or the path of a .jinja file")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{v!r}: cannot read the template file ({e})") from None
        if "{{" not in text and "{%" not in text:
            raise ValueError(f"{v!r}: the file holds no Jinja template (no {{{{ or {{%)")
        return text

    @field_validator("prompt_format")
    @classmethod
    def _has_prompt(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise ValueError(f"{v!r} has no {{prompt}}: the row's prompt would be left out")
        try:
            v.format(prompt="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"{v!r} is not a format string with only {{prompt}} ({e}); write braces as {{{{ }}}}") from None
        return v
