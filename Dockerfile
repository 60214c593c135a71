# One image, every role: `docker run IMAGE actor --learner tcp://HOST:5555 ...`,
# `docker run IMAGE learner ...`, `docker run IMAGE run` (all roles on one machine).
# GPU build: CUDA runtime base + the `gpu` extra (vLLM from PyPI brings its matching torch).
FROM nvidia/cuda:12.9.1-cudnn-runtime-ubuntu24.04

LABEL org.opencontainers.image.title="brorl" \
      org.opencontainers.image.description="Asynchronous large-N RL from verifiable rewards (BroRL)" \
      brorl.roles="run actor learner eval sft keys verifiers simulate make-tiny-model config"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VLLM_NO_USAGE_STATS=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev gcc g++ git bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && python3.12 -m venv /opt/brorl
ENV PATH=/opt/brorl/bin:$PATH

WORKDIR /app
# Dependencies first (cached layer), then the source.
COPY pyproject.toml README.md ./
COPY cli cli
COPY actors actors
COPY learner learner
COPY tinymodel tinymodel
COPY evaluation evaluation
COPY transport transport
COPY verifiers verifiers
COPY theory theory
COPY config config
RUN pip install --upgrade pip && pip install ".[gpu]"

# Ports: work dispatch (ROUTER), rollout stream (PULL), control (PUB) — see config/schema.py.
EXPOSE 5555 5556 5557
ENTRYPOINT ["brorl"]
CMD ["--help"]
