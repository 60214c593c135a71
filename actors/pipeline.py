"""One prompt end to end: wait for usable weights, generate N completions, score them, send the group.

`GroupPipeline.run` returns False when the prompt must go back to the learner (aborted by a weight update
or an engine restart) and True when the group was sent or dropped for good (a verifier failure under
`verifiers.on_error = "drop"`, counted; or begun before a learner restart). Exceptions propagate: the actor decides whether the engine died.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from actors.engine import CompletionTexts, build_group, request_max_tokens, request_seed, sampling_params
from actors.in_flight import TokenVersions
from actors.scoring import ScoringPool, verifier_failed
from actors.stats import ActorStats, EngineLoad
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
        self.era = 0
        """Bumped when the learner restarts: a group begun before that is not sent (its prompt and its
        weights version belong to the old learner)."""

    async def run(self, rid: str, item: wire.PromptItem, sender: RolloutSender) -> bool:
        from vllm.sampling_params import RequestOutputKind

        a = self.cfg.actor
        while not self.sync.has_weights():  # never generate while weights are being loaded (or before a
            await asyncio.sleep(0.01)  # rebuilt engine has the learner's weights)
        version, era = self.sync.version, self.era  # no await between this check and begin(): atomic
        t0 = time.monotonic()
        self.load.begin()
        self.versions.begin(rid, version)
        final = None
        try:
            sp = sampling_params(a, self.cfg.job.n_samples, output_kind=RequestOutputKind.FINAL_ONLY,
                                 max_tokens=request_max_tokens(a, self.cfg.run.seed, item.prompt_id),
                                 **({"seed": request_seed(self.cfg.run.seed, item.prompt_id)}
                                    if self.cfg.run.reproducible else {}),
                                 **self.texts.request_kwargs())
            prompt = {"prompt_token_ids": item.prompt_token_ids} if item.prompt_token_ids else item.prompt
            async for out in self.supervisor.engine.generate(prompt, sp, rid):
                final = out
        except BaseException:
            self.versions.forget(rid)
            raise
        finally:
            self.load.end()
        outs = final.outputs if final is not None else []
        if len(outs) != self.cfg.job.n_samples or any(o.finish_reason == "abort" for o in outs):
            self.versions.forget(rid)
            self.stats.aborted += 1
            return False
        versions = self.versions.end(rid, np.fromiter((len(o.token_ids) for o in outs), np.int64, len(outs)),
                                     [o.index for o in outs])
        t1 = time.monotonic()
        path = self.verifiers.path(item.verifier)
        scored = None if path is None else await self.pool.score_answers(
            path, self.verifiers.get(item.verifier).version, self.texts(outs), item.reference, self.cfg.data)
        self.stats.score_s += time.monotonic() - t1
        if era != self.era:
            return True  # the learner restarted meanwhile: nobody wants this group any more
        if scored is None or (self.cfg.verifiers.on_error == "drop" and verifier_failed(scored)):
            self.stats.errors.append(f"prompt {item.prompt_id}: verifier failure, group dropped")
            return True
        group = build_group(sender.next_group_id(), item, self.actor_id, version, final, scored,
                            {"generate": t1 - t0, "score": time.monotonic() - t1}, versions)
        await sender.send(group)
        self.stats.groups_sent += 1
        self.stats.samples += group.n
        self.stats.tokens += int(group.lengths.sum())
        return True
