"""A vLLM engine of this process against a learner-side model (the GPU tests): one weight update into the engine
(`broadcast_into`), and the gap between the engine's behaviour log-probs and the model's (`behaviour_gap`)."""

import asyncio

import torch

from transport.ports import free_port
from transport.weights import WeightBroadcaster, WeightReceiver


def broadcast_into(llm, model: torch.nn.Module, backend: str, dtype: torch.dtype | None = None,
                   device: torch.device | None = None) -> tuple[str, tuple[int, str]]:
    """A weight group of two (the learner's rank and the engine's worker), one broadcast; returns (the learner's
    checksum, (the version, the checksum) the engine reports)."""
    async def sync():
        if device is not None:
            torch.cuda.set_device(device)
        bc = WeightBroadcaster(lambda: model.state_dict().items(), bucket_mb=0.5, timeout_s=60, backend=backend,
                               dtype=dtype, device=device)
        rx = WeightReceiver(llm, is_async=False)
        info, offs = bc.rendezvous_info(free_port(), [1])
        await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))
        return await asyncio.gather(bc.broadcast(1), rx.receive(1))

    sent, got = asyncio.run(sync())
    return sent, got


def behaviour_gap(llm, model: torch.nn.Module, prompts: list[str], params, device: torch.device | str = "cpu"):
    """log μ − log π of every token the engine samples for `prompts` (μ: the engine's behaviour log-prob, π: `model`'s)."""
    from learner.logprobs import pack, token_logprobs

    outs = llm.generate(prompts, params, use_tqdm=False)
    P, C, B = [], [], []
    for o in outs:
        for c in o.outputs:
            P.append(list(o.prompt_token_ids))
            C.append(list(c.token_ids))
            B.append([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)])
    b = pack(P, C, device=device)
    with torch.no_grad():
        lp, _ = token_logprobs(model, b)
    mu = torch.zeros_like(lp).masked_scatter(b.mask, torch.tensor([x for r in B for x in r], device=device))
    return (mu - lp)[b.mask]
