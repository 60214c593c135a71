"""Task data: the layouts users bring, each bad row named, splits, mixing, prompt rendering and the answer part of
a completion — on files the tests write (tests/support/user_data.py), read with pyarrow and `datasets`."""

import itertools
import json
from collections import Counter

import pytest

from config.data import DataConfig, DataSource
from config.loader import load_config
from taskdata import PromptRenderer, RenderError, answer_region, heldout_tasks, train_tasks, verifier_names
from taskdata.files import DataError
from taskdata.layouts import BadRow, detect, fields_of, to_task, verifier_for
from taskdata.sources import load_source, mixture
from tests.support import user_data
from verifiers.base import Task


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return user_data.write(tmp_path_factory.mktemp("data"))


def test_each_layout_is_recognised_by_its_columns():
    assert detect({"prompt", "reward_model", "data_source", "extra_info"}) == "verl"
    assert detect({"input", "label"}) == "openrlhf"
    assert detect({"problem", "solution", "answer"}) == "problem-answer"
    assert detect({"question", "answer"}) == "question-solution"
    assert detect({"prompt", "reference", "verifier"}) == "brorl"
    assert detect({"key", "prompt", "instruction_id_list", "kwargs"}) == "ifeval"
    with pytest.raises(BadRow, match=r"no known layout fits the columns \['body', 'x'\]"):
        detect({"x", "body"})


def test_rows_of_every_layout_become_tasks_with_their_verifier():
    def task(layout, row, src="f", **kw):
        return to_task(row, fields_of(layout, **kw), task_id="f:1", default_source=src, verifier="", user_map={})

    t = task("verl", {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "1+1?"}],
                      "reward_model": {"ground_truth": "2"}, "data_source": "openai/gsm8k"})
    assert (t.prompt, t.reference, t.verifier, t.source) == ("1+1?", "2", "math", "openai/gsm8k")
    assert t.messages == (("system", "s"), ("user", "1+1?"))
    t = task("openrlhf", {"input": "q", "label": "B", "datasource": "gpqa_diamond"})
    assert (t.verifier, t.reference) == ("science", "B")
    t = task("problem-answer", {"problem": "p", "answer": "3", "solution": "long", "source": "deepscaler"})
    assert (t.reference, t.verifier) == ("3", "math")
    t = task("question-solution", {"question": "q", "solution": "#### 4"}, src="gsm8k_train")  # the file's stem
    assert (t.source, t.reference, t.verifier) == ("gsm8k_train", "#### 4", "math")
    t = task("custom", {"body": "q", "gold": {"tests": [1]}, "kind": "code"}, prompt_key="body", answer_key="gold",
             source_key="kind")
    assert t.verifier == "code" and json.loads(t.reference) == {"tests": [1]}  # objects travel as JSON
    t = task("ifeval", {"prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]})
    assert t.verifier == "ifeval" and json.loads(t.reference)["instruction_id_list"] == ["punctuation:no_comma"]


def test_a_bad_row_names_its_field():
    f = fields_of("verl")
    for row, field in [({"prompt": [], "reward_model": {"ground_truth": "1"}}, "prompt"),
                       ({"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}, "prompt: message 0"),
                       ({"prompt": "q", "reward_model": {}}, "reward_model.ground_truth"),
                       ({"prompt": "q", "reward_model": {"ground_truth": "1"}, "data_source": "mystery"}, "mystery")]:
        with pytest.raises(BadRow, match=field):
            to_task(row, f, task_id="x", default_source="", verifier="", user_map={})
    # the user's map comes first and names sources the built-in one does not know
    assert verifier_for("mystery", {"myst*": "science"}) == "science" and verifier_for("MATH-500", {}) == "math"


def test_files_are_read_checked_and_bad_rows_named_with_file_and_row(files):
    cfg = DataConfig(eval=[DataSource(path=str(files["heldout"]))])
    lo = load_source(DataSource(path=str(files["train"])), cfg, "train")
    assert lo.layout == "verl" and lo.counts == {"rows": 10, "used": 8, "bad": 2, "held_out": 0, "overlap": 0}
    assert lo.bad[0].endswith("train.parquet:9: reward_model.ground_truth: missing or empty reference")
    assert "train.parquet:10: reference: test 0 expects no output" in lo.bad[1]  # any silent program would pass
    assert Counter(t.verifier for t in lo.tasks) == {"math": 4, "code": 2, "science": 2}
    hf = load_source(DataSource(path=str(files["ifeval"])), cfg, "train")  # a DatasetDict folder (save_to_disk)
    assert hf.layout == "ifeval" and len(hf.tasks) == 2
    js = load_source(DataSource(path=str(files["other"]), layout="custom", prompt_key="question_text",
                                answer_key="gold", source_key="task"), cfg, "train")
    assert [t.verifier for t in js.tasks] == ["reasoning_gym"] * 3 and "other.jsonl:3: not valid JSON" in js.bad[0]
    with pytest.raises(DataError, match=r"train.parquet:9: .*on_bad_row"):
        load_source(DataSource(path=str(files["train"])), cfg.model_copy(update={"on_bad_row": "fatal"}), "train")
    with pytest.raises(DataError, match="no usable train row"):
        load_source(DataSource(path=str(files["other"]), layout="custom", prompt_key="question_text",
                               answer_key="nope"), cfg, "train")
    with pytest.raises(DataError, match="no such file"):
        load_source(DataSource(path=str(files["train"]) + ".missing"), cfg, "train")


def test_splits_hold_out_by_content_or_leave_out_eval_prompts(files, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "source": "math"} for i in range(400)]
    path = tmp_path / "many.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = load_config("tiny-cpu", {"data.train": [str(path)]})
    held = heldout_tasks(cfg, n=1000)
    train = {t.prompt for t in itertools.islice(train_tasks(cfg), 2000)}
    assert 20 <= len(held) <= 60 and not train & {t.prompt for t in held} and len(train) == 400 - len(held)
    # with data.eval: the training file whole, less the rows that are also eval prompts
    pq.write_table(pa.Table.from_pylist(rows[:5]), tmp_path / "ev.parquet")
    cfg = load_config("tiny-cpu", {"data.train": [str(path)], "data.eval": [str(tmp_path / "ev.parquet")]})
    assert len(heldout_tasks(cfg)) == 5
    lo = load_source(cfg.data.train[0], cfg.data, "train", exclude={t.prompt for t in heldout_tasks(cfg)})
    assert lo.counts["overlap"] == 5 and lo.counts["used"] == 395


def test_sources_mix_by_weight_and_the_stream_is_the_same_for_a_seed():
    a = [Task(f"a{i}", "1", "math", f"a{i}") for i in range(10)]
    b = [Task(f"b{i}", "1", "math", f"b{i}") for i in range(10)]
    draw = list(itertools.islice(mixture([(a, 3.0), (b, 1.0)], seed=7), 4000))
    share = sum(t.prompt.startswith("a") for t in draw) / len(draw)
    assert 0.72 < share < 0.78
    assert draw[:50] == list(itertools.islice(mixture([(a, 3.0), (b, 1.0)], seed=7), 50))
    assert Counter(t.prompt for t in draw[:400] if t.prompt.startswith("b")).most_common(1)[0][1] <= 15  # passes


def test_prompts_render_through_the_chat_template_or_as_plain_text(tmp_path):
    from transformers import AutoTokenizer

    from tinymodel import build_tiny_model

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m", chat=True))
    data = DataConfig(system_prompt="Be brief.", prompt_format="Q: {prompt}")
    r = PromptRenderer(tok, data).render(Task("2+3?", "5", "math", "t"))
    assert r.text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: 2+3?<|im_end|>\n" \
                     "<|im_start|>assistant\n<think>\n"
    assert r.ids == tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Q: 2+3?"}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    msgs = Task("2+3?", "5", "math", "t", messages=(("user", "2+3?"),))
    assert PromptRenderer(tok, DataConfig()).render(msgs).text.count("<|im_start|>") == 2  # used as they are
    plain = PromptRenderer(tok, DataConfig(chat_template=False, prompt_format="Q: {prompt}"))
    assert plain.render(Task("2+3?", "5", "math", "t")).text == "Q: 2+3?"
    with pytest.raises(RenderError, match="chat messages"):
        plain.render(msgs)
    with pytest.raises(RenderError, match="more than the 5"):
        PromptRenderer(tok, DataConfig(), max_prompt_tokens=5).render(Task("2+3?", "5", "math", "t"))
    with pytest.raises(ValueError, match="no {prompt}"):
        DataConfig(prompt_format="Q:")


def test_only_the_answer_after_the_reasoning_block_is_read():
    assert answer_region("<think>x=5</think> \\boxed{6}", "</think>", "wrong") == " \\boxed{6}"
    assert answer_region("<think>so \\boxed{5}", "</think>", "wrong") is None  # never closed: wrong
    assert answer_region("<think>so \\boxed{5}", "</think>", "score") == "<think>so \\boxed{5}"
    assert answer_region("\\boxed{5}", "", "wrong") == "\\boxed{5}"


def test_the_verifiers_a_jobs_files_name(files):
    cfg = load_config("brorl-1.5b", user_data.sources(files))
    assert verifier_names(cfg) == {"math", "code", "science", "ifeval", "reasoning_gym"}
