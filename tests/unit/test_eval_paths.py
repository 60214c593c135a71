"""`brorl eval --checkpoint` takes what a user holds: a model folder, a run's checkpoint folder or a run folder."""

import pytest

from cli.evaluate import CheckpointError, model_folder, table


def _model(d):
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    return d


def test_checkpoint_paths_resolve_to_their_model_folder(tmp_path):
    model = _model(tmp_path / "my-model")
    assert model_folder(model) == model
    run = tmp_path / "runs" / "default"
    step80 = _model(run / "checkpoints" / "step-000080" / "model").parent
    _model(run / "checkpoints" / "step-000070" / "model")
    (run / "checkpoints" / "step-000090").mkdir()  # being written: no model yet
    assert model_folder(step80) == step80 / "model"
    assert model_folder(run) == step80 / "model"  # the newest finished checkpoint
    with pytest.raises(CheckpointError, match="neither a model folder"):
        model_folder(tmp_path / "runs")


def test_the_table_has_a_row_per_data_source():
    res = {"model": "m", "k": 4, "prompts": 3, "pass_at_1": 0.5, "pass_at_4": 0.75,
           "by_source": {"aime": {"prompts": 1, "pass_at_1": 0.25, "pass_at_4": 1.0},
                         "gpqa": {"prompts": 2, "pass_at_1": 0.625, "pass_at_4": 0.5}}}
    rows = table(res).splitlines()
    assert rows[2] == "| m | all | 3 | 4 | 50.0% | 75.0% |" and rows[3] == "| m | aime | 1 | 4 | 25.0% | 100.0% |"
    assert len(rows) == 5


def test_a_runs_checkpoint_is_evaluated_with_the_runs_own_config(tmp_path):
    from cli.evaluate import run_config

    run = tmp_path / "runs" / "x"
    model = _model(run / "checkpoints" / "step-000010" / "model")
    assert run_config(run) is None  # no config.toml: the preset (or --config) it is
    (run / "config.toml").write_text("")
    assert run_config(run) == run_config(model.parent) == run_config(model) == (run / "config.toml").resolve()
    assert run_config(_model(tmp_path / "my-model")) is None


def test_left_out_prompts_are_counted_and_reported_not_a_traceback():
    from evaluation import EvaluationError, render
    from taskdata import RenderError
    from verifiers.base import Task

    class Renderer:  # a double of taskdata's: a prompt longer than 3 characters does not fit
        def render(self, t):
            if len(t.prompt) > 3:
                raise RenderError(f"task {t.task_id}: the prompt has 9 tokens, more than the 3 ...")
            return type("R", (), {"ids": [1, 2]})()

    tasks = [Task("1+1", "2", "synthetic", "a", "s1"), Task("10+10", "20", "synthetic", "b", "s2")]
    p = render(Renderer(), tasks)
    assert [t.task_id for t in p.tasks] == ["a"] and p.ids == [[1, 2]]
    assert p.left_out == [{"task_id": "b", "source": "s2",
                           "reason": "task b: the prompt has 9 tokens, more than the 3 ..."}]
    with pytest.raises(EvaluationError, match="all 1 held-out prompts are left out, e.g. task b"):
        render(Renderer(), tasks[1:])
    res = {"model": "m", "k": 2, "prompts": 1, "pass_at_1": 0.5, "pass_at_2": 1.0, "by_source": {},
           "left_out_prompts": p.left_out, "timeouts": 1}
    assert table(res).splitlines()[-3:] == [
        "left out: 1 prompts that cannot be rendered for this model, e.g. task b: the prompt has 9 tokens, more "
        "than the 3 ...", "", "1 completions scored wrong: their verifier timed out (verifiers.timeout_s)"]
