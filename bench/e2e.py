"""The whole loop against raw generation: `brorl run`'s samples/s next to what the same engine generates on
its own, and where each step's time goes.

    python -m bench.e2e --quick                              # CPU: a small shaped model, 1 learner + 1 actor
    python -m bench.e2e --shape qwen2-1.5b --actors 1 3      # GPUs: the learner on GPU 0, actors on 1.., raw on 1
    python -m bench.e2e --shape qwen2-1.5b --actors 3 --p3   # and N = 512 against N = 16, keep against finish
    python -m bench.e2e --shape qwen2-1.5b --learner-gpus 2 --actors 1   # the learner on GPUs 0-1 (ZeRO-2)
    python -m bench.e2e --shape qwen2-1.5b --cases 1:16:keep --share-gpu  # one GPU, learner and actor on it
    python -m bench.e2e --shape qwen2-1.5b --cases 1:16:keep:timeshare --share-gpu   # ... taking turns on it
    python -m bench.e2e ... --cases 1:16:keep:corun --raw-from bench/results/e2e_X.json  # X's raw engine, runs

Model: `tinymodel.shaped` (random weights of a real model's shape, a tokenizer of its whole vocabulary),
built once under runs/bench/e2e/. Task: `throughput:0.5:<prompt chars>` (a set pass rate, so a random
model yields kept groups); completion budgets log-normal (`actor.length_dist`), so stragglers are real.

- raw: one engine built exactly as an actor's (`actors.engine.make_async_engine`), on one actor GPU, given
  `--raw-steps` steps' prompts at once with the actor's sampling parameters (n = N, log-probs, text,
  each prompt's own budget): the engine's ceiling, samples/s.
- run: `brorl run` with the learner on one GPU (`--learner-gpus`: several, DeepSpeed ZeRO-2) and A actors (N = 16, updates kept in flight), each on its
  own GPU; steady-state samples/s over
  the learner's loop (steps from `WARM` on), per actor against raw; and per step: the learner's waiting,
  training and broadcasting, the actors' (mean per actor) idle time, weight loading and scoring.
- a case's 4th field, `actor.share_gpu`: "corun" (the engine generates while the learner trains) or "timeshare"
  (it pauses meanwhile). Each run's `timeshare_bound_samples_per_s` is what taking turns could reach at best:
  a step's samples over (their raw generation time + the learner's standalone train seconds a step), the
  latter from a "timeshare" run at the same N (its learner trains with the engine paused); without one, none
  (a co-run's own train seconds are slowed by the engine beside it, and would flatter the loop).
  `--raw-from`: the raw engine rows (and runs, for that bound) of an earlier result, instead of a raw phase.
- `--p3`: N = 512 (1 prompt per step) against N = 16 (32 prompts), the same samples per step and the same
  long-tailed budgets, with `actor.in_flight_on_update` "keep" and "finish"; 1 learner + 1 actor each (two
  jobs side by side on 4 GPUs), and the raw engine at both N.

Writes bench/results/e2e[_<tag>].json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from config.placement import ONE_GPU, visible_env

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_PER_STEP = 512  # on GPUs: N = 16 × 32 prompts, N = 512 × 1
PER_CASE = ("job.n_samples", "job.prompts_per_step", "actor.prompts_per_request", "actor.num_actors", "actor.gpus")
"""Settings that differ by case, left out of the results' shared `job` record (results before 2026-11-30 hold
N = 16's there)."""
SHARE_GPU = {k: v for k, v in ONE_GPU.items() if k != "actor.num_actors"}
"""`--share-gpu`: `brorl run --one-gpu`'s settings (config/placement.py): learner and actor on GPU 0."""
WARM = 2  # steps left out of the steady state (the first wait for the engines' first groups)


def job(shape: str, actors: int, steps: int, model: str, *, n: int = 16, update: str = "keep",
        first_gpu: int = 0, learner_gpus: int = 1, samples: int = SAMPLES_PER_STEP) -> tuple[str, dict]:
    """(preset, overrides) of the measured job: N = `n` with `samples` // n prompts per step (the same
    samples per step whatever N), updates applied as `update`; its GPUs from `first_gpu` on: the learner's
    `learner_gpus` (DeepSpeed ZeRO-2 ranks), then one per actor."""
    from transport.ports import free_ports

    port = free_ports(3)  # jobs may run side by side
    common = {"model.path": model, "verifiers.task": "throughput:0.5:128", "actor.length_dist": "lognormal",
              "actor.num_actors": actors, "learner.steps": steps, "run.eval_interval": 0,
              "learner.checkpoint_interval": 10**6, "job.max_staleness": 1, "job.n_samples": n,
              "actor.in_flight_on_update": update, "transport.work_port": port, "transport.rollout_port": port + 1,
              "transport.control_port": port + 2}
    if shape == "small":  # CPU
        b = max(1, 128 // n)
        return "tiny-cpu", {**common, "model.dtype": "float32", "job.prompts_per_step": b,
                            "actor.prompts_per_request": b, "actor.max_tokens": 64, "actor.length_median": 24,
                            "actor.max_model_len": 256}
    b = max(1, samples // n)
    # the preset scores the answer after the model's `</think>`: a random-weight model never writes one, and
    # every group would be all-wrong (the throughput task scores the whole completion)
    return "brorl-1.5b", {**common, "data.reasoning_end": "", "job.prompts_per_step": b, "actor.prompts_per_request": b,
                          "actor.max_tokens": 1024, "actor.length_median": 256, "actor.max_model_len": 1280,
                          "learner.devices": learner_gpus, "learner.gpus": list(range(first_gpu, first_gpu + learner_gpus)),
                          **({"learner.device": "cuda"} if learner_gpus > 1 else {}),
                          "actor.gpus": [first_gpu + learner_gpus + i for i in range(actors)]}


def model_dir(shape: str) -> str:
    from tinymodel import is_model_dir
    from tinymodel.shaped import build_shaped_model

    d = ROOT / "runs" / "bench" / "e2e" / f"model-{shape}"
    if not is_model_dir(d):
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        build_shaped_model(d, shape, dtype="bfloat16" if shape != "small" else "float32", device=dev)
    return str(d)


async def _raw(cfg, prompts: int) -> dict:
    from actors.engine import CompletionTexts, make_async_engine, request_max_tokens, sampling_params
    from learner.batching import TaskStream
    from taskdata import PromptRenderer
    from vllm.sampling_params import RequestOutputKind

    from actors.stats import EngineGauge, full_rate

    gauge = EngineGauge()
    gauge.timeline = []  # the rate while the engine was full, besides the batch's overall rate
    engine = make_async_engine(cfg, gauge)
    # the job's own prompts, ids 0.., rendered as the learner renders them (so the same budgets too)
    tasks = TaskStream(cfg, PromptRenderer.for_model(cfg.model.path, cfg.data, cfg.actor.max_model_len - 1))
    items = [{"prompt_token_ids": tasks[i][1]} for i in range(prompts)]
    a = cfg.actor
    tokens = 0
    texts_of = CompletionTexts(cfg.model.path, a)  # the text as the actor gets it

    async def one(i: int, prompt: dict) -> None:
        nonlocal tokens
        sp = sampling_params(a, cfg.job.n_samples, output_kind=RequestOutputKind.FINAL_ONLY, max_tokens=request_max_tokens(a, cfg.run.seed, i),
                             **texts_of.request_kwargs())
        final = None
        async for out in engine.generate(prompt, sp, f"raw-{i}"):
            final = out
        assert final is not None and len(final.outputs) == cfg.job.n_samples
        texts = texts_of(final.outputs)
        assert all(o.logprobs is not None for o in final.outputs) and len(texts) == cfg.job.n_samples
        tokens += sum(len(o.token_ids) for o in final.outputs)

    try:
        await one(-1, items[0])  # warm-up: the engine's first request compiles and captures
        before = gauge.counters()
        gauge.timeline.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, t) for i, t in enumerate(items)))
        wall = time.perf_counter() - t0
    finally:
        engine.shutdown()
    n = prompts * cfg.job.n_samples
    after = gauge.counters()
    # how full the engine was, per engine step, and how fast it stepped: what the loop's actor is compared with
    return {"prompts": prompts, "samples": n, "wall_s": wall, "samples_per_s": n / wall, "tokens_per_s": tokens / wall,
            "engine_steps_per_s": (after["engine_steps"] - before["engine_steps"]) / wall,
            **EngineGauge.means(before, after), **full_rate(gauge.timeline)}


def raw(preset: str, over: dict, prompts: int, gpu: int | None) -> dict:
    """The raw engine in its own process (on GPU `gpu`): its last stdout line is the JSON result."""
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_env([gpu], os.environ.get("CUDA_VISIBLE_DEVICES"))
    out = subprocess.run([sys.executable, "-m", "bench.e2e", "--raw-case", json.dumps([preset, over, prompts])],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"raw generation failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_case(preset: str, over: dict, actors: int, tag: str) -> dict:
    """One `brorl run`, summarised, with the fullest card's peak memory in use (every process on it; None
    without nvidia-smi)."""
    from bench.common import GpuMemory, brorl_run

    with GpuMemory() as mem:
        res = brorl_run(ROOT / "runs" / "bench" / "e2e" / tag, over, preset=preset)
    return {**summarise(res["metrics"], actors, tag), "wall_s": res["wall_s"], "peak_gpu_gib": mem.peak_gib}


def summarise(m: list[dict], actors: int, tag: str = "") -> dict:
    """A finished run's metrics rows: steady-state samples/s (steps from `WARM` on), the actors' idle share,
    the learner's waiting share and seconds per step, and the per-step breakdown."""
    from actors.stats import EngineGauge
    from learner.metrics import ACTOR_COUNTERS, loop_seconds

    if len(m) <= WARM:
        raise RuntimeError(f"{tag}: {len(m)} steps, need more than {WARM} for a steady state")
    steady = m[WARM:]
    loop = loop_seconds(steady)
    gen = sum(r["generated"] for r in steady)
    prev = m[WARM - 1]
    per_step = []
    for a, b in zip(m, m[1:]):
        d = {k: (b.get(f"actor_{k}", 0.0) - a.get(f"actor_{k}", 0.0)) / actors for k in ACTOR_COUNTERS}
        per_step.append({"step": b["step"], "wait_s": b["wait_s"], "train_s": b["train_s"],
                         "broadcast_s": b["broadcast_s"], **{f"actor_{k}": v for k, v in d.items()}})
    idle = (m[-1].get("actor_idle_s", 0.0) - prev.get("actor_idle_s", 0.0)) / actors
    held = (m[-1].get("actor_held_s", 0.0) - prev.get("actor_held_s", 0.0)) / actors  # paused for the learner
    aborted = (m[-1].get("actor_aborted_stale", 0.0) - prev.get("actor_aborted_stale", 0.0)) / actors
    steps = (m[-1].get("actor_engine_steps", 0.0) - prev.get("actor_engine_steps", 0.0)) / actors
    tokens = sum(r.get("tokens", 0.0) for r in steady)  # completion tokens, as the raw engine's tokens_per_s
    return {"actors": actors, "steps": len(m), "samples_per_s": gen / loop, "generated_per_step": gen / len(steady), "per_actor_samples_per_s": gen / loop / actors,
            "per_actor_tokens_per_s": tokens / loop / actors,
            # engine steps a second while the actor had work: a step slower than the raw engine's at the same
            # load is time lost inside the actor's process or engine, not in the loop's grants
            "engine_steps_per_busy_s": steps / max(1e-9, loop - idle),
            "aborted_stale_requests": aborted,  # per actor, steady state: generation thrown away at updates (keep)
            "actor_idle_share": idle / loop, "actor_held_share": held / loop,
            "engine_idle_share": (idle + held) / loop,  # not generating: no request, or held for the learner
            "learner_wait_share": sum(r["wait_s"] for r in steady) / loop,
            "train_s_per_step": sum(r["train_s"] for r in steady) / len(steady),
            "broadcast_s_per_step": sum(r["broadcast_s"] for r in steady) / len(steady),
            "kept_share": sum(r["groups_kept"] for r in steady) / max(1, sum(r["groups_received"] for r in steady)),
            # KL(μ ‖ π_old) per token, all steps: what the engine's sampling differs from the learner's
            # (`actor.prefix_cache_per_version` on or off changes the prompt KV it samples from)
            "mismatch_kl": sum(r.get("mismatch_kl", 0.0) for r in m) / len(m),
            "mismatch_kl_max": max(r.get("mismatch_kl", 0.0) for r in m),
            # the learner's own figures (learner/flops.py; `learner.compile`: frames compiled after the first step)
            "learner_mfu": sum(r.get("mfu", 0.0) for r in steady) / len(steady),
            "learner_tflops": sum(r.get("model_tflops", 0.0) for r in steady) / len(steady),
            "compiled_frames_after_step_1": sum(r.get("compiled_frames", 0.0) for r in m[1:]),
            # how full the actors' engines were, per engine step, in the steady state (against the raw run's)
            **EngineGauge.means(prev, m[-1], prefix="actor_"),
            "per_step": per_step}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="CPU: the small shape, 1 actor, few steps")
    ap.add_argument("--shape", default="qwen2-1.5b")
    ap.add_argument("--actors", type=int, nargs="*", default=[1], help="P1: runs with this many actors (N = 16)")
    ap.add_argument("--p3", action="store_true", help="also N = 512 against N = 16, updates kept against finished "
                    "(1 learner + 1 actor each; two at a time side by side where there are 4 GPUs)")
    ap.add_argument("--cases", default="", help="instead of --actors/--p3: ACTORS:N:keep|finish[:corun|timeshare] "
                    "(the last: actor.share_gpu), comma-separated, run in this order (consecutive 1-actor cases side "
                    "by side where there are 4 GPUs)")
    ap.add_argument("--learner-gpus", type=int, default=1, help="the learner's GPUs (ZeRO-2 ranks) in every run; "
                    "enough of them that the learner outpaces the actors makes the run a test of generation")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run and the raw engine (VALUE read as JSON, else as text), "
                         "e.g. --set learner.compile=false; repeatable")
    ap.add_argument("--share-gpu", action="store_true", help="the learner and the actor on GPU 0 (one-GPU machines: "
                    "weights through the learner's shared buffer (transport.weight_backend ipc), a 24 GiB KV cache, the engine at most 0.45 of the card; config/placement.py)")
    ap.add_argument("--samples-per-step", type=int, default=SAMPLES_PER_STEP,
                    help="GPUs: samples a step holds (N = 512: one prompt per 512; more prompts a step keep the "
                         "engine full instead of draining it to one prompt's longest completion)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--raw-steps", type=int, default=4, help="steps' worth of prompts the raw engine generates")
    ap.add_argument("--raw-from", default="", help="an earlier result JSON: its raw engine rows (no raw phase here) "
                    "and its runs (for the time-sharing bound; shown beside this one's)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--raw-case", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.raw_case:
        from config.loader import load_config

        preset, over, prompts = json.loads(a.raw_case)
        print(json.dumps(asyncio.run(_raw(load_config(preset, over), prompts))))
        return
    from bench.common import table

    if a.quick:
        a.shape, a.steps = "small", 6
    a.overrides = overrides(a.set)  # parsed once, before any engine starts
    if a.raw_from and not Path(a.raw_from).is_file():
        ap.error(f"--raw-from {a.raw_from}: no such result file; run the raw engine first (a run without it)")
    if a.share_gpu and a.learner_gpus != 1:
        ap.error("--share-gpu puts the learner and the actor on GPU 0: --learner-gpus must be 1")
    if a.share_gpu:
        a.overrides = {**SHARE_GPU, **a.overrides}
    gpu = a.shape != "small"
    gpus = _gpus() if gpu else 0
    model = model_dir(a.shape)
    cases = [(n_act, 16, "keep", "") for n_act in a.actors]
    if a.p3:
        cases += [(1, n, up, "") for n in (512, 16) for up in ("keep", "finish") if (1, n, up, "") not in cases]
    if a.cases:
        cases = parse_cases(a.cases, ap.error)
    raws, earlier = {}, []
    if a.raw_from:
        prior = json.loads(Path(a.raw_from).read_text())
        raws = {int(r["n"]): r for r in prior["raw"]}
        earlier = [{**r, "from": a.raw_from} for r in prior["runs"]]
        if missing := sorted({n for _, n, _, _ in cases} - set(raws)):
            ap.error(f"--raw-from {a.raw_from}: no raw engine row for N = {missing}; run those N there first")
    for n in sorted({n for _, n, _, _ in cases} - set(raws)):
        preset, over = job(a.shape, 1, a.steps, model, n=n, samples=a.samples_per_step)
        over.update(a.overrides)
        raws[n] = {"n": n, **raw(preset, over, a.raw_steps * over["job.prompts_per_step"],
                                 min(1, gpus - 1) if gpu else None)}  # an actor's GPU (GPU 0 on a one-GPU machine)
        print(f"raw engine, N = {n}: {raws[n]['samples_per_s']:.1f} samples/s", file=sys.stderr)
    runs, side_by_side = [], gpu and not a.share_gpu and gpus >= 2 * (a.learner_gpus + 1)  # shared: GPU 0 only
    todo = list(cases)
    while todo:
        batch = [todo.pop(0)]
        if side_by_side and batch[0][0] == 1 and todo and todo[0][0] == 1:
            batch.append(todo.pop(0))  # two L + 1 jobs at once, each on its own half of the GPUs
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            futs = [pool.submit(_one, a, model, c, (a.learner_gpus + 1) * i) for i, c in enumerate(batch)]
            for f, (n_act, n, up, share) in zip(futs, batch):
                r = f.result()
                r["of_raw"] = r["per_actor_samples_per_s"] / raws[n]["samples_per_s"]
                r["busy_of_raw"] = r["of_raw"] / max(1e-9, 1 - r["actor_idle_share"])
                of_raw_tokens(r, raws[n])
                r["side_by_side"] = len(batch) > 1
                runs.append(r)
                timeshare_bound(runs + earlier, raws)
                print(f"{n_act} actor(s), N = {n}, {up}, {r['share_gpu']}: {r['samples_per_s']:.1f} samples/s, "
                      f"{100 * r['of_raw']:.0f} % of raw per actor, engine not generating "
                      f"{100 * r['engine_idle_share']:.0f} %, learner {r['train_s_per_step']:.1f} s/step", file=sys.stderr)
        path = _write(a, model, raws, runs + earlier)  # after every batch: a sweep cut short keeps what finished
    print("\nRaw engine (one " + ("GPU" if gpu else "CPU engine") + ")")
    print(table(list(raws.values()), ["n", "prompts", "samples", "samples_per_s", "tokens_per_s", "engine_steps_per_s",
                                      "mean_running_seqs", "mean_waiting_seqs", "mean_kv_use", "mean_prefill_steps",
                                      "mean_gen_tokens", "full_tokens_per_s", "full_s", "full_running_seqs"]))
    print("\nbrorl run (steady state)")
    runs += earlier
    print(table(runs, ["learner_gpus", "actors", "n", "update", "share_gpu", "side_by_side", "samples_per_s",
                       "per_actor_samples_per_s", "of_raw", "timeshare_bound_samples_per_s", "engine_idle_share",
                       "actor_held_share", "learner_alone_s_per_step", "actor_idle_share", "busy_of_raw", "tokens_of_raw", "busy_tokens_of_raw", "busy_tokens_of_full_raw",
                       "engine_steps_per_busy_s", "learner_wait_share", "train_s_per_step",
                       "broadcast_s_per_step", "kept_share", "aborted_stale_requests", "mismatch_kl", "learner_mfu",
                       "compiled_frames_after_step_1", "mean_running_seqs", "mean_waiting_seqs", "mean_kv_use",
                       "mean_prefill_steps", "mean_gen_tokens"]))
    path = _write(a, model, raws, runs)
    print(f"\nwrote {path} and {path.with_suffix('.png')}")


def parse_cases(text: str, error) -> list[tuple[int, int, str, str]]:
    """`--cases`: ACTORS:N:keep|finish[:corun|timeshare], comma-separated ("": the config's actor.share_gpu;
    `--share-gpu`'s is corun)."""
    out = []
    for c in text.split(","):
        f = c.split(":")
        try:
            n_act, n, up, share = int(f[0]), int(f[1]), f[2], (f[3] if len(f) == 4 else "")
        except (ValueError, IndexError):
            n_act = -1
        if n_act < 1 or len(f) > 4 or up not in ("keep", "finish", "abort") or share not in ("", "corun", "timeshare"):
            error(f"--cases {c!r}: expected ACTORS:N:keep|finish[:corun|timeshare], comma-separated")
        out.append((n_act, n, up, share))
    return out


def timeshare_bound(runs: list[dict], raws: dict) -> None:
    """Each run's best time-shared rate: a step's samples (generated, kept or not) over their raw generation
    seconds plus the learner's standalone seconds a step (a "timeshare" run's train_s at the same N, whose
    engine was paused meanwhile; None without one)."""
    for r in runs:
        alone = [t["train_s_per_step"] for t in runs if t["n"] == r["n"] and t.get("share_gpu") == "timeshare"]
        r["learner_alone_s_per_step"] = alone[-1] if alone else None
        r["learner_alone_from"] = "timeshare run" if alone else None
        samples = r.get("generated_per_step") or r["prompts_per_step"] * r["n"]  # as samples_per_s counts them
        r["timeshare_bound_samples_per_s"] = None if not alone else samples / (
            samples / raws[r["n"]]["samples_per_s"] + r["learner_alone_s_per_step"])


def of_raw_tokens(r: dict, raw_row: dict) -> None:
    """The loop's completion tokens a second per actor against the raw engine's, overall and while busy: the
    fair form of `of_raw` when the two runs' completions differ in length (samples are drawn per request)."""
    r["tokens_of_raw"] = r["per_actor_tokens_per_s"] / raw_row["tokens_per_s"]
    r["busy_tokens_of_raw"] = r["tokens_of_raw"] / max(1e-9, 1 - r["actor_idle_share"])
    if raw_row.get("full_tokens_per_s"):  # against the raw engine while it was full (its drain left out)
        r["busy_tokens_of_full_raw"] = r["busy_tokens_of_raw"] * raw_row["tokens_per_s"] / raw_row["full_tokens_per_s"]


def _write(a, model: str, raws: dict, runs: list[dict]):
    from bench.common import write_json

    preset, over = job(a.shape, 1, a.steps, model, samples=a.samples_per_step)
    path = write_json("e2e" + (f"_{a.tag}" if a.tag else ""), {
        "shape": a.shape, "samples_per_step": a.samples_per_step if a.shape != "small" else 128,
        "command": "python -m bench.e2e " + " ".join(sys.argv[1:]),
        # the settings every case shares (a case's N and prompts a step are its run's `n`, `prompts_per_step`)
        "job": {"preset": preset, **{k: v for k, v in {**over, **a.overrides}.items()
                                     if "port" not in k and k != "model.path" and k not in PER_CASE}},
        "raw": list(raws.values()), "runs": runs})
    _plot(raws, runs, path.with_suffix(".png"))
    return path


def overrides(pairs: list[str]) -> dict:
    """`--set KEY=VALUE` pairs as config overrides (VALUE as JSON where it parses, else the text)."""
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE, e.g. learner.compile=false")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _one(a, model: str, case: tuple[int, int, str, str], first_gpu: int) -> dict:
    n_act, n, up, share = case
    preset, over = job(a.shape, n_act, a.steps, model, n=n, update=up, first_gpu=first_gpu,
                       learner_gpus=a.learner_gpus, samples=a.samples_per_step)
    over.update(a.overrides)
    if share:
        over["actor.share_gpu"] = share
    if a.shape == "small":
        over = {k: v for k, v in over.items() if k not in ("learner.gpus", "actor.gpus", "learner.devices", "learner.device")}
    r = run_case(preset, over, n_act, f"run-{a.learner_gpus}-{n_act}-n{n}-{up}" + (f"-{share}" if share else ""))
    return {"learner_gpus": a.learner_gpus, "n": n, "update": up, "share_gpu": over.get("actor.share_gpu", "corun"),
            "prompts_per_step": over["job.prompts_per_step"], **r}


def _plot(raws: dict, runs: list[dict], out: Path, device: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import stamp

    fig, axes = plt.subplots(1, 1 + len(runs), figsize=(4.5 * (1 + len(runs)), 3.8))
    ax = axes[0]
    labels = [f"raw\nN={n}" for n in raws] + [f"{r.get('learner_gpus', 1)}L+{r['actors']}A N={r['n']}\n{r['update']} "
                                              f"{r.get('share_gpu', '')}" for r in runs]
    ax.bar(labels, [r["samples_per_s"] for r in raws.values()] + [r["per_actor_samples_per_s"] for r in runs])
    ax.set_ylabel("samples/s (per actor)")
    ax.tick_params(axis="x", labelsize=6)
    for ax, r in zip(axes[1:], runs):
        steps = [p["step"] for p in r["per_step"]]
        bottom = [0.0] * len(steps)
        for k, lab in (("train_s", "learner: train"), ("broadcast_s", "learner: broadcast"), ("wait_s", "learner: wait")):
            v = [p[k] for p in r["per_step"]]
            ax.bar([s - 0.2 for s in steps], v, 0.4, bottom=bottom, label=lab)
            bottom = [b + x for b, x in zip(bottom, v)]
        lo = [0.0] * len(steps)
        gen = [max(0.0, p["wait_s"] + p["train_s"] + p["broadcast_s"] - p["actor_update_s"] - p["actor_idle_s"]
                   - p.get("actor_held_s", 0.0)) for p in r["per_step"]]
        for k, lab in (("gen", "actor: generating"), ("actor_update_s", "actor: load weights"),
                       ("actor_held_s", "actor: held for the learner"), ("actor_idle_s", "actor: idle")):
            v = gen if k == "gen" else [p.get(k, 0.0) for p in r["per_step"]]
            ax.bar([s + 0.2 for s in steps], v, 0.4, bottom=lo, label=lab, hatch="//")
            lo = [b + x for b, x in zip(lo, v)]
        ax.plot(steps, [p["actor_score_s"] for p in r["per_step"]], "k.", label="actor: scoring (overlaps)")
        ax.set_xlabel(f"step ({r.get('learner_gpus', 1)} learner GPU(s), {r['actors']} actor(s), N = {r['n']}, "
                      f"{r['update']}, {r.get('share_gpu', 'corun')})")
        ax.set_ylabel("seconds")
        ax.legend(fontsize=6)
    st = stamp()
    fig.suptitle(f"brorl run against raw generation, {device or st.get('device', st.get('cpu', '?'))}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
