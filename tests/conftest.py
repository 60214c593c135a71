"""Shared fixtures: one tiny model and one vLLM engine per test session (the engine takes ~20 s).

Tests marked `gpu` need CUDA: where none exists they are deselected (not skipped) at collection, and
the GPU machine runs them with `pytest -m gpu`.
"""

from __future__ import annotations

import os
import sys
import threading

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The test workers and every role they start (learners, actors, DeepSpeed ranks) share the machine's few cores:
# one OpenMP thread each, where several spinning OpenMP pools per core would slow every test down.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# and each module of the stack compiled to bytecode once, kept for every later process (not ~5 s again in each)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HANG_DUMP_S = 600.0  # before pytest-timeout's ceiling (pyproject.toml): what a stuck test is awaiting


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test still running after HANG_DUMP_S prints every pending asyncio task's stack (an idle event loop
    shows nothing in a thread dump); the output is shown with the failure when the timeout ends it."""
    timer = threading.Timer(HANG_DUMP_S, _dump_tasks, args=(item,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _dump_tasks(item) -> None:
    """To the terminal, past pytest's capture: a worker that then dies (a fatal signal) loses what it had
    captured."""
    import asyncio
    import gc
    import io
    import sys

    out = io.StringIO()
    print(f"\n=== {item.nodeid}: still running after {HANG_DUMP_S:.0f} s; pending asyncio tasks ===", file=out)
    for task in [o for o in gc.get_objects() if type(o) is asyncio.Task and not o.done()]:
        task.print_stack(file=out)
    with item.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        sys.stderr.write(out.getvalue())
        sys.stderr.flush()


def pytest_configure(config):
    """Every process this pytest process starts carries its pid in the environment, and a reaper process
    kills whatever of them outlives it (tests/support/reaper.py): a worker that dies of a fatal signal leaves
    no engine or learner running into the rest of the run."""
    import subprocess
    import sys

    import psutil

    from tests.support.reaper import OWNER_TAG

    missing = [f for f in LONGEST_FIRST if not (config.rootpath / f).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_FIRST names no such file: {missing}; update the list")

    me = psutil.Process()
    env = {k: v for k, v in os.environ.items() if k != OWNER_TAG}
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():  # its word on what it killed goes to the terminal, not a capture
        subprocess.Popen([sys.executable, "-m", "tests.support.reaper", str(me.pid), repr(me.create_time())],
                         cwd=str(config.rootpath), env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL)
    os.environ[OWNER_TAG] = str(me.pid)


LONGEST_FIRST = [
    "tests/e2e/test_restarts.py", "tests/integration/test_train_step.py", "tests/e2e/test_actor.py",
    "tests/e2e/test_faults.py", "tests/e2e/test_user_data.py", "tests/e2e/test_ray.py", "tests/e2e/test_run.py",
    "tests/e2e/test_reproducible.py", "tests/integration/test_learner_ranks.py", "tests/e2e/test_vllm_engine.py",
    "tests/e2e/test_families.py", "tests/e2e/test_in_flight.py",
]
"""The test files that take minutes, longest first. `.ci/test` hands files to its workers in collection order
(`--no-loadscope-reorder`): the long ones first, so that no worker draws one at the end while the other idles."""
TIER_ORDER = ["tests/e2e/", "tests/integration/", "tests/unit/"]
"""Then the other files, slower tiers first: the quick unit files fill in at the end."""


def _run_order(item) -> tuple[int, int]:
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(path))
    return (1, next((i for i, t in enumerate(TIER_ORDER) if path.startswith(t)), len(TIER_ORDER)))


def pytest_collection_modifyitems(config, items):
    # a stable sort on the file alone: each file's tests stay together and in their order
    items.sort(key=_run_order)
    if _has_cuda():
        return
    gpu = [it for it in items if it.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [it for it in items if not it.get_closest_marker("gpu")]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from tinymodel import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0))


@pytest.fixture(scope="session")
def tiny_cfg(tiny_model_dir):
    from config.loader import load_config

    return load_config("tiny-cpu", {"model.path": tiny_model_dir, "actor.max_model_len": 64})


@pytest.fixture(scope="session")
def vllm_engine(tiny_cfg):
    """One offline vLLM engine (CPU backend) over the tiny model, shared by the whole session."""
    from actors.engine import engine_kwargs, offline_env

    offline_env()
    from vllm import LLM

    llm = LLM(**engine_kwargs(tiny_cfg.model, tiny_cfg.actor, seed=0))
    yield llm
    # shut down explicitly: left to the interpreter's exit, its engine-core and worker processes outlived
    # pytest (their finaliser ran after module teardown and failed)
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory) -> str:
    """The tiny model after its supervised warm start (as `brorl run` builds it): groups carry signal. Built
    once per run: pytest-xdist's workers share it (their temp folders have one parent), the first to need it
    builds it under a file lock while the others wait. Tests only read it."""
    import shutil

    from filelock import FileLock

    from config.loader import load_config
    from tinymodel import build_tiny_model
    from tinymodel.warm_start import warm_start

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    d, built = root / "warm-model", root / "warm-model.built"
    with FileLock(str(root / "warm-model.lock")):
        if not built.exists():
            shutil.rmtree(d, ignore_errors=True)  # a build that a killed worker left half done
            build_tiny_model(d, seed=0)
            warm_start(load_config("tiny-cpu"), d, verbose=False)
            built.touch()
    return str(d)
