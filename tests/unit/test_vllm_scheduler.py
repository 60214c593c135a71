"""The engine-core scheduler that sends a FINAL_ONLY request's log-probs once, at its end
(actors/vllm_scheduler.py): its bookkeeping over a scripted base scheduler (the real one runs in
tests/e2e/test_vllm_engine.py, against vLLM's per-step delivery)."""

from dataclasses import dataclass, field

import numpy as np
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.outputs import LogprobsLists

from actors.vllm_scheduler import PER_STEP, _HoldLogprobs, holds

FIN = RequestOutputKind.FINAL_ONLY


@dataclass
class Out:
    """An EngineCoreOutput as the mixin sees it (`lp`: this request's rows of the step's batch arrays)."""
    request_id: str
    lp: LogprobsLists | None
    finish_reason: str | None = None
    new_logprobs: LogprobsLists | None = None

    @property
    def new_token_ids(self):
        return [] if self.lp is None else self.lp.logprob_token_ids[:, 0].tolist()


@dataclass
class Outs:
    outputs: list = field(default_factory=list)


@dataclass
class Req:
    sampling_params: SamplingParams
    request_id: str = ""


@dataclass
class RunnerOutput:
    """A ModelRunnerOutput's fields the mixin reads: the step's batch log-probs and each request's row."""
    logprobs: LogprobsLists | None
    req_id_to_index: dict


class ScriptedScheduler:
    """What the mixin needs of vLLM's scheduler: `requests`, `add_request`, `update_from_output` (which
    slices a request's log-probs out of the batch arrays as vLLM does, if the batch arrays are there),
    `finish_requests`."""

    def __init__(self):
        self.requests: dict[str, Req] = {}
        self.script: list[Outs] = []
        self.sliced = 0

    def add_request(self, request):
        self.requests[request.request_id] = request

    def update_from_output(self, scheduler_output, model_runner_output):
        outs = self.script.pop(0)
        for o in outs.outputs:
            req = self.requests.get(o.request_id)
            if model_runner_output.logprobs and req is not None and req.sampling_params.logprobs is not None:
                self.sliced += 1
                o.new_logprobs = model_runner_output.logprobs.slice_request(
                    model_runner_output.req_id_to_index[o.request_id], len(o.new_token_ids))
            if o.finish_reason is not None:
                self.requests.pop(o.request_id, None)  # vLLM frees a finished request inside this call
        return {0: outs}

    def finish_requests(self, request_ids, finished_status):
        for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids or self.requests):
            self.requests.pop(rid, None)


class Sched(_HoldLogprobs, ScriptedScheduler):
    pass


def lp(*values, tokens=None):
    """One request's log-probs of a step (its tokens 0, 1, ... unless given; rank 1 each)."""
    v = np.array(values, np.float32)[:, None]
    t = np.arange(len(values)) if tokens is None else np.array(tokens)
    return LogprobsLists(t.astype(np.int32)[:, None], v, np.ones(len(values), np.int64))


def step(s, *outs):
    """A step whose batch holds `outs` in this order: a row per request, or (when some request has another
    number of tokens) each request's rows one after another, as vLLM lays out several tokens per request
    with `cu_num_generated_tokens`."""
    s.script.append(Outs(list(outs)))
    parts = [o.lp for o in outs if o.lp is not None]
    index, cu, at = {}, [], 0
    for o in outs:
        if o.lp is not None:
            index[o.request_id] = len(cu)
            cu.append(at)
            at += len(o.lp.logprobs)
    batch = None
    if parts:
        batch = LogprobsLists(np.concatenate([p.logprob_token_ids for p in parts]),
                              np.concatenate([p.logprobs for p in parts]),
                              np.concatenate([p.sampled_token_ranks for p in parts]),
                              None if all(len(p.logprobs) == 1 for p in parts) else cu)
    return s.update_from_output(None, RunnerOutput(batch, index))[0].outputs


def add(s, rid, **kw):
    s.add_request(Req(SamplingParams(**kw), rid))


def test_holds_only_final_only_requests_without_stop_strings_that_asked_for_logprobs():
    assert holds(SamplingParams(logprobs=0, output_kind=FIN))
    assert not holds(SamplingParams(logprobs=None, output_kind=FIN))
    assert not holds(SamplingParams(logprobs=3, output_kind=FIN))  # top-k: vLLM's delivery
    assert not holds(SamplingParams(logprobs=0, output_kind=RequestOutputKind.CUMULATIVE))
    assert not holds(SamplingParams(logprobs=0, output_kind=RequestOutputKind.DELTA))
    assert not holds(SamplingParams(logprobs=0, output_kind=FIN, stop=["\n\n"]))
    assert not holds(SamplingParams(logprobs=0, output_kind=FIN, extra_args={PER_STEP: True}))
    assert not holds(None)


def test_log_probs_are_held_and_sent_whole_with_the_final_output():
    s = Sched()
    add(s, "a", logprobs=0, output_kind=FIN)
    add(s, "b", logprobs=0, output_kind=RequestOutputKind.CUMULATIVE)
    add(s, "c", output_kind=FIN)  # no log-probs asked
    o = step(s, Out("a", lp(-1.0, tokens=[7])), Out("c", lp(-9.0)), Out("b", lp(-5.0)))
    assert o[0].new_logprobs is None and o[1].new_logprobs is None  # held; not asked
    assert o[2].new_logprobs.logprobs.tolist() == [[-5.0]]  # streaming: its own rows, as vLLM slices them
    o = step(s, Out("b", lp(-6.0)), Out("a", lp(-2.0, -3.0, tokens=[8, 9])))  # rows in another order
    assert o[1].new_logprobs is None and o[0].new_logprobs.logprobs.tolist() == [[-6.0]]
    o = step(s, Out("a", lp(-4.0, tokens=[10]), finish_reason="length"))
    got = o[0].new_logprobs
    assert got.logprobs[:, 0].tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert got.logprob_token_ids[:, 0].tolist() == [7, 8, 9, 10] and got.logprob_token_ids.dtype == np.int32
    assert got.sampled_token_ranks.tolist() == [1, 1, 1, 1] and got.logprobs.dtype == np.float32
    assert got.cu_num_generated_tokens is None
    assert "a" not in s._held and s.sliced == 0  # vLLM itself never sliced a step


def test_a_request_ending_at_its_first_step_passes_through():
    s = Sched()
    add(s, "a", logprobs=0, output_kind=FIN)
    o = step(s, Out("a", lp(-1.0), finish_reason="length"))
    assert o[0].new_logprobs.logprobs.tolist() == [[-1.0]] and not s._held


def test_a_prefill_step_without_a_token_holds_nothing_and_float32_values_survive_exactly():
    s = Sched()
    add(s, "a", logprobs=0, output_kind=FIN)
    add(s, "b", logprobs=0, output_kind=FIN)
    odd = np.float32(-0.123456789)
    o = step(s, Out("a", LogprobsLists(np.zeros((0, 1), np.int32), np.zeros((0, 1), np.float32),
                                       np.zeros(0, np.int64))), Out("b", lp(float(odd))))
    assert len(s._held["a"].logprobs) == 0 and len(s._held["b"].logprobs) == 1
    o = step(s, Out("b", lp(-2.0), finish_reason="stop"))
    assert o[0].new_logprobs.logprobs[0, 0] == odd  # float32 → Python float → float32 is exact


def test_a_held_request_ending_in_a_step_without_log_probs_still_gets_its_own():
    s = Sched()
    add(s, "a", logprobs=0, output_kind=FIN)
    step(s, Out("a", lp(-1.0, tokens=[5])))
    o = step(s, Out("a", None, finish_reason="abort"))  # no rows for it in this step's batch
    assert o[0].new_logprobs.logprobs[:, 0].tolist() == [-1.0] and not s._held
    assert o[0].new_logprobs.logprob_token_ids.dtype == np.int32


def test_aborted_and_vanished_requests_leave_nothing_held():
    s = Sched()
    for r in "abc":
        add(s, r, logprobs=0, output_kind=FIN)
    add(s, "p", logprobs=0, output_kind=RequestOutputKind.DELTA)
    step(s, Out("a", lp(-1.0)), Out("b", lp(-1.0)), Out("c", lp(-1.0)), Out("p", lp(-1.0)))
    assert set(s._held) == {"a", "b", "c"} and s._per_step == {"p"}
    s.finish_requests("a", None)
    s.finish_requests(["b", "p"], None)
    assert set(s._held) == {"c"} and not s._per_step
    del s.requests["c"]  # freed without an output (e.g. an abort some other way)
    step(s)
    assert not s._held
    add(s, "d", logprobs=0, output_kind=FIN)
    step(s, Out("d", lp(-1.0)))
    s.finish_requests(None, None)  # abort all
    assert not s._held
