"""The newcomer trial: the README's "your model, your data" path with data in the four layouts users bring
(verl Parquet, OpenRLHF JSONL, a DeepScaleR JSON list, a save_to_disk folder), and the mistakes a newcomer
makes on the way. Each mistake is refused by `brorl run` (in-process through `cli.main`: the pre-flight and
the config loader stop it before any role starts) in ONE console line that names the cause, without a
traceback, and nothing is lost: the data files are unchanged and no run folder is left behind. One mistake
goes through a real `python -m cli run` process. No engine is started: `cli.job.run`, which would start the
roles, is replaced by a recorder of the config it would have been given."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli import main
from tests.support import user_data

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
FREE_PORTS = ["--transport.work_port", "0", "--transport.rollout_port", "0", "--transport.control_port", "0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return user_data.four_layouts(tmp_path_factory.mktemp("newcomer-data"))


def _digest(paths) -> dict[str, str]:
    out = {}
    for p in paths:
        for f in sorted([p] if p.is_file() else p.rglob("*")):
            if f.is_file():
                out[str(f)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


@pytest.fixture
def c(tiny_model_dir, tmp_path, data, capfd, caplog, monkeypatch):
    """The newcomer's console: `c.run(*args)` is `brorl run --no-eval --model.path TINY --run.run_dir RUN
    *args` in this process; the roles are not started (`c.started` holds the config they would get). The
    newcomer's host shows no GPU, whatever the test host has."""
    import cli.job
    import cli.launcher

    monkeypatch.setattr(cli.launcher, "visible_gpus", lambda: 0)

    started: list = []
    monkeypatch.setattr(cli.job, "run", lambda cfg, **kw: started.append(cfg) or 0)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"

    def run(*args, model=tiny_model_dir, cmd=("run", "--no-eval")):
        files = [*data.values(), *tmp_path.glob("mine*")]
        before = _digest(files)
        t0 = time.monotonic()
        rc = main([*cmd, "--model.path", str(model), "--run.run_dir", str(run_dir), *args])
        took = time.monotonic() - t0
        out, err = capfd.readouterr()
        assert _digest(files) == before, "a data file changed"
        return SimpleNamespace(rc=rc, out=out, err=err, took=took)

    def refused(*args, model=tiny_model_dir) -> str:
        r = run(*args, model=model)
        lines = [ln for ln in (r.out + r.err).splitlines() if ln.strip()]
        assert r.rc == 2 and len(lines) == 1, r.out + r.err
        assert lines[0].startswith("brorl: ") and "Traceback" not in lines[0], lines[0]
        logged = [r.getMessage() for r in caplog.records if r.levelno >= 30]  # a log line reaches the console too
        assert not logged, logged
        assert not started, "a role would have started"
        assert not run_dir.exists(), "a run folder was left behind"
        assert r.took < 3.0, f"refusing took {r.took:.1f} s"
        return lines[0]

    return SimpleNamespace(run=run, refused=refused, started=started, tmp=tmp_path, data=data, model=tiny_model_dir,
                           run_dir=run_dir)


def _mine(c, name: str, content) -> str:
    """A file the newcomer wrote: text, bytes, or rows for Parquet (a list of dicts)."""
    p = c.tmp / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(content) if content else pa.table({"prompt": pa.array([], pa.string()),
                                                                              "reference": pa.array([], pa.string())}), p)
    return str(p)


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("layout", ["verl", "openrlhf", "deepscaler", "hf"])
def test_your_model_your_data_in_each_layout_reaches_the_roles(c, layout):
    """The README's path: every layout passes the pre-flight and reaches the roles with real ports; preview
    reads every row (the DeepScaleR JSON list as a list, not as JSONL). verl's chat messages need a template:
    the tiny model has none, so the newcomer gives one in a file."""
    tpl = c.tmp / "mine.jinja"
    tpl.write_text(TEMPLATE)
    extra = ["--data.chat_template", str(tpl)] if layout == "verl" else []
    r = c.run("--data.train", str(c.data[layout]), *FREE_PORTS, *extra)
    assert r.rc == 0 and "Traceback" not in r.err, r.out + r.err
    (cfg,) = c.started
    ports = [cfg.transport.work_port, cfg.transport.rollout_port, cfg.transport.control_port]
    assert 0 not in ports and len(set(ports)) == 3 and "chosen free" in r.out
    assert cfg.data.train[0].path == str(c.data[layout])
    p = c.run("--data.train", str(c.data[layout]), *extra, cmd=("data", "preview"))
    assert p.rc == 0 and ", bad 0," in p.out and "cannot be rendered for" not in p.out, p.out
    assert ("<|assistant|>" in p.out) == (layout == "verl")


def test_chat_messages_and_a_model_without_a_template_are_refused_with_the_fix(c):
    """Issue 46: preview said "used 96, bad 0" while no row rendered. Now preview counts them bad and says how
    to fix it, and `brorl run` refuses before any role starts."""
    p = c.run("--data.train", str(c.data["verl"]), cmd=("data", "preview"))
    assert p.rc == 1 and "used 0, bad 5 (5 cannot be rendered for this model)" in p.out, p.out
    assert "data.chat_template" in p.out and '"plain"' in p.out
    line = c.refused("--data.train", str(c.data["verl"]))
    assert "has no chat template" in line and "data.chat_template" in line and "verl.parquet" in line


def test_plain_rendering_of_chat_messages_and_a_template_string(c):
    """"plain" renders chat messages as their text; a Jinja string works as a file does."""
    for tpl, shown in (("plain", "What is 2+3?"), (TEMPLATE, "<|user|>What is 2+3?")):
        p = c.run("--data.train", str(c.data["verl"]), "--data.chat_template", tpl, cmd=("data", "preview"))
        assert p.rc == 0 and ", bad 0," in p.out and shown in p.out, p.out


def test_port_0_with_ray_and_a_taken_port_are_refused(c):
    line = c.refused("--data.train", str(c.data["openrlhf"]), "--transport.work_port", "0", "--cluster", "auto")
    assert "transport.work_port = 0 with --cluster" in line and "give the port" in line
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = c.refused("--data.train", str(c.data["openrlhf"]), *FREE_PORTS, "--transport.rollout_port", str(port))
    assert f"transport.rollout_port = {port}" in line and "in use" in line and "0: pick a free one" in line


def test_run_help_names_the_overrides(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--section.key VALUE" in capsys.readouterr().out


def _no_tokenizer(c) -> str:
    d = c.tmp / "model-no-tok"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(Path(c.model) / f, d / f)
    return str(d)


def _softcapped(c) -> str:
    d = c.tmp / "model-softcap"
    if not d.exists():
        shutil.copytree(c.model, d)
        conf = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**conf, "attn_logit_softcapping": 50.0}))
    return str(d)


# (what the newcomer did, their arguments (given the fixture), what the one console line must say)
MISTAKES = [
    ("unknown key on the command line", lambda c: ["--learner.total_steps", "5"],
     ["learner.total_steps: unknown key (--learner.total_steps on the command line); did you mean learner.steps?"]),
    ("unknown section", lambda c: ["--lerner.steps", "5"], ["lerner: unknown key", "did you mean learner?"]),
    ("a key in the wrong section", lambda c: ["--learner.n_samples", "5"], ["did you mean job.n_samples?"]),
    ("typo in the config file", lambda c: ["--config", _mine(c, "mine.toml", "[learner]\nstpes = 3\n")],
     ["learner.stpes: unknown key (in ", "mine.toml", "did you mean learner.steps?"]),
    ("config file that is not TOML", lambda c: ["--config", _mine(c, "mine.toml", "[learner\nsteps = 3\n")],
     ["not valid TOML"]),
    ("wrong preset name", lambda c: ["--config", "brorl-15b"], ["'brorl-15b' not found", "brorl-1.5b"]),
    ("negative batch size", lambda c: ["--job.prompts_per_step", "-4"], ["job.prompts_per_step", "greater than or equal to 1"]),
    ("N too small for dynamic sampling", lambda c: ["--job.n_samples", "1"], ["job.n_samples (1) must be >= 2"]),
    ("more mini-batches than samples", lambda c: ["--job.n_samples", "2", "--job.prompts_per_step", "1",
                                                  "--learner.num_minibatches", "4"], ["learner.num_minibatches (4) exceeds"]),
    ("a chat template file that is not there", lambda c: ["--data.chat_template", "tpl.jinja"],
     ["data.chat_template", "no file here and no Jinja template"]),
    ("data file that does not exist", lambda c: ["--data.train", "trian.parquet"], ["trian.parquet: no such file"]),
    ("empty file", lambda c: ["--data.train", _mine(c, "mine.jsonl", "")], ["mine.jsonl: the file is empty"]),
    ("parquet with no rows", lambda c: ["--data.train", _mine(c, "mine.parquet", [])], ["mine.parquet: holds no rows"]),
    ("binary garbage named .jsonl", lambda c: ["--data.train", _mine(c, "mine.jsonl", bytes(range(256)) * 4)],
     ["not a text JSON/JSONL file"]),
    ("binary garbage named .parquet", lambda c: ["--data.train", _mine(c, "mine.parquet", b"\x00garbage" * 64)],
     ["not a readable Parquet file"]),
    ("a folder instead of a file", lambda c: ["--data.train", str(c.tmp)], ["a folder, but not one written by datasets"]),
    ("a CSV file", lambda c: ["--data.train", _mine(c, "mine.csv", "prompt,answer\n1+1,2\n")], ["unknown file type '.csv'"]),
    ("a JSON list cut short", lambda c: ["--data.train", _mine(c, "mine.json", '[{"problem": "1+1", "answer": "2"},')],
     ["starts with '[' but is not a valid JSON list"]),
    ("wrong column names", lambda c: ["--data.train", _mine(c, "mine.jsonl", _jsonl([{"query": "1+1", "response": "2"}]))],
     ["no known layout fits the columns ['query', 'response']", "prompt_key and answer_key"]),
    ("a misspelt prompt_key", lambda c: ["--data.train", json.dumps([{"path": str(c.data["openrlhf"]), "layout": "custom",
                                                                       "prompt_key": "inptu", "answer_key": "label"}])],
     ["no usable train row", "inptu: missing"]),
    ("missing reference column", lambda c: ["--data.train", _mine(c, "mine.parquet", [
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "1+1?"}]}])],
     ["no known layout fits the columns ['data_source', 'prompt']"]),
    ("empty prompt inside chat messages", lambda c: ["--data.train", _mine(c, "mine.jsonl", _jsonl([
        {"prompt": [{"role": "user", "content": "  "}], "reward_model": {"ground_truth": "2"}, "data_source": "gsm8k"}]))],
     ["no usable train row", "the last user message is empty"]),
    ("unknown verifier", lambda c: ["--data.train", json.dumps([{"path": str(c.data["openrlhf"]), "verifier": "maths"}])],
     ["no usable train row", "no verifier named 'maths'"]),
    ("a data source no verifier maps", lambda c: ["--data.train", _mine(c, "mine.jsonl", _jsonl([
        {"input": "1+1", "label": "2", "datasource": "mystery"}]))], ["no verifier for data source 'mystery'",
                                                                     "data.verifier_map"]),
    ("prompts longer than the context", lambda c: ["--data.train", _mine(c, "mine.jsonl", _jsonl([
        {"input": "What is 2+3? " * 200, "label": "5", "datasource": "gsm8k"}]))],
     ["none of the first", "raise actor.max_model_len"]),
    ("unknown procedural task", lambda c: ["--verifiers.task", "arithmetics"], ["verifiers.task", "unknown task spec"]),
    ("model folder that does not exist", lambda c: ["--data.train", str(c.data["openrlhf"]), "--model.path", "~/models/nope"],
     ["'~/models/nope': no such folder", "config.json"]),
    ("model folder without a tokenizer", lambda c: ["--data.train", str(c.data["openrlhf"]), "--model.path", _no_tokenizer(c)],
     ["no tokenizer", "copy the tokenizer's files"]),
    ("a model file instead of its folder", lambda c: ["--data.train", str(c.data["openrlhf"]),
                                                      "--model.path", str(Path(c.model) / "model.safetensors")],
     ["a file, not a folder"]),
    ("two sockets on one port", lambda c: ["--data.train", str(c.data["openrlhf"]), "--transport.work_port", "0",
                                           "--transport.rollout_port", "7001", "--transport.control_port", "7001"],
     ["transport.rollout_port and transport.control_port are both 7001"]),
    ("a run folder that is a file", lambda c: ["--data.train", str(c.data["openrlhf"]), *FREE_PORTS,
                                               "--run.run_dir", _mine(c, "mine.txt", "x")], ["a file, not a folder"]),    ("packed passes for a model that caps its attention logits", lambda c: [
        "--data.train", str(c.data["openrlhf"]), "--model.path", _softcapped(c), "--learner.packing", "true"],
     ["learner.packing: the model at", "attn_logit_softcapping = 50.0", "set --learner.packing false"]),
    ("a GPU job on a machine without one", lambda c: ["--data.train", str(c.data["openrlhf"]), "--learner.device", "cuda"],
     ["GPU placement", "this host shows no GPU"]),
]


@pytest.mark.parametrize("what,args,says", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_newcomers_mistake_is_refused_in_one_line_before_any_role_starts(c, what, args, says):
    line = c.refused(*args(c))
    for s in says:
        assert s in line, f"{what}: {s!r} not in {line!r}"


def test_a_real_brorl_run_refuses_binary_garbage_in_seconds(tiny_model_dir, tmp_path):
    """The console of a real `python -m cli run` process: exit 2, one line on stderr, nothing written."""
    bad = tmp_path / "train.jsonl"
    bad.write_bytes(bytes(range(256)) * 8)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "cli", "run", "--model.path", tiny_model_dir, "--data.train", str(bad),
                        "--run.run_dir", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert "train.jsonl: not a text JSON/JSONL file" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists() and bad.read_bytes() == bytes(range(256)) * 8
    assert time.monotonic() - t0 < 30


def test_an_actors_refusal_reaches_the_console_once(tiny_cfg, tmp_path):
    """The launcher's refusal line carries the actor's reason once ("actor-0 refused to start: actor actor-0
    refuses to start: ..." was the doubled form)."""
    from cli.launcher import Launcher

    la = Launcher(tiny_cfg.model_copy(update={"run": tiny_cfg.run.model_copy(update={"run_dir": str(tmp_path)})}), gpus=0)
    la.logs.mkdir(parents=True)
    (la.logs / "actor-0.log").write_text("2026-01-01 00:00:00,000 brorl.actor ERROR actor actor-0 refuses to start: "
                                         "verifier 'code' failed its start-up self-test: no bwrap\n")
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(78)"])
    p.wait()
    la.procs["actor-0"], la._started_at["actor-0"] = p, time.monotonic()
    la._supervise_actors()
    assert la.refused == ("actor-0 refused to start: verifier 'code' failed its start-up self-test: no bwrap; "
                          "stopping the job")


def test_a_template_file_reaches_the_roles_as_text(tmp_path):
    """The template file is read at load: the run folder's config.toml (what every role loads) holds its text,
    newlines and quotes included, and loads back to the same template."""
    import tomllib

    from config.loader import load_config, to_toml, validate

    tpl = tmp_path / "mine.jinja"
    tpl.write_text(TEMPLATE + '\n{{ "a \\"quoted\\" tail" }}\n')
    cfg = load_config("tiny-cpu", {"data.chat_template": str(tpl)})
    assert cfg.data.chat_template == tpl.read_text()
    assert validate(tomllib.loads(to_toml(cfg))).data.chat_template == tpl.read_text()


def test_an_actor_without_the_learners_port_is_refused(capfd):
    with pytest.raises(SystemExit) as e:
        main(["actor", "--transport.work_port", "0"])
    err = capfd.readouterr().err
    assert e.value.code == 2 and "transport.work_port = 0 names no learner port" in err and "--learner" in err
