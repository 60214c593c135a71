"""One weight update from a learner-side model into a vLLM engine of this process (the GPU tests): a weight group
of two (the learner's rank and the engine's worker), one broadcast; returns (the learner's checksum, (the
version, the checksum) the engine reports)."""

import asyncio

import torch

from transport.ports import free_port
from transport.weights import WeightBroadcaster, WeightReceiver


def broadcast_into(llm, model: torch.nn.Module, backend: str, dtype: torch.dtype | None = None,
                   device: torch.device | None = None) -> tuple[str, tuple[int, str]]:
    async def sync():
        if device is not None:
            torch.cuda.set_device(device)
        bc = WeightBroadcaster(lambda: model.state_dict().items(), bucket_mb=0.5, timeout_s=60, backend=backend,
                               dtype=dtype)
        rx = WeightReceiver(llm, is_async=False)
        info, offs = bc.rendezvous_info(free_port(), [1])
        await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))
        return await asyncio.gather(bc.broadcast(), rx.receive(1))

    sent, got = asyncio.run(sync())
    return sent, got
