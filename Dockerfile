# syntax=docker/dockerfile:1
# Omaticaya node agent image.
#
#   docker build -t REGISTRY/omaticaya:0.1.0 . && docker push REGISTRY/omaticaya:0.1.0
#
# Stage 1 builds the project's wheel with the build backend of requirements/build.lock; stage 2
# installs the dependencies of requirements/image.lock (every file checked against its sha256:
# --require-hashes), then that wheel alone (--no-deps), on a clean python:3.11-slim-bookworm (the
# Debian release scripts/build-image builds from), adds the recorded traces under
# /opt/omaticaya/traces/ (the chart's `trace` value) and the test stand-in of
# nvidia-cuda-mps-control at /opt/omaticaya/standin/ (OMATICAYA_MPS_CONTROL, clusters without
# GPUs), and runs as the unprivileged uid 65532.
# Without a Docker daemon, scripts/build-image builds the equivalent image from Debian packages.
#
# The base image is named by tag, not digest: no registry that serves it could be reached where
# this file was written, and a digest copied from elsewhere would be unverified. Pin it where it
# is built: `docker buildx imagetools inspect python:3.11-slim-bookworm` gives the digest of the
# index, to append as python:3.11-slim-bookworm@sha256:<digest> to both FROM lines
# (docs/chart.md, "Building the image").

FROM python:3.11-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY requirements/build.lock ./requirements/
RUN pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements/build.lock
COPY pyproject.toml README.md ./
COPY omaticaya_py ./omaticaya_py
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .
# The recorded traces, so that the chart's `trace` value can replay one on a cluster without GPUs.
COPY tests/data/h100-trace.json tests/data/h100-mig-trace.json tests/data/mig-mixed-trace.json \
     tests/data/multi-gpu-trace.json tests/data/multi-gpu-lost-trace.json \
     tests/data/faults-trace.json tests/data/hgx-h100-topo-trace.json \
     tests/data/pcie-nvlink-bridge-topo-trace.json tests/data/workstation-4gpu-topo-trace.json \
     ./traces/
# The test stand-in of nvidia-cuda-mps-control (python3, stdlib only), for `omaticaya mps` on a
# cluster without GPUs: used only where OMATICAYA_MPS_CONTROL names it, never on PATH.
COPY devtools/mps-standin/nvidia-cuda-mps-control ./standin/


FROM python:3.11-slim-bookworm

ARG VERSION=0.1.0

LABEL org.opencontainers.image.title="omaticaya" \
      org.opencontainers.image.description="Live NVIDIA GPU state (NVML) on Kubernetes Node labels, for scheduling" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/omaticaya/omaticaya" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="Omaticaya developers"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/tmp \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility

# The lock and the wheel are bind-mounted, so they never land in a layer. `pip check`: the lock
# satisfies every requirement of the wheel.
RUN --mount=type=bind,source=requirements/image.lock,target=/tmp/image.lock \
    --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/image.lock \
    && pip install --no-cache-dir --no-deps --no-index /wheels/omaticaya-*.whl \
    && pip check \
    && groupadd --system --gid 65532 omaticaya \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin omaticaya \
    && omaticaya --help > /dev/null

COPY --from=builder /src/traces/ /opt/omaticaya/traces/
COPY --from=builder --chmod=0755 /src/standin/ /opt/omaticaya/standin/

USER 65532:65532

EXPOSE 9402

ENTRYPOINT ["omaticaya"]
CMD ["run"]
