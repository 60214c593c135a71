import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLES = ["run", "actor", "learner", "simulate", "eval", "make-tiny-model", "config", "sft", "keys", "verifiers"]


def brorl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True,
                          cwd=ROOT, **kw)


def test_help_imports_nothing_heavy():
    """`brorl --help` stays fast because no heavy package is imported to print it."""
    code = ("import sys; from cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'vllm', 'transformers', 'pydantic', 'zmq', 'deepspeed', 'ray')"
            " if m in sys.modules]\nprint('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("role", ROLES)
def test_every_role_answers_help(role):
    r = brorl(role, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage: brorl" in r.stdout


def test_bad_learner_address_is_named():
    r = brorl("actor", "--learner", "not-an-address")
    assert r.returncode != 0 and "--learner" in r.stderr


def test_dockerfile_roles_exist():
    """Every role the image documents (its `brorl.roles` label) is a sub-command that answers --help."""
    text = (ROOT / "Dockerfile").read_text()
    m = re.search(r'brorl\.roles="([^"]+)"', text)
    assert m, "Dockerfile documents no roles"
    assert re.search(r'ENTRYPOINT \["brorl"\]', text)
    roles = m.group(1).split()
    assert {"actor", "learner", "run"} <= set(roles)
    for role in roles:
        assert brorl(role, "--help").returncode == 0, role


def test_dockerfile_copies_every_package_and_runs_unprivileged():
    """The image installs brorl from the packages it copies: one missing from the COPY lines (as `fleet` once
    was) fails `pip install` inside the build. And the roles do not run as root."""
    import tomllib

    text = (ROOT / "Dockerfile").read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    copied = set(re.findall(r"^COPY (\w+) \1$", text, re.M))
    assert set(packages) <= copied, f"not copied into the image: {sorted(set(packages) - copied)}"
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0"), users
    assert re.search(r"^ARG BASE=", text, re.M) and re.search(r"^ARG EXTRA=", text, re.M)


def test_console_script_installed():
    exe = Path(sys.executable).parent / "brorl"
    assert exe.exists()
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and all(role in r.stdout for role in ROLES)


def test_a_code_job_where_the_sandbox_cannot_contain_refuses_to_start(tiny_model_dir, tmp_path):
    """No bubblewrap (as on a host without it): the actor's start-up self-test of the `code` verifier runs the
    real sandbox, which refuses; the actor exits with the reason (EXIT_REFUSED), `brorl run` does not restart
    it but stops the job with that reason, and no child outlives it."""
    import json
    import os

    from transport.ports import free_ports

    tasks = tmp_path / "code.jsonl"
    ref = {"tests": [{"input": "2\n", "output": "4"}]}
    tasks.write_text("".join(json.dumps({"prompt": f"Double it ({i}):", "reference": ref, "verifier": "code",
                                         "id": f"c{i}"}) + "\n" for i in range(20)))
    port = free_ports(3)
    r = brorl("run", "--no-eval", "--model.path", tiny_model_dir, "--run.run_dir", str(tmp_path / "run"),
              "--data.train", str(tasks), "--learner.steps", "2", "--transport.work_port", str(port),
              "--transport.rollout_port", str(port + 1), "--transport.control_port", str(port + 2),
              env={**os.environ, "BRORL_BWRAP": "/nonexistent/bwrap"}, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 78, out[-3000:]
    assert "actor-0 refused to start" in out and "verifier 'code' failed its start-up self-test" in out, out[-3000:]
    assert "bubblewrap (bwrap) is not installed" in out and "verifiers.sandbox_unsafe" in out
    assert "restarting it" not in out
    log = (tmp_path / "run" / "logs" / "actor-0.log").read_text()
    assert "refuses to start" in log


def test_the_compose_file_places_each_role_on_its_own_gpu_with_real_settings():
    """compose.yaml (one host, 4 GPUs): every service runs the one image with the keys read-only; the
    learner and each actor get GPUs of their own; each command parses as that role's (its flags are real
    config fields, through the CLI's own parser and loader), and every actor reaches the learner's work
    port under an id of its own."""
    import shlex

    import yaml

    from cli import build_parser
    from cli.common import load

    spec = yaml.safe_load((ROOT / "compose.yaml").read_text())
    env = {"BRORL_CONFIG": "brorl-1.5b"}
    sub = lambda s: re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m[1], m[2]), s)  # noqa: E731
    gpus, ids, cfgs = [], [], {}
    for name, svc in spec["services"].items():
        assert sub(svc["image"]) == "brorl:gpu" and svc["network_mode"] == "host"
        assert any(sub(v).endswith(":/keys:ro") for v in svc["volumes"]), name
        gpus += svc["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        argv = shlex.split(sub(svc["command"]))
        args, rest = build_parser().parse_known_args(argv)
        assert args.command == ("learner" if name == "learner" else "actor"), name
        cfgs[name] = load(args, rest)
        if name != "learner":
            ids.append(args.actor_id)
            assert args.learner_addr == f"tcp://127.0.0.1:{cfgs[name].transport.work_port}"
    assert sorted(gpus) == ["0", "1", "2", "3"] and len(ids) == len(set(ids)) == 3
    assert cfgs["learner"].transport.curve and cfgs["learner"].learner.device == "cuda"
