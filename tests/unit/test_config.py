import subprocess
import sys

import pytest

from config.loader import ConfigError, load_config, parse_overrides, preset_paths, to_toml, validate
from config.schema import BrorlConfig


DATA = {"data.train": "train.parquet"}  # the 1.5B presets train on the user's files: they must name them


def test_presets_exist_and_load():
    names = {p.stem for p in preset_paths()}
    assert {"tiny-cpu", "brorl-1.5b", "prorl-1.5b"} <= names
    for p in preset_paths():
        cfg = load_config(p, DATA if "1.5b" in p.stem else {})
        assert isinstance(cfg, BrorlConfig)


@pytest.mark.parametrize("preset", ["brorl-1.5b", "prorl-1.5b"])
def test_a_preset_of_the_users_data_refuses_without_it_in_one_line(preset):
    with pytest.raises(ConfigError) as e:
        load_config(preset)
    reason = str(e.value).splitlines()[1:]
    assert len(reason) == 1 and "data.train is empty" in reason[0] and "--data.train" in reason[0]
    bad = subprocess.run([sys.executable, "-m", "cli", "run", "--config", preset], capture_output=True, text=True)
    assert bad.returncode == 2 and "data.train is empty" in bad.stderr and "Traceback" not in bad.stderr


def test_paper_recipes():
    bro, pro = load_config("brorl-1.5b", DATA), load_config("prorl-1.5b", DATA)
    assert (bro.job.n_samples, bro.job.prompts_per_step) == (512, 128)
    assert (pro.job.n_samples, pro.job.prompts_per_step) == (16, 512)
    # same number of PPO mini-batches whatever N is (paper 4.2)
    assert bro.learner.num_minibatches == pro.learner.num_minibatches
    # BroRL's lr is scaled from ProRL's samples per step
    assert bro.learner.lr_base_samples == pro.samples_per_step


def test_every_field_has_a_docstring():
    def walk(model_cls, prefix=""):
        for name, f in model_cls.model_fields.items():
            assert f.description and len(f.description) > 10, f"{prefix}{name} has no docstring"
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BrorlConfig.__mro__[1]):
                walk(ann, f"{prefix}{name}.")

    walk(BrorlConfig)


def test_override_reaches_the_field():
    cfg = load_config("tiny-cpu", ["--learner.eps_high", "0.35", "--actor.stop=[\"\\n\"]", "--run.run_dir", "x/y"])
    assert cfg.learner.eps_high == 0.35
    assert cfg.actor.stop == ["\n"]
    assert cfg.run.run_dir == "x/y"
    assert load_config("tiny-cpu").learner.eps_high == 0.28  # preset untouched


@pytest.mark.parametrize(
    "override, field",
    [
        ({"learner.eps_high": 0.1}, "learner.eps_high"),
        ({"job.n_samples": 1}, "job.n_samples"),
        ({"learner.bogus_key": 1}, "learner.bogus_key"),
        ({"bogus_section.x": 1}, "bogus_section"),
        ({"actor.max_num_seqs": 1024}, "actor.max_num_seqs"),
        ({"learner.eps_low": "high"}, "learner.eps_low"),
        ({"actor.temperature": 0}, "actor.temperature"),
        ({"transport.host": "10.0.0.5"}, "transport.curve"),
        ({"learner.backend": "jax"}, "learner.backend"),
    ],
)
def test_bad_value_names_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config("tiny-cpu", override)
    assert field in str(e.value)


def test_one_sample_is_fine_without_dynamic_sampling():
    cfg = load_config("tiny-cpu", {"job.n_samples": 1, "learner.dynamic_sampling": False,
                                   "learner.num_minibatches": 1})
    assert cfg.job.n_samples == 1


def test_remote_host_needs_curve_or_waiver():
    assert load_config("tiny-cpu", {"transport.host": "10.0.0.5", "transport.curve": True}).transport.curve
    assert load_config("tiny-cpu", {"transport.host": "10.0.0.5", "transport.allow_insecure_remote": True})


@pytest.mark.parametrize("bad", [["learner.eps_high", "1"], ["--noval"], ["--nodot", "1"]])
def test_malformed_overrides(bad):
    with pytest.raises(ConfigError):
        parse_overrides(bad)


def test_show_roundtrips():
    cfg = load_config("brorl-1.5b", {"learner.eps_high": 0.5, **DATA, "data.eval": ["a.jsonl", "b"]})
    import tomllib

    again = validate(tomllib.loads(to_toml(cfg)))
    assert again == cfg


def test_n_b_and_k_have_one_job_wide_home_and_the_old_keys_are_refused_with_the_new_one(tmp_path):
    cfg = load_config("brorl-1.5b", {**DATA, "job.n_samples": 64})
    assert (cfg.job.n_samples, cfg.job.prompts_per_step, cfg.job.max_staleness) == (64, 128, 1)
    assert cfg.samples_per_step == 64 * 128
    for section in ("actor", "learner"):  # the roles' sections no longer hold them
        fields = type(getattr(cfg, section)).model_fields
        assert not {"n_samples", "prompts_per_step", "max_staleness"} & set(fields), section
    for old, new in (("actor.n_samples", "job.n_samples"), ("learner.prompts_per_step", "job.prompts_per_step"),
                     ("learner.max_staleness", "job.max_staleness")):
        with pytest.raises(ConfigError, match=f"{old} moved to {new}"):
            load_config("tiny-cpu", {old: 4})
    old_file = tmp_path / "mine.toml"  # a file of the old layout: refused, every moved key named at once
    old_file.write_text("[actor]\nn_samples = 32\n[learner]\nprompts_per_step = 4\nmax_staleness = 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(old_file))
    assert all(k in str(e.value) for k in ("actor.n_samples moved to job.n_samples",
                                           "learner.prompts_per_step moved to job.prompts_per_step",
                                           "learner.max_staleness moved to job.max_staleness"))


def test_missing_file_is_named():
    with pytest.raises(ConfigError, match="no-such.toml"):
        load_config("no-such.toml")


def test_cli_config_show_and_error():
    ok = subprocess.run([sys.executable, "-m", "cli", "config", "show", "--config", "prorl-1.5b",
                         "--learner.tis_cap", "3.5", "--data.train", "x.parquet"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "tis_cap = 3.5" in ok.stdout and "n_samples = 16" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "cli", "config", "show", "--learner.eps_high", "0.01"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "learner.eps_high" in bad.stderr and "Traceback" not in bad.stderr


def test_heartbeat_timeout_must_allow_a_late_heartbeat():
    with pytest.raises(ConfigError, match="transport.heartbeat_timeout_s"):
        load_config("tiny-cpu", {"transport.heartbeat_timeout_s": 1.5, "transport.heartbeat_interval_s": 1.0})


def test_nucleus_sampling_for_training_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match=r"actor.top_p \(0.95\) must be 1.0 for training.*biased"):
        load_config("tiny-cpu", {"actor.top_p": 0.95})
    assert load_config("tiny-cpu", {"actor.top_p": 1.0}).actor.top_p == 1.0


@pytest.mark.parametrize("over,why", [
    ({"learner.devices": 2}, r'learner.devices = 2 needs learner.backend = "deepspeed"'),
    ({"learner.devices": 2, "learner.backend": "deepspeed", "learner.device": "cuda:1"},
     r"learner.device 'cuda:1' names one device but learner.devices = 2"),
    ({"learner.devices": 2, "learner.backend": "deepspeed", "learner.zero_stage": 3, "run.eval_interval": 10},
     r"run.eval_interval = 10 with learner.zero_stage = 3: .*brorl eval"),
    ({"learner.devices": 8, "learner.backend": "deepspeed", "job.prompts_per_step": 1, "job.n_samples": 4,
      "learner.num_minibatches": 1}, r"a rank would get no sample of a mini-batch"),
])
def test_learner_ranks_settings_that_cannot_work_are_refused(over, why):
    with pytest.raises(ConfigError, match=why):
        load_config("tiny-cpu", over)
    ok = load_config("tiny-cpu", {"learner.devices": 2, "learner.backend": "deepspeed"})
    assert ok.learner.devices == 2


def test_liger_layer_kernels_are_refused_with_compiled_layers():
    with pytest.raises(ConfigError, match=r"learner.liger_kernels with learner.compile: torch.compile cannot trace"):
        load_config("tiny-cpu", {"learner.liger_kernels": True, "learner.compile": True})
    assert load_config("tiny-cpu", {"learner.liger_kernels": True, "learner.compile": False}).learner.liger_kernels
