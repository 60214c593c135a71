"""A scriptable learner for actor tests: real sockets and a real weight group, no training."""

from __future__ import annotations

import asyncio

import torch

from transport import wire
from transport.weights import WeightBroadcaster
from transport.ports import free_port, free_ports
from transport.zmq_transport import Endpoints, LearnerSockets
from verifiers import synthetic


class FakeLearner:
    def __init__(self, model: torch.nn.Module, backend: str = "gloo"):
        base = free_ports(3)  # actors derive the rollout and control ports from the work port (+1, +2)
        self.sockets = LearnerSockets(Endpoints("127.0.0.1", base, base + 1, base + 2))
        self.ep = self.sockets.endpoints
        self.model = model
        self.groups: list[wire.RolloutGroup] = []
        self.requests: list[tuple[float, wire.WorkRequest]] = []
        self.heartbeats: list[wire.Heartbeat] = []
        self.hellos: list[str] = []
        self.routes: dict[str, bytes] = {}  # actor id -> its connection
        self.returned: list[int] = []
        self.grant = True
        self.tasks = synthetic.generate(11, 1, "train")
        self.next_id = 0
        self.broadcaster = WeightBroadcaster(lambda: self.model.state_dict().items(), bucket_mb=1, timeout_s=60,
                                             backend=backend)  # NCCL: the model on this process's GPU
        self._tasks = [asyncio.create_task(self._work(), name="fake:work"),
                       asyncio.create_task(self._rollouts(), name="fake:rollouts")]

    @property
    def work_url(self) -> str:
        return f"tcp://127.0.0.1:{self.ep.work_port}"

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            ident, msg = await self.sockets.work.recv()
            if hasattr(msg, "actor_id"):  # the ROUTER names connections: acks go where the actor spoke last
                self.routes[msg.actor_id] = ident
            if isinstance(msg, wire.Hello):
                self.hellos.append(msg.actor_id)
                await self.sockets.answer_hello(ident, msg)
            elif isinstance(msg, wire.WorkRequest):
                self.requests.append((loop.time(), msg))
                self.returned += msg.returned
                items = []
                if self.grant:
                    for _ in range(msg.credits):
                        t = next(self.tasks)
                        items.append(wire.PromptItem(self.next_id, t.prompt, t.reference, t.verifier, t.task_id))
                        self.next_id += 1
                await self.sockets.work.send(ident, wire.WorkAssignment(items))
            elif isinstance(msg, wire.Heartbeat):
                self.heartbeats.append(msg)

    async def _rollouts(self) -> None:
        while True:
            g = await self.sockets.rollouts.recv()
            self.groups.append(g)
            if g.actor_id in self.routes:
                await self.sockets.work.send(self.routes[g.actor_id], wire.GroupAck([g.group_id]))

    async def wait_hello(self, actor_id: str, timeout_s: float = 240.0) -> None:
        """Until `actor_id` has said hello: its engine is built (an actor says hello only then), so a weight
        group it is told of next forms within the group's timeout, however long the engine took to start."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while actor_id not in self.hellos:
            if loop.time() > end:
                raise TimeoutError(f"{actor_id} said no hello within {timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    async def wait_heartbeat(self, where, what: str, timeout_s: float = 60.0) -> wire.Heartbeat:
        """The first heartbeat received (or to come within `timeout_s`) for which `where` holds; a busy machine may
        delay one by seconds, so a test waits for it rather than sleeping a fixed time."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while True:
            hit = next((h for h in self.heartbeats if where(h)), None)
            if hit is not None:
                return hit
            if loop.time() > end:
                last = self.heartbeats[-1] if self.heartbeats else None
                raise TimeoutError(f"no heartbeat {what} within {timeout_s:.0f} s; the last: {last}")
            await asyncio.sleep(0.1)

    async def wait_groups(self, n: int, timeout_s: float = 120.0, where=lambda g: True) -> list[wire.RolloutGroup]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while loop.time() < end:
            got = [g for g in self.groups if where(g)]
            if len(got) >= n:
                return got
            await asyncio.sleep(0.05)
        seen = [(g.policy_version, int(g.token_versions().min()), int(g.token_versions().max()))
                for g in self.groups[-12:] if g.tokens.size]
        stats = self.heartbeats[-1].stats if self.heartbeats else None
        raise TimeoutError(f"only {len([g for g in self.groups if where(g)])} of {n} groups arrived; "
                           f"{len(self.groups)} in all, the last (version, first token's, last token's): {seen}; "
                           f"the actor's last heartbeat: {stats}")

    async def push_weights(self, actor_ids: list[str], version: int) -> str:
        """Rendezvous with the actors, announce the version, broadcast; returns the checksum."""
        info, offsets = self.broadcaster.rendezvous_info(free_port(), [1] * len(actor_ids))
        await self.sockets.control.publish("weights", rendezvous=info, plan=self.broadcaster.plan.to_dict(),
                                           offsets=dict(zip(actor_ids, offsets)))
        await self.broadcaster.open(info)
        await self.sockets.control.publish("version", version=version)
        return await self.broadcaster.broadcast()

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.broadcaster.close()  # an NCCL group is aborted, not left to its destructor
        self.sockets.close()
