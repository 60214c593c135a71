"""The learner's held-out estimate and `brorl eval` score the same completions alike, on a user's files (verl
math rows as chat messages, a chat-templated reasoning model, `data.reasoning_end`): the learner scores in a
worker thread (`asyncio.to_thread`), where math-verify's signal-based time limit cannot work; a verifier that
cannot score stops the evaluation instead of reading as a wrong answer. The samplers are doubles (fixed
completions); rendering, the thread, the scoring processes and the verifiers are real."""

import asyncio
import json
import threading
from pathlib import Path

import pytest

from config.loader import load_config
from evaluation import EvalSettings, EvaluationError, heldout_tasks, results, settings
from tests.support.user_data import _verl
from verifiers.base import Task

# per prompt, whatever it asks: for reference 7 the 1st and 5th are right, for 4 the 2nd and 3rd
FIXED = ["<think>6+1</think> so \\boxed{7}", "<think>9-5</think> \\boxed{4}",
         "<think>\\boxed{7} or \\boxed{4}?</think> The answer is $4$.", "<think>never closed \\boxed{7} \\boxed{4}",
         "<think>14/2</think> \\boxed{\\frac{14}{2}}"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tinymodel.build import tiny_tokenizer

    d = tmp_path_factory.mktemp("user")
    model = d / "model"  # a user's reasoning model, in small: only its tokenizer is read here
    tiny_tokenizer(chat=True).save_pretrained(model)
    (d / "run").mkdir()
    rows = [_verl("What is 6+1?", "openai/gsm8k", "7", 0), _verl("What is 9-5?", "openai/gsm8k", "4", 1),
            _verl("What is 6+1? " + "Think hard. " * 40, "openai/gsm8k", "7", 2)]  # too long for the context
    pq.write_table(pa.Table.from_pylist(rows), d / "heldout.parquet")
    cfg = load_config("tiny-cpu", {"model.path": str(model), "data.train": [str(d / "heldout.parquet")],
                                   "data.eval": [str(d / "heldout.parquet")], "data.reasoning_end": "</think>",
                                   "actor.max_model_len": 64, "run.eval_samples": len(FIXED),
                                   "run.eval_interval": 1, "run.run_dir": str(d / "run")})
    return cfg, model


def test_the_learners_estimate_and_brorl_eval_score_user_files_alike(job, monkeypatch):
    import evaluation.hf
    import evaluation.vllm
    from cli.evaluate import renderer_for
    from learner.heldout import HeldoutEstimate

    cfg, model = job
    threads = []

    def fixed(*args):
        threads.append(threading.current_thread())
        return [list(FIXED) for _ in args[-2]]

    monkeypatch.setattr(evaluation.hf, "sample", fixed)
    monkeypatch.setattr(evaluation.vllm, "sample", fixed)
    renderer = renderer_for(cfg, model)  # brorl eval's, and the learner's: the room max_model_len leaves
    learner = HeldoutEstimate(cfg, renderer)
    m = asyncio.run(learner.run(None, renderer.tok, 0, 0.0))
    assert threads[-1] is not threading.main_thread()  # the learner's real context: a worker thread
    tasks = heldout_tasks(cfg)
    ev = evaluation.vllm.evaluate(None, tasks, settings(cfg), renderer)
    row = json.loads((Path(cfg.run.run_dir) / "heldout.jsonl").read_text().splitlines()[-1])
    assert row["correct"] == [p["correct"] for p in ev["per_prompt"]] == [2, 2]
    assert m["heldout_pass_at_1"] == ev["pass_at_1"] == pytest.approx(0.4)
    assert m["heldout_left_out"] == ev["left_out"] == 1  # the long prompt: counted, not a traceback
    assert "more than the 63" in ev["left_out_prompts"][0]["reason"]


@pytest.mark.parametrize("error,says", [
    (EvaluationError("could not score 2 of the completions of task t: error: ValueError"), "could not score 2"),
    (RuntimeError("CUDA out of memory"), "RuntimeError: CUDA out of memory")])
def test_a_verifier_that_cannot_score_costs_the_step_its_estimate_not_the_run(job, monkeypatch, tmp_path, error,
                                                                             says):
    """The learner's estimate meets a verifier error, or fails itself (out of memory beside the engine): no metric
    for that step, an `error` row in heldout.jsonl, an error event for the console — and `run` returns, so training
    goes on to the step's checkpoint (a failure there would make every resume fail at the same step)."""
    import evaluation.hf
    from learner.heldout import HeldoutEstimate
    from transport import events

    cfg, model = job

    def broken(*args, **kwargs):
        raise error

    monkeypatch.setattr(evaluation.hf, "evaluate", broken)
    monkeypatch.setenv(events.ENV_FILE, str(tmp_path / "events.jsonl"))
    monkeypatch.setenv(events.ENV_ROLE, "learner")
    m = asyncio.run(HeldoutEstimate(cfg, None).run(None, None, 7, 0.0))
    assert m == {}
    row = json.loads((Path(cfg.run.run_dir) / "heldout.jsonl").read_text().splitlines()[-1])
    assert row["step"] == 7 and says in row["error"]
    ev = [json.loads(ln) for ln in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["role"], e["level"]) for e in ev] == [("learner", "error")]
    assert "training goes on" in ev[0]["message"] and says in ev[0]["message"]


def test_math_scores_off_the_main_thread_and_a_verifier_error_is_never_a_wrong_answer():
    from verifiers.math import score

    got = {}
    t = threading.Thread(target=lambda: got.update(r=score("so \\boxed{\\frac{1}{2}}", "0.5")))
    t.start()
    t.join()
    assert got["r"].correct and got["r"].reason == "match"
    task = Task("What is 1/2?", "", "math", "bad")  # a reference math-verify cannot parse: the verifier raises
    with pytest.raises(EvaluationError, match="could not score 2 of the completions of task bad: error: ValueError"):
        results([task], [["\\boxed{1}", "\\boxed{2}"]], EvalSettings(k=2, verifier_workers=0))


def test_brorl_eval_of_a_run_takes_its_config_and_refuses_unusable_prompts_in_one_line(job, tmp_path, capsys):
    import argparse
    import shutil

    from cli.evaluate import add_parser, main
    from config.loader import to_toml

    cfg, model = job
    run = tmp_path / "runs" / "x"  # its own context is too small for every held-out prompt
    shutil.copytree(model, run / "checkpoints" / "step-000001" / "model")
    (run / "checkpoints" / "step-000001" / "model" / "config.json").write_text("{}")
    (run / "config.toml").write_text(to_toml(cfg.model_copy(update={"actor": cfg.actor.model_copy(
        update={"max_model_len": 12, "max_tokens": 4})})))
    args = add_parser(argparse.ArgumentParser().add_subparsers()).parse_args(["--checkpoint", str(run)])
    assert main(args, []) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"brorl eval: the run's own settings, {(run / 'config.toml').resolve()} (--config to use others)"
    assert len(err) == 2 and err[1].startswith("brorl eval: all 3 held-out prompts are left out, e.g. task ")
    assert "more than the 11 that actor.max_model_len leaves" in err[1]


def test_the_learners_sampler_draws_as_brorl_evals_engine_does(tiny_model_dir, tmp_path):
    """`evaluation.hf.sample` (the learner's estimate) samples as vLLM does for `brorl eval`: from the settings alone,
    not from the sampling defaults a model ships (Qwen2.5's generation_config.json: top_k = 20, repetition_penalty
    = 1.05) nor transformers' own top_k = 50; a completion ends where the context does and before a stop string."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evaluation.hf import sample

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    shipped = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**shipped, "top_k": 20, "repetition_penalty": 1.05}))
    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tok("3+4=")["input_ids"]

    def draw(seed=0, **how):
        torch.manual_seed(seed)
        return sample(model, tok, [prompt], EvalSettings(**{"k": 64, "temperature": 1.0, "top_p": 1.0, **how}))[0]

    # the untrained model's next token is close to uniform: most draws fall outside its 50 likeliest tokens
    with torch.no_grad():
        likeliest = model(torch.tensor([prompt])).logits[0, -1].topk(50).indices.tolist()
    top = {tok.decode([i]) for i in likeliest}
    first = draw(max_tokens=1)
    assert sum(t not in top for t in first) > 16, first
    assert model.generation_config.top_k == 20  # the model's own settings are back for whoever uses them next
    # the context ends a completion: one token of room, the first token of the same draw
    whole = draw(max_tokens=8)
    one = draw(max_tokens=8, max_model_len=len(prompt) + 1)
    vocab = set(tok.get_vocab()) | {""}
    assert all(o in vocab and w.startswith(o) for o, w in zip(one, whole)) and one != whole, (one, whole)
    # a stop string ends it, and is not part of it, as vLLM returns it
    stopped = draw(max_tokens=8, stop=("1", "+"))
    assert sum("1" in w or "+" in w for w in whole) > 8
    assert stopped == [w[:min([w.find(x) for x in "1+" if x in w] or [len(w)])] for w in whole], (stopped, whole)
    # the paper's T = 0.6 and top-p 0.95 (vLLM's rule: a token is kept while the mass above it is under p), on a
    # model made sure of itself (its last norm x 5: ~50 tokens left): the first token's draws follow that law
    # closely, and would be far from it at T = 0.8 (total variation ~0.24)
    with torch.no_grad():
        model.model.norm.weight.mul_(5)
        probs = (model(torch.tensor([prompt])).logits[0, -1] / 0.6).softmax(-1)
    mass, order = probs.sort(descending=True)
    kept = order[mass.cumsum(0) - mass < 0.95]
    law = torch.zeros_like(probs)
    law[kept] = probs[kept] / probs[kept].sum()
    ids = tok.get_vocab()
    got = [ids[t] if t else tok.eos_token_id for t in draw(k=2048, temperature=0.6, top_p=0.95, max_tokens=1)]
    seen = torch.bincount(torch.tensor(got), minlength=len(law)).double() / len(got)
    assert 10 < len(kept) < 100 and 0.5 * (seen - law).abs().sum() < 0.1, (len(kept), seen, law)
