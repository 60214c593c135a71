"""One prompt end to end: wait for usable weights, generate N completions, score them, send the group.

`GroupPipeline.run` returns False when the prompt must go back to the learner (aborted by a weight update
or an engine restart) and True when the group was sent or dropped for good (a verifier failure under
`verifiers.on_error = "drop"`, counted; or begun before a learner restart). Exceptions propagate: the actor decides whether the engine died.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np

from actors.engine import (CompletionTexts, build_group, request_max_tokens, request_prompt, request_seed,
                           sampling_params)
from actors.in_flight import TokenVersions
from actors.scoring import ScoringPool, verifier_failed
from actors.stats import ActorStats, EngineLoad, WaveBudget
from actors.supervisor import EngineSupervisor
from actors.weight_sync import WeightSync
from config.schema import BrorlConfig
from transport import wire
from transport.actor_sockets import RolloutSender
from verifiers.registry import Registry


class GroupPipeline:
    def __init__(self, cfg: BrorlConfig, actor_id: str, supervisor: EngineSupervisor, sync: WeightSync,
                 load: EngineLoad, pool: ScoringPool, verifiers: Registry, stats: ActorStats, versions: TokenVersions):
        self.cfg, self.actor_id, self.versions = cfg, actor_id, versions
        self.texts = CompletionTexts(cfg.model.path, cfg.actor)
        self.supervisor, self.sync, self.load = supervisor, sync, load
        self.pool, self.verifiers, self.stats = pool, verifiers, stats
        self.budget = WaveBudget(cfg.job.step_sample_budget)
        self.era = 0
        """Bumped when the learner restarts: a group begun before that is not sent (its prompt and its
        weights version belong to the old learner)."""

    async def run(self, rid: str, item: wire.PromptItem, sender: RolloutSender) -> bool:
        era = self.era
        waves_: list[tuple[int, list, np.ndarray, list]] = []  # per wave: version, outputs, token versions, scores
        gen_s = score_s = 0.0
        n = self.cfg.job.first_wave_size()
        while n:
            if waves_ and not self.budget.fits(self.sync.version, n):
                self.stats.capped_waves += 1  # the step's budget is spent: the first wave is the group
                break
            self.budget.charge(self.sync.version, n)
            t1 = time.monotonic()
            got = await self._generate(rid, item, n, sum(len(w[1]) for w in waves_))
            if got is None:
                return False  # aborted (an update or a restart): the prompt goes back
            t2 = time.monotonic()
            version, final, versions = got
            path = self.verifiers.path(item.verifier)
            scored = None if path is None else await self.pool.score_answers(
                path, self.verifiers.get(item.verifier).version, self.texts(final.outputs), item.reference,
                self.cfg.data)
            gen_s, score_s = gen_s + t2 - t1, score_s + time.monotonic() - t2
            self.stats.score_s += time.monotonic() - t2
            if era != self.era:
                return True  # the learner restarted meanwhile: nobody wants this group any more
            if scored is None or (self.cfg.verifiers.on_error == "drop" and verifier_failed(scored)):
                self.stats.errors.append(f"prompt {item.prompt_id}: verifier failure, group dropped")
                return True
            waves_.append((version, list(final.outputs), versions, scored))
            n = self.cfg.job.next_wave_size([s.result.correct for w in waves_ for s in w[3]])
        group = build_group(sender.next_group_id(), item, self.actor_id, waves_[0][0],
                            SimpleNamespace(outputs=[o for w in waves_ for o in w[1]],
                                            prompt_token_ids=final.prompt_token_ids),
                            [s for w in waves_ for s in w[3]], {"generate": gen_s, "score": score_s},
                            joined_versions(waves_))
        await sender.send(group)
        self.stats.groups_sent += 1
        self.stats.samples += group.n
        self.stats.tokens += int(group.lengths.sum())
        return True

    async def _generate(self, rid: str, item: wire.PromptItem, n: int, done: int):
        """One wave: n completions of the prompt under the weights it starts with, `done` completions of it
        before (their sampling seeds come first under `run.reproducible`). Returns (the version it began
        under, vLLM's final output, each token's version offset) or None if it was aborted."""
        from vllm.sampling_params import RequestOutputKind

        a = self.cfg.actor
        while not self.sync.has_weights():  # never generate while weights are being loaded (or before a
            await asyncio.sleep(0.01)  # rebuilt engine has the learner's weights)
        version = self.sync.version  # no await between this check and begin(): atomic
        self.load.begin()
        self.versions.begin(rid, version)
        final = None
        try:
            sp = sampling_params(a, n, output_kind=RequestOutputKind.FINAL_ONLY,
                                 max_tokens=request_max_tokens(a, self.cfg.run.seed, item.prompt_id),
                                 **({"seed": request_seed(self.cfg.run.seed, item.prompt_id) + done}
                                    if self.cfg.run.reproducible else {}),
                                 **self.texts.request_kwargs())
            async for out in self.supervisor.engine.generate(request_prompt(a, item, version), sp, rid):
                final = out
        except BaseException:
            self.versions.forget(rid)
            raise
        finally:
            self.load.end()
        outs = final.outputs if final is not None else []
        if len(outs) != n or any(o.finish_reason == "abort" for o in outs):
            self.versions.forget(rid)
            self.stats.aborted += 1
            return None
        return version, final, self.versions.end(rid, np.fromiter((len(o.token_ids) for o in outs), np.int64, n),
                                                 [o.index for o in outs])


def joined_versions(waves_: list[tuple[int, list, np.ndarray, list]]) -> np.ndarray:
    """One group's token versions from its waves': offsets from the first wave's version (empty: all of it)."""
    start = waves_[0][0]
    if all(v == start and not len(tv) for v, _, tv, _ in waves_):
        return np.zeros(0, np.uint8)
    parts = []
    for v, outs, tv, _ in waves_:
        n = sum(len(o.token_ids) for o in outs)
        parts.append((tv if len(tv) else np.zeros(n, np.uint8)).astype(np.int64) + (v - start))
    return np.concatenate(parts).astype(np.uint8)
