"""Shared fixtures: one tiny model and one vLLM engine per test session (the engine takes ~20 s).

Tests marked `gpu` need CUDA: where none exists they are deselected (not skipped) at collection, and
the GPU machine runs them with `pytest -m gpu`.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
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
    del llm


@pytest.fixture(scope="session")
def warm_model_dir(tmp_path_factory) -> str:
    """The tiny model after its supervised warm start (as `brorl run` builds it): groups carry signal."""
    from config.loader import load_config
    from tinymodel import build_tiny_model
    from tinymodel.warm_start import warm_start

    d = build_tiny_model(tmp_path_factory.mktemp("warm-model"), seed=0)
    warm_start(load_config("tiny-cpu"), d, verbose=False)
    return str(d)
