"""The model-family matrix: each family's tiny model through a weight update into a CPU vLLM engine.

`python -m bench.families [NAME ...]` — for each family (`tinymodel.families`): build its tiny model, start a
CPU vLLM engine on it (the actor's engine arguments), perturb the learner's copy of the weights, push them
into the running engine through brorl's weight broadcast (`transport.weights`, as the actor receives them),
sample completions with the engine's full next-token distributions, and score the same tokens with the
learner's code (`learner.logprobs`) under the same weights. Reports the per-token KL(vLLM ‖ learner) (mean
and max over tokens, exact over the vocabulary), the largest |Δ log-prob| of a sampled token, and for a
mixture of experts the share of (token, layer) top-k expert choices on which the learner's router agrees
with the experts vLLM routed the token to. Prints a table and writes bench/results/families.json.

`python -m bench.families --cycle [NAME ...]` — each family through the real loop instead: `brorl run` on the
tiny-cpu preset with the family's tiny model for 3 steps (a checkpoint at step 3), `brorl eval` on that run's
checkpoint, then `brorl run --resume` to step 5; the run must continue from step 3 (metrics steps 1..5 once
each, versions = steps, the prompt ledger consistent, a checkpoint at step 5). Prints a table and writes
bench/results/families_cycle.json (per family: passed or the one-line reason, each phase's seconds, the
steps, eval's pass@1).
"""

from __future__ import annotations

import argparse
import asyncio
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

    from actors.engine import engine_kwargs, in_process_engine, offline_env, sampling_params
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
    llm = None
    with in_process_engine():
        try:
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
    t_end = time.perf_counter()
    row.update(passed=max(row["kl_max"], row["kl_max_at_load"]) <= KL_MAX < row["kl_before_update"], build_and_start_s=round(t_engine - t0, 1),
               check_at_load_and_update_s=round(t_sync - t_engine, 2), total_s=round(t_end - t0, 1))
    return row


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


CYCLE_STEPS, RESUME_STEPS = 3, 5
EVAL_PROMPTS, EVAL_K = 8, 4
CYCLE_JOB = {"job.prompts_per_step": 4, "job.n_samples": 8, "actor.prompts_per_request": 4,
             "actor.max_model_len": 64, "actor.max_num_seqs": 32, "actor.kv_cache_gib": 0.01,
             "actor.enforce_eager": True, "run.eval_interval": 0}
"""The cycle's job on the tiny-cpu preset: a few small groups a step, a small engine, no held-out estimate."""


def check_cycle(rec: dict) -> str | None:
    """What is wrong with one family's cycle record (None: nothing), in one line. `rec`: "first_steps" (the
    metrics steps after the first run), "first_checkpoints" (its checkpoint steps), "eval" (`brorl eval`'s
    result), "steps" and "versions" (the metrics after the resume), "final_checkpoints", "ledger_error"."""
    first = list(range(1, CYCLE_STEPS + 1))
    if rec["first_steps"] != first:
        return f"the first run logged steps {rec['first_steps']}, not {first}"
    if CYCLE_STEPS not in rec["first_checkpoints"]:
        return f"no checkpoint at step {CYCLE_STEPS} (checkpoints: {rec['first_checkpoints']})"
    ev = rec["eval"]
    p1 = ev.get("pass_at_1")
    if ev.get("prompts") != EVAL_PROMPTS or ev.get("k") != EVAL_K or not isinstance(p1, (int, float)) or not 0 <= p1 <= 1:
        return f"brorl eval gave {ev.get('prompts')} prompts × k = {ev.get('k')}, pass@1 {ev.get('pass_at_1')}"
    want = list(range(1, RESUME_STEPS + 1))
    if rec["steps"] != want:  # a resume from scratch repeats 1..3; one that lost its place skips or repeats
        return f"after the resume the metrics have steps {rec['steps']}, not {want}"
    if rec["versions"] != want:
        return f"after the resume the versions are {rec['versions']}, not the steps {want}"
    if RESUME_STEPS not in rec["final_checkpoints"]:
        return f"no checkpoint at step {RESUME_STEPS} after the resume (checkpoints: {rec['final_checkpoints']})"
    if rec.get("ledger_error"):
        return f"prompt ledger: {rec['ledger_error']}"
    return None


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").glob("step-*"))


def _phase_error(e: Exception) -> str:
    """An exception as one line: its first line, or the last line that names an error in a log tail."""
    text = f"{type(e).__name__}: {e}"
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    named = [l for l in lines if "Error" in l or "error" in l or "brorl " in l]
    return (named[-1] if len(lines) > 1 and named else lines[0])[:300]


def cycle_family(name: str, workdir: str | Path, seed: int = 0, tokenizer=None) -> dict:
    """One family through `brorl run` (3 steps), `brorl eval` on its checkpoint and `brorl run --resume` (to step
    5); returns its row (see module doc). A failing phase ends the family's cycle with its reason."""
    import json
    import subprocess

    from bench.common import brorl_run
    from learner.ledger import LedgerError, account, check
    from learner.metrics import read
    from tinymodel.families import build_family

    row: dict = {"family": name, "passed": False}
    work = Path(workdir) / name
    run_dir = work / "run"
    phase = "build"
    try:
        t = time.perf_counter()
        path = build_family(name, work / "model", seed=seed, tokenizer=tokenizer)
        row["build_s"] = round(time.perf_counter() - t, 1)
        over = {"model.path": str(path), "learner.steps": CYCLE_STEPS, "learner.checkpoint_interval": CYCLE_STEPS,
                "run.seed": seed, **CYCLE_JOB}
        phase = "run"
        res = brorl_run(run_dir, over)
        row["run_s"] = round(res["wall_s"], 1)
        rec = {"first_steps": [r["step"] for r in res["metrics"]], "first_checkpoints": _checkpoint_steps(run_dir)}

        phase = "eval"
        out = work / "eval.json"
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "cli", "eval", "--checkpoint", str(run_dir), "--k", str(EVAL_K),
                            "--out", str(out), "--run.eval_prompts", str(EVAL_PROMPTS)], capture_output=True, text=True,
                           timeout=1800, cwd=Path(__file__).resolve().parents[1])
        row["eval_s"] = round(time.perf_counter() - t, 1)
        if p.returncode != 0:
            raise RuntimeError(f"brorl eval failed ({p.returncode}):\n{p.stderr[-1500:]}")
        ev = json.loads(out.read_text())
        rec["eval"] = {k: ev.get(k) for k in ("prompts", "k", "pass_at_1", f"pass_at_{EVAL_K}")}
        row.update(eval_pass_at_1=ev["pass_at_1"], eval_model=Path(ev["model"]).parent.name)

        phase = "resume"
        res = brorl_run(run_dir, {**over, "learner.steps": RESUME_STEPS}, resume=True)
        row["resume_s"] = round(res["wall_s"], 1)
        rec.update(steps=[r["step"] for r in res["metrics"]], versions=[r["version"] for r in res["metrics"]],
                   final_checkpoints=_checkpoint_steps(run_dir))
        rec["ledger_error"] = None
        try:
            check(account(run_dir), RESUME_STEPS)
        except LedgerError as e:
            rec["ledger_error"] = str(e)
        row.update(rec)
        row["reason"] = check_cycle(rec)
        row["passed"] = row["reason"] is None
    except Exception as e:  # a phase that fails is the family's finding: the reason, then the next family
        traceback.print_exc()
        row["reason"] = f"{phase}: {_phase_error(e)}"
        if run_dir.exists():
            row["metrics_steps"] = [r["step"] for r in read(run_dir / "metrics.jsonl")] \
                if (run_dir / "metrics.jsonl").exists() else []
    return row


CYCLE_COLS = ["family", "passed", "build_s", "run_s", "first_steps", "first_checkpoints", "eval_s",
              "eval_pass_at_1", "resume_s", "steps", "final_checkpoints", "reason"]

COLS = ["family", "passed", "tokens", "kl_mean", "kl_max", "max_abs_dlogp", "kl_before_update", "kl_max_at_load",
        "router_agreement", "router_agreement_at_load", "total_s"]


def main(argv: list[str] | None = None) -> None:
    from bench.common import table, write_json
    from tinymodel.build import TinyModelSpec, train_tokenizer
    from tinymodel.families import FAMILIES

    ap = argparse.ArgumentParser(prog="python -m bench.families", description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", default=list(FAMILIES), help=f"of {', '.join(FAMILIES)} (default: all)")
    ap.add_argument("--cycle", action="store_true", help="each family through brorl run (3 steps), brorl eval and "
                    "brorl run --resume (to step 5) instead of the weight-path check")
    args = ap.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown model family {', '.join(unknown)}: choose of {', '.join(FAMILIES)}")
    tok = train_tokenizer(0, TinyModelSpec())
    if args.cycle:
        sys.exit(_cycle_main(args.families, tok))
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


def _cycle_main(families: list[str], tok) -> int:
    from bench.common import table, write_json
    from tinymodel.families import FAMILIES

    cmd = "python -m bench.families --cycle" + ("" if families == list(FAMILIES) else " " + " ".join(families))
    head = {"command": cmd, "steps": CYCLE_STEPS, "resume_steps": RESUME_STEPS, "eval_prompts": EVAL_PROMPTS,
            "eval_k": EVAL_K, "job": CYCLE_JOB}
    rows = []
    with tempfile.TemporaryDirectory(prefix="brorl-families-cycle-") as d:
        for name in families:
            t = time.perf_counter()
            row = cycle_family(name, d, tokenizer=tok)
            rows.append({**row, "total_s": round(time.perf_counter() - t, 1), "features": FAMILIES[name][1]})
            print(rows[-1], flush=True)
            # after each family: a run cut short keeps the families it finished
            write_json("families_cycle", {**head, "families_left": families[len(rows):], "rows": rows})
    cols = CYCLE_COLS[:-1] + ["total_s"]
    print(table([{k: (" ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()} for r in rows], cols))
    for r in rows:
        if r["reason"]:
            print(f"{r['family']}: {r['reason']}")
    print(f"wrote {write_json('families_cycle', {**head, 'families_left': [], 'rows': rows})}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    main()
