"""The engine-core scheduler that sends a FINAL_ONLY request's log-probs once, at its end
(actors/vllm_scheduler.py): its bookkeeping over a scripted base scheduler (the real one runs in
tests/e2e/test_vllm_engine.py, against vLLM's per-step delivery)."""

from dataclasses import dataclass, field

import numpy as np
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.outputs import LogprobsLists

from actors import vllm_scheduler
from actors.vllm_scheduler import PER_STEP, _HoldLogprobs, holds

FIN = RequestOutputKind.FINAL_ONLY


@dataclass
class Out:
    request_id: str
    new_logprobs: LogprobsLists | None
    finish_reason: str | None = None


@dataclass
class Outs:
    outputs: list = field(default_factory=list)


@dataclass
class Req:
    sampling_params: SamplingParams


class ScriptedScheduler:
    """What the mixin needs of vLLM's scheduler: `requests`, `update_from_output`, `finish_requests`."""

    def __init__(self):
        self.requests: dict[str, Req] = {}
        self.script: list[Outs] = []

    def update_from_output(self, scheduler_output, model_runner_output):
        outs = self.script.pop(0)
        for o in outs.outputs:
            if o.finish_reason is not None:
                self.requests.pop(o.request_id, None)  # vLLM frees a finished request inside this call
        return {0: outs}

    def finish_requests(self, request_ids, finished_status):
        for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids or self.requests):
            self.requests.pop(rid, None)


class Sched(_HoldLogprobs, ScriptedScheduler):
    pass


def lp(*values):
    v = np.array(values, np.float32)[:, None]
    return LogprobsLists(np.arange(len(values), dtype=np.int64)[:, None], v, np.zeros(len(values), np.int64))


def step(s, *outs):
    s.script.append(Outs(list(outs)))
    return s.update_from_output(None, None)[0].outputs


def test_holds_only_final_only_requests_without_stop_strings_that_asked_for_logprobs():
    assert holds(SamplingParams(logprobs=0, output_kind=FIN))
    assert not holds(SamplingParams(logprobs=None, output_kind=FIN))
    assert not holds(SamplingParams(logprobs=0, output_kind=RequestOutputKind.CUMULATIVE))
    assert not holds(SamplingParams(logprobs=0, output_kind=RequestOutputKind.DELTA))
    assert not holds(SamplingParams(logprobs=0, output_kind=FIN, stop=["\n\n"]))
    assert not holds(SamplingParams(logprobs=0, output_kind=FIN, extra_args={PER_STEP: True}))
    assert not holds(None)


def test_log_probs_are_held_and_sent_whole_with_the_final_output():
    s = Sched()
    s.requests = {"a": Req(SamplingParams(logprobs=0, output_kind=FIN)),
                  "b": Req(SamplingParams(logprobs=0, output_kind=RequestOutputKind.CUMULATIVE))}
    o = step(s, Out("a", lp(-1.0)), Out("b", lp(-5.0)))
    assert o[0].new_logprobs is None  # held
    assert o[1].new_logprobs.logprobs.tolist() == [[-5.0]]  # streaming: passed through
    o = step(s, Out("a", lp(-2.0, -3.0)), Out("b", lp(-6.0)))
    assert o[0].new_logprobs is None
    o = step(s, Out("a", lp(-4.0), finish_reason="length"))
    assert o[0].new_logprobs.logprobs[:, 0].tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert o[0].new_logprobs.logprob_token_ids[:, 0].tolist() == [0, 0, 1, 0]
    assert o[0].new_logprobs.sampled_token_ranks.shape == (4,)
    assert "a" not in s._held


def test_a_request_ending_at_its_first_step_passes_through():
    s = Sched()
    s.requests = {"a": Req(SamplingParams(logprobs=0, output_kind=FIN))}
    o = step(s, Out("a", lp(-1.0), finish_reason="length"))
    assert o[0].new_logprobs.logprobs.tolist() == [[-1.0]] and not s._held


def test_long_requests_are_compacted(monkeypatch):
    monkeypatch.setattr(vllm_scheduler, "COMPACT_EVERY", 4)
    s = Sched()
    s.requests = {"a": Req(SamplingParams(logprobs=0, output_kind=FIN))}
    for i in range(9):
        step(s, Out("a", lp(-float(i))))
        assert len(s._held["a"]) <= 4
    o = step(s, Out("a", lp(-9.0), finish_reason="stop"))
    assert o[0].new_logprobs.logprobs[:, 0].tolist() == [-float(i) for i in range(10)]


def test_aborted_and_vanished_requests_leave_nothing_held():
    s = Sched()
    s.requests = {r: Req(SamplingParams(logprobs=0, output_kind=FIN)) for r in "abc"}
    step(s, Out("a", lp(-1.0)), Out("b", lp(-1.0)), Out("c", lp(-1.0)))
    assert set(s._held) == {"a", "b", "c"}
    s.finish_requests("a", None)
    s.finish_requests(["b"], None)
    assert set(s._held) == {"c"}
    del s.requests["c"]  # freed without an output (e.g. an abort some other way)
    step(s)
    assert not s._held
    s.requests = {"d": Req(SamplingParams(logprobs=0, output_kind=FIN))}
    step(s, Out("d", lp(-1.0)))
    s.finish_requests(None, None)  # abort all
    assert not s._held
