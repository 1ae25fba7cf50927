#!/usr/bin/env bash
# devtools/mps-limit-probe.sh: on a GPU machine (root), can a client's
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT raise the control daemon's default, or only lower it?
# (docs/device-plugin.md "What enforces a slice": the agent's daemons get the whole GPU as their
# default because a client's own limit is said to only lower it.)
#
# One MPS control daemon for GPU 0 with a default pinned-memory limit of 4 GiB
# (set_default_device_pinned_mem_limit 0 4096M), then tests/mps_client.py (stdlib + libcuda)
# trying 3, 6 and 10 GiB (each freed at once) with no limit of its own, with 0=8192M (above the
# default) and with 0=2048M (below it); each prints what cuMemGetInfo says in its fresh context.
# Writes $OUT/mps-limit-probe.txt (default /tmp). Exit 2 when a tool is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
LOG=$OUT/mps-limit-probe.txt
for d in /usr/local/nvidia/bin /usr/lib/nvidia/bin; do [ -d "$d" ] && PATH=$PATH:$d; done
export PATH
PY=${GPU_CHECK_PYTHON:-python3}
command -v nvidia-cuda-mps-control >/dev/null || { echo "mps-limit-probe: no nvidia-cuda-mps-control on PATH" | tee "$LOG"; exit 2; }
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null) || uuid=
[ -n "$uuid" ] || { echo "mps-limit-probe: no GPU 0 (nvidia-smi)" | tee "$LOG"; exit 2; }
dir=$(mktemp -d /tmp/mps-probe.XXXXXX)
export CUDA_VISIBLE_DEVICES=$uuid CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
ctl() { echo "$*" | timeout 10 nvidia-cuda-mps-control; }
{
    echo "== GPU 0: $uuid; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0)"
    nvidia-cuda-mps-control -d && sleep 0.5
    echo "set_default_device_pinned_mem_limit 0 4096M -> $(ctl set_default_device_pinned_mem_limit 0 4096M)"
    echo "get_default_device_pinned_mem_limit 0 -> $(ctl get_default_device_pinned_mem_limit 0)"
    for limit in "" 0=8192M 0=2048M; do
        echo "== client with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=${limit:-(unset)}"
        if [ -n "$limit" ]; then
            CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$limit timeout 60 "$PY" tests/mps_client.py 3072 6144 10240
        else
            timeout 60 "$PY" tests/mps_client.py 3072 6144 10240
        fi
        echo "rc=$?"
    done
    echo "get_server_list -> $(ctl get_server_list)"
    ctl quit
    sleep 1
    echo "== control log:"; tail -20 "$dir/log/control.log" 2>&1
    echo "== server log:"; tail -20 "$dir/log/server.log" 2>&1
} 2>&1 | tee "$LOG"
rm -rf "$dir"
