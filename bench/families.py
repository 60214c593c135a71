"""The model-family matrix: each family's tiny model through a weight update into a CPU vLLM engine.

`python -m bench.families [NAME ...]` — for each family (`tinymodel.families`): build its tiny model, start a
CPU vLLM engine on it (the actor's engine arguments), perturb the learner's copy of the weights, push them
into the running engine through brorl's weight broadcast (`transport.weights`, as the actor receives them),
sample completions with the engine's full next-token distributions, and score the same tokens with the
learner's code (`learner.logprobs`) under the same weights. Reports the per-token KL(vLLM ‖ learner) (mean
and max over tokens, exact over the vocabulary), the largest |Δ log-prob| of a sampled token, and for a
mixture of experts the share of (token, layer) top-k expert choices on which the learner's router agrees
with the experts vLLM routed the token to. Prints a table and writes bench/results/families.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

KL_MAX = 1e-4
"""fp32: the per-token KL between the engine's and the learner's distributions, at most (each token's)."""

PROMPTS = ["3+4=", "25-7=", "12*3=", "100-1="]
N, MAX_TOKENS = 4, 24  # 4 prompts × 4 completions × 24 tokens: prompt+completion passes every sliding window


def check_family(name: str, workdir: str | Path, seed: int = 0, tokenizer=None) -> dict:
    """One family through the loop's weight path on CPU vLLM; returns its row of the matrix (see module doc)."""
    import torch
    from transformers import AutoModelForCausalLM

    from actors.engine import engine_kwargs, offline_env, sampling_params
    from config.loader import load_config
    from tinymodel.families import build_family

    t0 = time.perf_counter()
    path = build_family(name, Path(workdir) / name, seed=seed, tokenizer=tokenizer)
    moe = "moe" in name
    cfg = load_config("tiny-cpu", {"model.path": str(path), "actor.max_model_len": 64, "actor.max_num_seqs": 16,
                                   "actor.kv_cache_gib": 0.01, "actor.enforce_eager": True,
                                   # a MoE model's routing is read by running each sequence again: no cache hits
                                   "actor.enable_prefix_caching": not moe})
    offline_env()
    from vllm import LLM

    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    kw = engine_kwargs(cfg.model, cfg.actor, seed=seed)
    # the engine core and its worker in this process (vLLM's "uni" executor): the weight path (collective RPCs
    # into our worker extension, a gloo broadcast) is the actor's, without two interpreters to start per family
    # an in-process engine lowers torch's threads, pins the process and makes torch.set_num_threads a no-op
    threads, cpus, set_threads = torch.get_num_threads(), os.sched_getaffinity(0), torch.set_num_threads
    llm = None
    try:
        with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind"):
            llm = LLM(**kw, max_logprobs=vocab, distributed_executor_backend="uni")
        t_engine = time.perf_counter()
        before = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():  # the learner's update: every weight moves by its own scale
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * (p.std() if p.numel() > 1 else 1.0))
        params = sampling_params(cfg.actor, n=N, max_tokens=MAX_TOKENS, seed=seed, ignore_eos=True, logprobs=vocab,
                                 flat_logprobs=False)
        # the engine as it loaded the checkpoint, before any update: the same comparison
        at_load = _compare(before, llm.generate(PROMPTS, params, use_tqdm=False), vocab, cfg.actor.temperature,
                           llm if moe else None)
        sent, (version, got) = _broadcast(llm, model)
        assert (version, got) == (1, sent), f"{name}: the engine loaded ({version}, {got}), the learner sent {sent}"
        t_sync = time.perf_counter()
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        row = {"family": name, **_compare(model, outs, vocab, cfg.actor.temperature, llm if moe else None)}
        # the comparison is sharp: the weights before the update are far from what the engine now runs
        row.update({f"{k}_at_load": at_load[k] for k in ("kl_max", "router_agreement") if k in at_load})
        row["kl_before_update"] = _compare(before, outs, vocab, cfg.actor.temperature)["kl_mean"]
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        torch.set_num_threads = set_threads
        set_threads(threads)
        os.sched_setaffinity(0, cpus)
    t_end = time.perf_counter()
    row.update(passed=max(row["kl_max"], row["kl_max_at_load"]) <= KL_MAX < row["kl_before_update"], build_and_start_s=round(t_engine - t0, 1),
               check_at_load_and_update_s=round(t_sync - t_engine, 2), total_s=round(t_end - t0, 1))
    return row


@contextlib.contextmanager
def _env(**values: str):
    """Environment variables set for the block, restored after it."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _broadcast(llm, model) -> tuple[str, tuple[int, str]]:
    """One weight update from `model` into the running engine, as the learner and the actor do it."""
    from transport.ports import free_port
    from transport.weights import WeightBroadcaster, WeightReceiver

    async def sync():
        bc = WeightBroadcaster(lambda: model.state_dict().items(), bucket_mb=0.5, timeout_s=60)
        rx = WeightReceiver(llm, is_async=False)
        info, offs = bc.rendezvous_info(free_port(), [1])
        await asyncio.gather(bc.open(info), rx.join(info, offs[0], bc.plan.to_dict()))
        return await asyncio.gather(bc.broadcast(), rx.receive(1))

    sent, got = asyncio.run(sync())
    return sent, tuple(got)


def _compare(model, outs, vocab: int, temperature: float, llm=None) -> dict:
    import torch

    from learner.logprobs import completion_hidden, pack, token_logprobs

    P, C, mu_rows = [], [], []
    for o in outs:
        for c in o.outputs:
            P.append(list(o.prompt_token_ids))
            C.append(list(c.token_ids))
            for step in c.logprobs:  # the engine's full next-token distribution at every sampled token
                row = torch.full((vocab,), float("-inf"), dtype=torch.float64)
                row[list(step.keys())] = torch.tensor([lp.logprob for lp in step.values()], dtype=torch.float64)
                mu_rows.append(row)
    batch = pack(P, C)
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch, temperature=temperature)
        logits = model.get_output_embeddings()(completion_hidden(model, batch)).double() / temperature
    pi = torch.log_softmax(logits, -1)
    mu = torch.stack(mu_rows)
    kl = (mu.exp() * (mu - pi)).nan_to_num(0.0).sum(-1)  # KL(μ ‖ π) per token; 0·log 0 = 0
    mu_tok = mu.gather(1, batch.targets[batch.mask].unsqueeze(1)).squeeze(1)
    out = {"tokens": int(batch.mask.sum()), "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
           "max_abs_dlogp": (lp[batch.mask].double() - mu_tok).abs().max().item()}
    if llm is not None:
        out.update(_router_agreement(llm, model, P, C))
    return out


def _router_hooks(layers, gates: list, k: int, picks: list):
    """Forward pre-hooks on every MoE block of `layers`: each call appends (layer, the top-k experts picked for
    each token of the call) — the router's logits recomputed in float32 from the block's input and `gates`
    (each layer's router weight [experts, hidden])."""
    def hook(i):
        def f(block, args):
            h = args[0].reshape(-1, args[0].shape[-1]).float()  # [tokens, hidden] (vLLM) or [1, tokens, hidden]
            picks.append((i, (h @ gates[i].float().T).topk(k, -1).indices))
        return f
    return [layer.mlp.register_forward_pre_hook(hook(i)) for i, layer in enumerate(layers)]


def _routing(picks: list, n_layers: int):
    """[tokens, layers, k] sorted expert ids from one sequence's hook records."""
    import torch

    per_layer = [torch.cat([t for i, t in picks if i == layer]) for layer in range(n_layers)]
    return torch.stack(per_layer, 1).sort(-1).values


def _router_agreement(llm, model, P, C) -> dict:
    """Share of (token, layer) pairs on which the learner's router picks the same top-k experts as vLLM's, for
    every token of every sampled sequence. vLLM's side: a hook on each MoE block of its model (in this process)
    takes the block's input (the sequence run again as a prefill, prefix caching off) and routes it with the
    learner's router weights, the ones the broadcast sent (vLLM's CPU MoE leaves its `gate.weight` empty, so
    the engine's own router weights cannot be read there). This measures drift of the routers' inputs; a stale
    router in the engine would add to it. vLLM's routed-experts output, the direct way, needs its V2 model
    runner, which its CPU backend does not have."""
    import torch
    from vllm import SamplingParams

    k, n_layers = model.config.num_experts_per_tok, model.config.num_hidden_layers
    theirs_picks: list = []

    gates = [layer.mlp.gate.weight.detach() for layer in model.model.layers]

    def install(worker):
        return len(_router_hooks(worker.model_runner.get_model().model.layers, gates, k, theirs_picks))

    assert llm.collective_rpc(install) == [n_layers]
    ours_picks: list = []
    hooks = _router_hooks(model.model.layers, gates, k, ours_picks)
    agree = total = 0
    try:
        for p, c in zip(P, C):
            theirs_picks.clear(), ours_picks.clear()
            llm.generate([{"prompt_token_ids": p + c}], SamplingParams(max_tokens=1), use_tqdm=False)
            with torch.no_grad():
                model(input_ids=torch.tensor([p + c]), use_cache=False)
            theirs, ours = _routing(theirs_picks, n_layers), _routing(ours_picks, n_layers)
            assert theirs.shape == ours.shape, (theirs.shape, ours.shape)
            same = (theirs == ours).all(-1)
            agree, total = agree + int(same.sum()), total + same.numel()
    finally:
        for h in hooks:
            h.remove()
    return {"router_agreement": agree / total, "routed_pairs": total}


COLS = ["family", "passed", "tokens", "kl_mean", "kl_max", "max_abs_dlogp", "kl_before_update", "kl_max_at_load",
        "router_agreement", "router_agreement_at_load", "total_s"]


def main(argv: list[str] | None = None) -> None:
    from bench.common import table, write_json
    from tinymodel.build import TinyModelSpec, train_tokenizer
    from tinymodel.families import FAMILIES

    ap = argparse.ArgumentParser(prog="python -m bench.families", description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", default=list(FAMILIES), help=f"of {', '.join(FAMILIES)} (default: all)")
    args = ap.parse_args(argv)
    tok = train_tokenizer(0, TinyModelSpec())
    rows = []
    with tempfile.TemporaryDirectory(prefix="brorl-families-") as d:
        for name in args.families:
            try:
                rows.append({**check_family(name, d, tokenizer=tok), "features": FAMILIES[name][1]})
            except Exception as e:  # a family the engine cannot run is a row of the table, not the end of it
                traceback.print_exc()
                rows.append({"family": name, "passed": False, "error": f"{type(e).__name__}: {e}"[:400],
                             "features": FAMILIES[name][1]})
            print(rows[-1], flush=True)
    print(table(rows, COLS))
    for r in rows:
        if "error" in r:
            print(f"{r['family']}: {r['error']}")
    print(f"wrote {write_json('families', {'kl_max_allowed': KL_MAX, 'rows': rows})}")
    sys.exit(0 if all(r["passed"] for r in rows) else 1)


if __name__ == "__main__":
    main()
