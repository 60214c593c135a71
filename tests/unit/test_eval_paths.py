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
