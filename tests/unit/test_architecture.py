"""The dependency rule of the packages holds (import-linter contracts in pyproject.toml), `config` pulls in
nothing of brorl, and modules stay small."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["cli", "fleet", "learner", "actors", "tinymodel", "evaluation", "taskdata", "transport", "verifiers", "theory",
            "config"]


def test_import_linter_contracts_are_kept():
    exe = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(exe), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_config_imports_nothing_of_brorl():
    code = ("import sys, config.loader, config.schema\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(PACKAGES) - {'config'}!r}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_learner_loop_and_actor_stay_thin():
    """The learner's top-level loop reads like the design diagram (under 30 lines); the actor is a thin set
    of loops over its collaborators (under ~250 lines)."""
    import ast

    tree = ast.parse((ROOT / "learner" / "service.py").read_text())
    train = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "train")
    assert train.end_lineno - train.lineno + 1 < 30
    assert len((ROOT / "actors" / "actor.py").read_text().splitlines()) <= 270
