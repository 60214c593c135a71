#!/usr/bin/env bash
# One GPU lease as one rerunnable plan (docs/development.md, "GPU machines"): the gpu tests, then the benchmarks, on a machine
# whose vLLM and extra wheels are installed under /tmp/site. Started in the background by the call that installs
# the last staged part:
#   setsid nohup bash bench/gpu/lease.sh /tmp/r > /tmp/plan.log 2>&1 &
# Later calls wait for /tmp/r/ALLDONE and fetch /tmp/r/results.tgz. Each step writes NAME.log, NAME.rc and
# NAME.secs; nvidia-smi is sampled every 5 s (smi.csv). The plan follows the GPUs the machine shows: on one GPU
# the roles share it (learner and actor on GPU 0); on two or more, independent steps run side by side.
set -u
R=${1:-/tmp/r}
mkdir -p "$R"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
       TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 5 > "$R/smi.csv" 2>&1 &
smi=$!
step() {  # step NAME COMMAND...: run it (at most $LIMIT s: a hung step must not eat the lease), keep its log,
  # exit status (124: cut at the limit) and seconds; pack what is there so far
  local name=$1; shift
  local t0=$(date +%s)
  timeout -k 20 "${LIMIT:-900}" "$@" > "$R/$name.log" 2>&1
  echo $? > "$R/$name.rc"
  echo $(( $(date +%s) - t0 )) > "$R/$name.secs"
  pack
}
pack() { tar czf "$R/results.tgz.part" -C "$R" --exclude 'results.tgz*' . 2>/dev/null && mv "$R/results.tgz.part" "$R/results.tgz"; }
runs() {  # the loop's own runs so far: metrics and every role's log (also while a run is still going), under
  # $R/bench/[$1-]RUN
  for d in runs/bench/e2e/run-*; do [ -d "$d" ] || continue; n=${1:+$1-}$(basename "$d"); mkdir -p "$R/bench/$n"
    cp "$d"/metrics.jsonl "$d"/logs/*.log "$R/bench/$n/" 2>/dev/null; done; pack; }
spy() {  # spy TAG: while the loop runs, every 40 s a 10 s py-spy profile of each vLLM engine-core process (where
  # its step time goes; the raw engine's and the loop's actor's) as $R/spy_TAG_PID_TIME.txt, where py-spy was staged
  local p; local spy=/tmp/site/bin/py-spy
  [ -x "$spy" ] || { echo "no py-spy staged: no engine profiles" > "$R/spy_$1.missing"; return; }
  while sleep 40; do for p in $(pgrep -f EngineCore); do
    timeout 20 "$spy" record -d 10 -r 100 --nonblocking --idle -f raw -o "$R/spy_$1_${p}_$(date +%s).txt" --pid "$p" \
      >> "$R/spy_$1.log" 2>&1; done; done; }
keep_bench() { mkdir -p "$R/bench"; for f in "$@"; do cp bench/results/$f "$R/bench/" 2>/dev/null; done; pack; }
python3 -c "import torch, vllm; print(torch.__version__, vllm.__version__, torch.cuda.device_count())" > "$R/versions.txt" 2>&1
TAG=${TAG:-h200}
GPUS=$(nvidia-smi -L | wc -l)
PT="python3 -m pytest -q -s -p no:cacheprovider"
ACT="python3 -m bench.actor --preset brorl-1.5b --dummy-1p5b --total 4096 --prompt-len 512 --max-tokens 256 --repeats 1 --cases 512:on,16:on"
share_pair() {  # share_pair N [--set K=V ...]: on the one GPU, the raw engine and the time-shared loop at N (its
  # learner trains with the engine paused: the standalone figure of the bound), then the co-run loop against the
  # same raw rows; the second results file holds both runs. The first run compiles: it gets the longer limit
  local N=$1; shift
  (while sleep 30; do runs "share$N"; done) &
  local snap=$!
  LIMIT=540 step "ts_$N" python3 -m bench.e2e --shape qwen2-1.5b --cases "1:$N:keep:timeshare" --steps 5 \
       --raw-steps 2 --share-gpu "$@" --tag "${TAG}ts_$N"
  LIMIT=420 step "co_$N" python3 -m bench.e2e --shape qwen2-1.5b --cases "1:$N:keep:corun" --steps 5 --share-gpu \
       "$@" --raw-from "bench/results/e2e_${TAG}ts_$N.json" --tag "${TAG}share_$N"
  kill $snap; runs "share$N"; keep_bench "e2e_${TAG}ts_$N*" "e2e_${TAG}share_$N*"; rm -rf runs/bench/e2e/run-*
}
PEER=(--shape qwen2-1.5b --prompt-len 512 --completion-len 256 --micro-batch 16 --tag "$TAG")
peer_pair() {  # peer_pair N PROMPTS STEPS TRL_LIMIT BRORL_LIMIT [--brorl-set K=V ...]: TRL's GRPO with vLLM
  # colocated (TRL_LIMIT 0: not run), then brorl, on the same shaped model, N, prompts a step, prompt 512 +
  # completion 256 tokens and optimizer steps; a TRL step cut at its limit still leaves its timed steps in the
  # results file; brorl's run logs kept
  local n=$1 prompts=$2 steps=$3 trl=$4 brorl=$5; shift 5
  [ "$trl" = 0 ] || LIMIT=$trl step "peers_trl$n" python3 -m bench.peers --peer trl --n "$n" \
       --prompts-per-step "$prompts" --steps "$steps" "${PEER[@]}"
  LIMIT=$brorl step "peers_brorl$n" python3 -m bench.peers --peer brorl --n "$n" --prompts-per-step "$prompts" \
       --steps "$steps" "${PEER[@]}" "$@"
  keep_bench "peers_${TAG}*"
  for d in runs/bench/peers/brorl-*; do [ -d "$d" ] || continue; mkdir -p "$R/bench/peers-$(basename "$d")"
    cp "$d"/metrics.jsonl "$d"/logs/*.log "$R/bench/peers-$(basename "$d")/" 2>/dev/null; done; pack
}
if [ "$GPUS" = 1 ] && [ "${ONE:-}" = share ]; then
  # one GPU, everything a one-GPU user meets, most wanted first (a lease may end before the last step): the loop
  # at N = 16 time-sharing then co-running (`--share-gpu`: `brorl run --one-gpu`'s settings, packed learner passes
  # and the in-place weight update included); brorl beside TRL's GRPO at N = 16 in the sharing mode that was
  # faster; then N = 512; then the gpu tests (weights over CUDA IPC, kernels, packing, presets, user data,
  # placement) and brorl beside TRL at N = 512
  share_pair 16
  mode=$(python3 -c "import json
runs = json.load(open('bench/results/e2e_${TAG}share_16.json'))['runs']
rate = {r['share_gpu']: r['samples_per_s'] for r in runs}
print(max(rate, key=rate.get))" || echo corun)
  echo "$mode" > "$R/peers_mode.txt"
  peer_pair 16 32 4 0 300 --brorl-set "actor.share_gpu=$mode"  # TRL's N = 16 row: an earlier lease's
  share_pair 512
  LIMIT=600 step gpu $PT tests/gpu/test_ipc_gpu.py tests/gpu/test_kernels_gpu.py tests/gpu/test_packing_gpu.py \
       tests/gpu/test_presets_gpu.py tests/gpu/test_user_data_gpu.py tests/gpu/test_placement_gpu.py
  peer_pair 512 1 3 200 300 --brorl-set "actor.share_gpu=$mode"
elif [ "$GPUS" = 1 ] && [ "${ONE:-}" = loop ]; then
  # one GPU, the packed loop (`--one-gpu`'s learner), what the lease of 2026-12-03 left, most wanted first: the
  # time-shared N = 16 run against that lease's raw rows (the bound, e2e_h200co_16.json); N = 512 at four prompts
  # a step (one prompt a step ties each step's generation and training to that prompt's length) co-running with its
  # raw phase, then time-shared (its file holds both and the bound; read from $R: each device call syncs the tree,
  # which removes what a step wrote under bench/results); every gpu test
  LIMIT=420 step ts_16 python3 -m bench.e2e --shape qwen2-1.5b --cases 1:16:keep:timeshare --steps 5 --share-gpu \
       --raw-from "bench/results/e2e_${TAG}co_16.json" --tag "${TAG}pack_16"
  runs ts16; keep_bench "e2e_${TAG}pack_16*"; rm -rf runs/bench/e2e/run-*
  (while sleep 30; do runs co2048; done) &
  snap=$!
  LIMIT=540 step co_512x4 python3 -m bench.e2e --shape qwen2-1.5b --cases 1:512:keep:corun --samples-per-step 2048 \
       --steps 6 --raw-steps 2 --share-gpu --tag "${TAG}co_512x4"
  kill $snap; runs co2048; keep_bench "e2e_${TAG}co_512x4*"; rm -rf runs/bench/e2e/run-*
  LIMIT=480 step ts_512x4 python3 -m bench.e2e --shape qwen2-1.5b --cases 1:512:keep:timeshare --samples-per-step \
       2048 --steps 6 --share-gpu --raw-from "$R/bench/e2e_${TAG}co_512x4.json" --tag "${TAG}pack_512x4"
  runs ts2048; keep_bench "e2e_${TAG}pack_512x4*"; rm -rf runs/bench/e2e/run-*
  LIMIT=900 step gpu $PT tests/gpu
elif [ "$GPUS" = 1 ] && [ "${ONE:-}" = rest ]; then
  # one GPU, what earlier leases left unmeasured, most wanted first: one weight update over CUDA IPC into an engine
  # on the learner's GPU, copied in place against vLLM's layerwise reload (the worker's split of each); realistic
  # lengths compiled with packed passes at 16k and 32k tokens (the compiler's recompilations logged); the gpu tests
  # (the compiled packed one is new; the in-place update runs in every engine of them); an 8B model on the one card
  # by LoRA (learner.lora_rank; Llama 3 8B's shape, random weights: the frozen bf16 base and rank-16 adapters
  # beside the engine, merged weights over CUDA IPC; recomputation on, as 8B's activations at 16k-token passes
  # would not fit beside the engine; uncompiled); then what an earlier lease measured, to repeat
  LIMIT=240 step wupd python3 -m bench.weight_update --shape qwen2-1.5b --backend ipc --updates 4 --tag "$TAG"
  keep_bench "weight_update_ipc_${TAG}*"
  LIMIT=420 step k_pcomp env TORCH_LOGS=recompiles python3 -m bench.learner --gpu --kernels packed-compiled --tag "$TAG"
  keep_bench "learner_gpu_${TAG}*"
  LIMIT=600 step gpu $PT tests/gpu/test_ipc_gpu.py tests/gpu/test_kernels_gpu.py tests/gpu/test_packing_gpu.py \
       tests/gpu/test_presets_gpu.py tests/gpu/test_user_data_gpu.py
  (while sleep 30; do runs lora; done) &
  snap=$!
  LIMIT=900 step lora8b python3 -m bench.e2e --shape llama3-8b --cases 1:16:keep --steps 4 --raw-steps 1 --share-gpu \
       --set learner.lora_rank=16 --set learner.lora_alpha=32 --set learner.lr=1e-5 \
       --set learner.activation_checkpointing=true --set learner.compile=false --tag "${TAG}lora8b"
  kill $snap; runs lora
  keep_bench "e2e_${TAG}lora8b*"
  LIMIT=330 step k_pack python3 -m bench.learner --gpu --kernels packed --tag "$TAG"
  keep_bench "learner_gpu_${TAG}*"
  peer_pair 512 1 3 200 300
elif [ "$GPUS" = 1 ] && [ "${ONE:-learner}" = timeshare ]; then
  # one GPU, how learner and engine share it (actor.share_gpu): share_pair at N = 16 and 512
  for N in 16 512; do share_pair "$N"; done
elif [ "$GPUS" = 1 ] && [ "${ONE:-learner}" = learner ]; then
  # one GPU, the learner's speed (issue: the whole loop at the speed of its engines): no recomputation at
  # 32k-token micro-batches with the LM head's logits kept for backward (profiled) and without; the presets'
  # gpu test; then the loop on the shared GPU with the compiler's recompilations logged (the learner's
  # `compiled_frames` and `mfu` per step in metrics.jsonl, the actor's engine gauge); then a user's data
  step mfu python3 -m bench.learner --gpu --tag "$TAG" --mfu-add '[
    {"backend": "torch", "activation_checkpointing": false, "micro_batch_tokens": 32768, "logprob_recompute": false, "profile": true},
    {"backend": "torch", "activation_checkpointing": false, "micro_batch_tokens": 32768}]'
  keep_bench "learner_gpu_${TAG}*"
  step presets $PT tests/gpu/test_presets_gpu.py
  (while sleep 30; do runs; done) &  # a run that stalls still shows why
  snap=$!
  LIMIT=600 step e2e env TORCH_LOGS=recompiles python3 -m bench.e2e --shape qwen2-1.5b --cases 1:16:keep --steps 6 \
       --raw-steps 2 --share-gpu --tag "${TAG}shared"
  kill $snap; runs
  keep_bench "e2e_${TAG}shared*"
  step userdata $PT tests/gpu/test_user_data_gpu.py
elif [ "$GPUS" = 1 ] && [ "${ONE:-}" = peers ]; then
  # one GPU, brorl next to TRL's GRPO trainer (bench/peers.py): N = 16 × 32 prompts, then N = 512 × 1 prompt
  peer_pair 16 32 4 270 300
  peer_pair 512 1 3 200 240
elif [ "$GPUS" = 1 ]; then  # ONE=engine
  # 1. the paper's presets' learner, then the learner's MFU at the preset's best single-GPU settings,
  #    with the compiler's recompilations logged
  step presets $PT tests/gpu/test_presets_gpu.py
  step mfu env TORCH_LOGS=recompiles python3 -m bench.learner --gpu --tag "$TAG" --mfu-add \
       '[{"backend": "torch", "activation_checkpointing_fraction": 0.5, "micro_batch_tokens": 32768}]'
  keep_bench "learner_gpu_${TAG}*"
  # 2. FP8 rollouts: the engine's speed with vLLM's FP8 weights against bf16, same prompts and settings (vLLM's
  #    quantization configs import compressed-tensors, which needs loguru and frozendict: install those
  #    three pure-Python wheels with vLLM's)
  step actor_bf16 $ACT --tag "${TAG}_bf16"
  step actor_fp8 $ACT --tag "${TAG}_fp8" --engine-kw '{"quantization": "fp8"}'
  keep_bench "actor_${TAG}_bf16*" "actor_${TAG}_fp8*"
  # 3. a user's model and data through `brorl run`, learner and actor sharing the one GPU
  step userdata $PT tests/gpu/test_user_data_gpu.py
  # 4. an FP8 engine taking a bf16 weight update (needs the compressed-tensors wheels above)
  step fp8 $PT tests/gpu/test_fp8_gpu.py
elif [ "$GPUS" -ge 4 ]; then
  # four GPUs (the issue's balanced fleet, item 5): the simulator's pick of the learner : actor split, then the
  # loop at steps that keep the engine full (2,048 samples: N = 16 × 128 prompts, N = 512 × 4), with the
  # learner on 3 GPUs and 1 actor (actor-bound: P1c against one raw engine) and on 2 GPUs with 2 actors;
  # then every gpu test (the tensor-parallel actor's needs 3 GPUs), the presets' and a user's data tests
  # (the simulator at the rates of the 1 + 1 H200 loop at N = 512, bench.e2e's job shape: budgets per prompt,
  # log-normal σ = 1 around 256 capped at 1,024, 4 prompts a step and a request; it ran on the CPU too, 2026-11-30:
  # 3 learner GPUs + 1 actor 105 samples/s, 2 + 2 105, 1 learner GPU + 3 actors 92 — docs/fleet-simulator.md)
  step fleet python3 -m cli simulate-fleet --gpus 4 --calibration h200-1.5b --n 512 --prompts-per-step 4 \
       --prompts-per-request 4 --max-staleness 1 --in-flight keep --mean-tokens 256 --length-sigma 1.0 \
       --max-tokens 1024 --lengths prompt --keep-rate 1.0 --steps 12 --seeds 3 --out "$R/fleet"
  E2E=${E2E:-${TAG}x4}
  (while sleep 30; do runs; done) &
  snap=$!
  step e2e_3l env CUDA_VISIBLE_DEVICES=0,1,2,3 TORCH_LOGS=recompiles python3 -m bench.e2e --shape qwen2-1.5b \
       --learner-gpus 3 --cases 1:16:keep,1:512:keep --samples-per-step 2048 --steps 8 --raw-steps 2 --tag "${E2E}_3l"
  kill $snap; runs 3l; keep_bench "e2e_${E2E}_3l*"
  step e2e_2l env CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m bench.e2e --shape qwen2-1.5b --learner-gpus 2 \
       --cases 2:16:keep,2:512:keep --samples-per-step 2048 --steps 8 --raw-steps 2 --tag "${E2E}_2l"
  runs 2l; keep_bench "e2e_${E2E}_2l*"
  LIMIT=900 step gpu env CUDA_VISIBLE_DEVICES=0,1,2 $PT tests/gpu/test_gpu.py tests/gpu/test_in_flight_gpu.py \
       tests/gpu/test_placement_gpu.py tests/gpu/test_fp8_gpu.py
  step presets env CUDA_VISIBLE_DEVICES=0 $PT tests/gpu/test_presets_gpu.py &
  a=$!
  step userdata env CUDA_VISIBLE_DEVICES=3 $PT tests/gpu/test_user_data_gpu.py &
  b=$!
  wait $a $b
else
  # two or three GPUs. 2026-11-30's first lease measured the 1 + 1 loop (bench/results/e2e_h200x2b*) and passed the
  # 2-GPU tests but ran out of time in the presets' and user-data tests. So: every gpu test first (the code that
  # resolves the issue must pass them; the tensor-parallel actor over gloo shares GPU 0 with the learner, over NCCL
  # it needs 3 GPUs), then the loop at N = 16 (the learner's new micro-batch cuts against e2e_h200x2b), at N = 512
  # with 4 prompts a step (2,048 samples, so the engine does not drain to one prompt's longest completion), and at
  # N = 16 with 2,048-sample steps (P3 at one step size); with FP8=1 also FP8 rollouts through the loop.
  # The engine-core processes of the raw engine and the loop's actor are profiled with py-spy during the N = 512
  # run (is a loop engine step slower than a raw one at the same batch because of its process's CPU time?)
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$R/apps_before.csv" 2>&1
  K=(); [ "$GPUS" -lt 3 ] && K=(-k "not (tensor_parallel and nccl)")
  if [ "${TESTS:-1}" = 1 ]; then  # TESTS=0: the code has not changed since a lease that passed them
    step presets env CUDA_VISIBLE_DEVICES=0 $PT tests/gpu/test_presets_gpu.py &
    a=$!
    step userdata env CUDA_VISIBLE_DEVICES=1 $PT tests/gpu/test_user_data_gpu.py &
    b=$!
    wait $a $b  # not a bare `wait`: it would wait for the nvidia-smi sampler too, forever
    LIMIT=700 step gpu env CUDA_VISIBLE_DEVICES=0,1 $PT tests/gpu/test_gpu.py tests/gpu/test_in_flight_gpu.py \
         tests/gpu/test_placement_gpu.py tests/gpu/test_fp8_gpu.py "${K[@]}"
  fi
  # (E2E: the results' tag, e.g. E2E=h200x2c so a rerun does not overwrite a committed run's files)
  E2E=${E2E:-${TAG}x2}
  LOOP=(--shape qwen2-1.5b --set learner.backend=torch --set learner.activation_checkpointing=false
        --set learner.micro_batch_tokens=32768)
  # N = 16 at 512-sample steps, as e2e_h200x2b measured it before the learner's passes were cut for the fewest
  # positions (padding_frac 19-31 %, MFU 31 % there): what the cuts buy in the loop
  step e2e_16 env CUDA_VISIBLE_DEVICES=0,1 python3 -m bench.e2e "${LOOP[@]}" --cases 1:16:keep --steps 6 \
       --raw-steps 2 --tag "${E2E}_16"
  runs n16; keep_bench "e2e_${E2E}_16.*"; rm -rf runs/bench/e2e/run-*
  (while sleep 30; do runs s2048; done) &
  snap=$!
  spy s2048 &
  spied=$!
  step e2e_2048 env CUDA_VISIBLE_DEVICES=0,1 TORCH_LOGS=recompiles python3 -m bench.e2e "${LOOP[@]}" \
       --cases 1:512:keep --samples-per-step 2048 --steps 6 --raw-steps 2 --tag "${E2E}_2048"
  kill $snap $spied; runs s2048; keep_bench "e2e_${E2E}_2048*"; rm -rf runs/bench/e2e/run-*
  step e2e_2048_16 env CUDA_VISIBLE_DEVICES=0,1 python3 -m bench.e2e "${LOOP[@]}" --cases 1:16:keep \
       --samples-per-step 2048 --steps 5 --raw-steps 2 --tag "${E2E}_2048_16"
  runs s2048_16; keep_bench "e2e_${E2E}_2048_16*"; rm -rf runs/bench/e2e/run-*
  if [ "${FP8:-0}" = 1 ]; then  # measured on 2026-11-30 (e2e_h200x2c_fp8): FP8=1 to run it again
    (while sleep 30; do runs fp8; done) &
    snap=$!
    step e2e_fp8 env CUDA_VISIBLE_DEVICES=0,1 python3 -m bench.e2e "${LOOP[@]}" --cases 1:16:keep --steps 5 \
         --raw-steps 2 --set actor.quantization=fp8 --tag "${E2E}_fp8"
    kill $snap; runs fp8; keep_bench "e2e_${E2E}_fp8*"; rm -rf runs/bench/e2e/run-*
  fi
fi
kill $smi 2>/dev/null
pack
touch "$R/ALLDONE"
