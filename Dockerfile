# syntax=docker/dockerfile:1
# Omaticaya node agent image.
#
#   docker build -t REGISTRY/omaticaya:0.1.0 . && docker push REGISTRY/omaticaya:0.1.0
#
# Stage 1 builds the project's wheel with the build backend of requirements/build.lock; stage 2
# builds omaticaya-driver-files (cmd/driverfiles, our Go module over the NVIDIA container
# toolkit's pkg/nvcdi, at the versions its go.mod and go.sum pin; cgo on, as
# scripts/build-driver-files builds it) with the Go release go.mod names, on the same Debian
# release, so that the binary links the glibc of the final image; stage 3 installs the
# dependencies of requirements/image.lock (every file checked against its sha256:
# --require-hashes), then that wheel alone (--no-deps), on a clean python:3.11-slim-bookworm (the
# Debian release scripts/build-image builds from), adds omaticaya-driver-files to
# /usr/local/bin (the DRA plugin runs it: docs/dra.md), the recorded traces under
# /opt/omaticaya/traces/ (the chart's `trace` value) and the test stand-in of
# nvidia-cuda-mps-control at /opt/omaticaya/standin/ (OMATICAYA_MPS_CONTROL, clusters without
# GPUs), and runs as the unprivileged uid 65532.
# Without a Docker daemon, scripts/build-image builds the equivalent image from Debian packages.
#
# The base images are named by tag, not digest: no registry that serves them could be reached
# where this file was written, and a digest copied from elsewhere would be unverified. Pin them
# where they are built: `docker buildx imagetools inspect python:3.11-slim-bookworm` (and
# golang:1.26-bookworm) gives the digest of the index, to append as
# python:3.11-slim-bookworm@sha256:<digest> to both python FROM lines (and
# golang:1.26-bookworm@sha256:<digest> to the Go one) (docs/chart.md, "Building the image").

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


FROM golang:1.26-bookworm AS driverfiles

# the modules first (a layer of their own, from the module proxy, checked against go.sum), then
# the sources; GOTOOLCHAIN=local: the image's Go, never one go.mod would download
ENV CGO_ENABLED=1 \
    GOFLAGS=-mod=readonly \
    GOTOOLCHAIN=local

WORKDIR /src
COPY cmd/driverfiles/go.mod cmd/driverfiles/go.sum ./
RUN go mod download
COPY cmd/driverfiles/*.go ./
RUN go build -trimpath -ldflags "-s -w" -o /out/omaticaya-driver-files .


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

# omaticaya-driver-files on PATH, where the DRA plugin looks for it (omaticaya_py/dra/driverfiles.py)
COPY --from=driverfiles --chmod=0755 /out/omaticaya-driver-files /usr/local/bin/

# The lock and the wheel are bind-mounted, so they never land in a layer. `pip check`: the lock
# satisfies every requirement of the wheel. `omaticaya-driver-files -help`: the binary runs on
# this image's glibc.
RUN --mount=type=bind,source=requirements/image.lock,target=/tmp/image.lock \
    --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --require-hashes --only-binary=:all: -r /tmp/image.lock \
    && pip install --no-cache-dir --no-deps --no-index /wheels/omaticaya-*.whl \
    && pip check \
    && groupadd --system --gid 65532 omaticaya \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin omaticaya \
    && omaticaya --help > /dev/null \
    && omaticaya-driver-files -help 2> /dev/null

COPY --from=builder /src/traces/ /opt/omaticaya/traces/
COPY --from=builder --chmod=0755 /src/standin/ /opt/omaticaya/standin/

USER 65532:65532

EXPOSE 9402

ENTRYPOINT ["omaticaya"]
CMD ["run"]
