# syntax=docker/dockerfile:1
# Omaticaya node agent image.
#
#   docker build -t REGISTRY/omaticaya:0.1.0 . && docker push REGISTRY/omaticaya:0.1.0
#
# Stage 1 builds the project's wheel; stage 2 installs only that wheel (and its dependencies from
# the package index) on a clean python:3.11-slim, adds the recorded traces under
# /opt/omaticaya/traces/ (the chart's `trace` value) and runs as the unprivileged uid 65532.
# Without a Docker daemon, scripts/build-image builds the equivalent image from Debian packages.

FROM python:3.11-slim AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY omaticaya_py ./omaticaya_py
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .
# The recorded traces, so that the chart's `trace` value can replay one on a cluster without GPUs.
COPY tests/data/h100-trace.json tests/data/h100-mig-trace.json tests/data/mig-mixed-trace.json \
     tests/data/multi-gpu-trace.json tests/data/faults-trace.json ./traces/


FROM python:3.11-slim

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

# The wheel is bind-mounted from the builder, so it never lands in a layer.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/omaticaya-*.whl \
    && groupadd --system --gid 65532 omaticaya \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin omaticaya \
    && omaticaya --help > /dev/null

COPY --from=builder /src/traces/ /opt/omaticaya/traces/

USER 65532:65532

EXPOSE 9402

ENTRYPOINT ["omaticaya"]
CMD ["run"]
