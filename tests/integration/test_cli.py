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


def test_console_script_installed():
    exe = Path(sys.executable).parent / "brorl"
    assert exe.exists()
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and all(role in r.stdout for role in ROLES)
