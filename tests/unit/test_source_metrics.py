"""Per data source, per step: reward, accuracy, the share dynamic sampling kept, truncation, and for code the
programs run / passed / timed out; in the metrics row, and on the live panel (the step line says "kept")."""

import dataclasses

import numpy as np

from cli.display import source_lines, step_line
from learner.batching import Batcher
from tests.support.transport_helpers import make_group


def _group(pid, correct, verifier="synthetic", finish=None, reasons=()):
    n = len(correct)
    g = make_group(f"a:0:{pid}", n=n, seed=pid)
    return dataclasses.replace(g, verifier=verifier, correct=np.array(correct, np.uint8),
                               rewards=np.array(correct, np.float32), reasons=list(reasons),
                               finish=np.array(finish or [0] * n, np.uint8))


def test_each_data_source_has_its_own_rewards_kept_share_truncation_and_programs():
    source = {1: "openai/gsm8k", 2: "openai/gsm8k", 3: "codecontests"}
    b = Batcher(4, dynamic_sampling=True, source_of=source.get)
    b.add(_group(1, [1, 0, 0, 0], finish=[0, 1, 1, 0]))  # kept; two cut at max_tokens
    b.add(_group(2, [1, 1, 1, 1]))  # all correct: dropped
    b.add(_group(3, [1, 0, 0, 0], "code", reasons=["all tests passed", "0/2 passed; timeout", "no program",
                                                   "1/2 passed; wrong output"]))
    b.add(_group(4, [0, 0], "code"))  # a prompt the learner cannot name: its verifier stands for the source
    m = b.take_stats()
    assert m["rollout_reward/openai/gsm8k"] == m["rollout_accuracy/openai/gsm8k"] == 5 / 8
    assert m["kept/openai/gsm8k"] == 0.5 and m["truncated/openai/gsm8k"] == 0.25 and m["samples/openai/gsm8k"] == 8
    assert "programs_run/openai/gsm8k" not in m
    assert (m["programs_run/codecontests"], m["programs_passed/codecontests"], m["programs_timed_out/codecontests"]) \
        == (3, 1, 1)
    assert m["kept/codecontests"] == 1.0 and m["kept/code"] == 0.0 and m["samples/code"] == 2
    assert not any("/" in k for k in b.take_stats())  # counted afresh each step
    lines = source_lines({**m, "step": 1})
    assert len(lines) == 3 and lines[0].split()[:3] == ["code", "reward", "0.000"]
    assert "programs run 3 passed 1 timed out 1" in lines[1] and "kept 0.50  truncated 0.25" in lines[2]
    assert source_lines({"rollout_reward/synthetic": 0.5}) == []  # one source: the totals say it all
    assert "kept 0.50" in step_line({"step": 1, "pass_rate": 0.5}, 5)
