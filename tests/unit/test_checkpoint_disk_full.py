"""A checkpoint save that meets a full disk: the space it took is given back, the previous checkpoint stays
the latest, and a scheduled save's failure is an error the job survives until it repeats."""

import asyncio
import errno
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from learner.checkpoint import Checkpointer
from learner.service import MAX_FAILED_SAVES, LearnerService


def _state(step: int) -> dict:
    return {"meta": {"step": step, "version": step}, "optimizer": {"m": torch.zeros(4)}}


def _model(d: Path) -> None:
    d.mkdir()
    (d / "config.json").write_text(json.dumps({}))


def _full(d: Path) -> None:
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_save_on_a_full_disk_gives_its_space_back_and_keeps_the_last_checkpoint(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.save(_state(10), _model)
    with pytest.raises(OSError):
        ck.save(_state(20), _full)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step-000010"]
    assert ck.latest().step == 10


def test_scheduled_saves_that_fail_are_survived_until_they_fail_in_a_row(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.save(_state(10), _model)
    outcome = {"ok": False}

    synced = []

    def save_checkpoint(state):
        assert state == {"taken on the event loop's thread": True}
        assert synced[-1] == svc.version  # the metrics rows of the steps it holds are on the disk first
        return ck.save(_state(svc.version), _model if outcome["ok"] else _full)

    svc = SimpleNamespace(cfg=SimpleNamespace(learner=SimpleNamespace(checkpoint_interval=10, steps=1000),
                                              run=SimpleNamespace(run_dir=str(tmp_path))),
                          metrics=SimpleNamespace(sync=lambda: synced.append(svc.version)),
                          version=20, ckpt=ck, _failed_saves=0, save_checkpoint=save_checkpoint,
                          state_dict=lambda: {"taken on the event loop's thread":
                                              threading.current_thread() is threading.main_thread()})
    due = LearnerService.checkpoint_if_due
    asyncio.run(due(svc))  # step 20: fails, the job goes on
    assert svc._failed_saves == 1 and ck.latest().step == 10
    svc.version, outcome["ok"] = 30, True
    asyncio.run(due(svc))  # the disk has room again: saved, the count starts afresh
    assert svc._failed_saves == 0 and ck.latest().step == 30
    outcome["ok"] = False
    for n in range(1, MAX_FAILED_SAVES):
        svc.version += 10
        asyncio.run(due(svc))
        assert svc._failed_saves == n
    svc.version += 10
    with pytest.raises(RuntimeError, match=f"{MAX_FAILED_SAVES} checkpoint saves in a row failed"):
        asyncio.run(due(svc))  # in a row: the job stops with the reason
    svc._failed_saves = 0
    with pytest.raises(OSError):
        asyncio.run(due(svc, force=True))  # a forced save (the stop's) is never passed over
    assert ck.latest().step == 30
