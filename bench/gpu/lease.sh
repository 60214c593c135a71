#!/usr/bin/env bash
# One GPU lease as one rerunnable plan (README "GPU machines"): the gpu tests, then the whole-loop benchmark,
# on a 2-GPU machine whose vLLM and extra wheels are installed under /tmp/site. Started in the background by the
# call that installs the last staged part:
#   setsid nohup bash bench/gpu/lease.sh /tmp/r > /tmp/plan.log 2>&1 &
# Later calls wait for /tmp/r/ALLDONE and fetch /tmp/r/results.tgz. Each step writes NAME.log, NAME.rc and
# NAME.secs; nvidia-smi is sampled every 5 s (smi.csv). Independent steps run on separate GPUs side by side.
set -u
R=${1:-/tmp/r}
mkdir -p "$R"
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
       TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 5 > "$R/smi.csv" 2>&1 &
smi=$!
step() {  # step NAME COMMAND...: run it, keep its log, exit status and seconds; pack what is there so far
  local name=$1; shift
  local t0=$(date +%s)
  "$@" > "$R/$name.log" 2>&1
  echo $? > "$R/$name.rc"
  echo $(( $(date +%s) - t0 )) > "$R/$name.secs"
  pack
}
pack() { tar czf "$R/results.tgz.part" -C "$R" --exclude 'results.tgz*' . 2>/dev/null && mv "$R/results.tgz.part" "$R/results.tgz"; }
python3 -c "import torch, vllm; print(torch.__version__, vllm.__version__, torch.cuda.device_count())" > "$R/versions.txt" 2>&1
# 1. the paper's presets' learner on GPU 0, beside a user's model and data through `brorl run` on GPU 1
step presets env CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_presets_gpu.py &
a=$!
step userdata env CUDA_VISIBLE_DEVICES=1 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_user_data_gpu.py &
b=$!
wait $a $b  # not a bare `wait`: it would wait for the nvidia-smi sampler too, forever
# 2. the other gpu tests on both GPUs (NCCL, in-flight updates, placement)
step gpu env CUDA_VISIBLE_DEVICES=0,1 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu.py \
     tests/gpu/test_in_flight_gpu.py tests/gpu/test_placement_gpu.py
# 3. the whole loop against the raw engine (1 learner + 1 actor), with the compiler's recompilations logged
step e2e env CUDA_VISIBLE_DEVICES=0,1 TORCH_LOGS=recompiles python3 -m bench.e2e --shape qwen2-1.5b \
     --cases 1:16:keep,1:512:keep --steps 8 --raw-steps 4 --tag "${TAG:-h200x2}"
mkdir -p "$R/bench"
cp bench/results/e2e_"${TAG:-h200x2}"* "$R/bench/" 2>/dev/null
for d in runs/bench/e2e/*/logs; do n=$(basename "$(dirname "$d")"); cp "$d/learner.log" "$R/bench/$n-learner.log" 2>/dev/null; done
kill $smi 2>/dev/null
pack
touch "$R/ALLDONE"
