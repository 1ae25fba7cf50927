#!/usr/bin/env bash
# devtools/gpu-check.sh: every real-GPU check of the project in one go, on a machine with an
# NVIDIA GPU and no network (as root for the MPS test), from wheels built beforehand elsewhere.
#
#   devtools/gpu-check.sh --wheels     # here, with network: .whl/ (cp312 x86-64 wheels of the
#                                      # agent's and the tests' dependencies, at .venv's versions)
#                                      # and .whl/nvml-testlib/ (the NVML test library + cJSON)
#   devtools/gpu-check.sh              # there: writes its logs under $OUT (default /tmp/gpu-check)
#
# What it runs, each step logged to its own file under $OUT (summary.txt says what passed):
#   env.txt     nvidia-smi, the driver's libraries and MPS programs, the venv's packages
#   bench.txt   devtools/gpu_bench.py (the tick on real NVML with GPM and with GPM off, each
#               utilisation call timed idle and busy), then bench/tick.py --nvml on the NVML
#               test library replaying the trace just recorded and the 8-GPU trace (same CPU)
#   trace.json  omaticaya record (12 s, 250 ms; an all-SM kernel from 4 s to 8 s) + show
#   driver-files.txt  devtools/driver_files_gpu.py: nvidia-smi and a CUDA kernel (PTX JIT-compiled by
#               the driver) in a new root where the driver's files are only the DRA plugin's CDI
#               mounts (omaticaya-driver-files, carried in .whl/; every other driver file and
#               /etc/ld.so.cache masked; no hook, no ldconfig): issue 52, item 9
#   tests.txt   pytest -m nvml -s -v tests/sources/test_nvml.py tests/sources/test_nvml_gpu_topology.py
#               tests/mps/test_mps_nvml.py (+ junit.xml)
# GPU_CHECK_ONLY_TESTS=1: the tests alone; GPU_CHECK_TESTS="tests/x.py::test_y": those instead.
# Fails fast, saying why, when the wheels, python3 (3.12, as the wheels), or the GPU are missing
# (GPU_CHECK_NO_GPU_OK=1 goes on without a GPU: the tests then skip; for trying the script out).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHL=$ROOT/.whl
PYVER=3.12

if [ "${1:-}" = "--wheels" ]; then
    set -e
    rm -rf "$WHL" && mkdir -p "$WHL/nvml-testlib"
    .venv/bin/pip freeze | grep -v '^-e\|^#' >"$WHL/constraints.txt"
    printf '%s\n' nvidia-ml-py kubernetes APScheduler loguru pydantic pydantic-settings \
        prometheus-client tenacity starlette uvicorn grpcio protobuf watchdog rich orjson pytest \
        PyYAML >"$WHL/requirements.txt"
    plat=()
    for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_5; do
        plat+=(--platform "${p}_x86_64")
    done
    .venv/bin/pip download -q --only-binary=:all: --python-version $PYVER --implementation cp \
        --abi cp${PYVER/./} "${plat[@]}" -d "$WHL" -r "$WHL/requirements.txt" -c "$WHL/constraints.txt"
    lib=$(bash tests/nvml/build)
    cp "$lib/libnvidia-ml.so.1" "$WHL/nvml-testlib/"
    cp -L "$(ldconfig -p | awk '/libcjson.so.1 /{print $NF; exit}')" "$WHL/nvml-testlib/"
    # the DRA plugin's lister of the driver's files (cmd/driverfiles; Go, built here)
    cp "$(scripts/build-driver-files)" "$WHL/omaticaya-driver-files"
    du -sh "$WHL"
    exit 0
fi

OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "gpu-check: $*" | tee -a "$SUMMARY"; }
die() { say "STOP: $*"; exit 2; }
step() {  # step NAME LOG TIMEOUT_S CMD...: run, log, record pass/fail
    local name=$1 log=$2 limit=$3; shift 3
    local t0=$SECONDS
    echo "== $name: $*" >>"$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    say "$name: rc=$rc ($((SECONDS - t0)) s)$([ $rc = 124 ] && echo ", TIMED OUT after $limit s")"
    return $rc
}

# -- preflight: fail fast ---------------------------------------------------------------------
ls "$WHL"/*.whl >/dev/null 2>&1 || die "no wheels in $WHL: build them where pip works with 'devtools/gpu-check.sh --wheels' (and carry .whl)"
pyver() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
PY=${GPU_CHECK_PYTHON:-$(command -v python3)}
[ -n "$PY" ] || die "no python3 on PATH"
if [ "$(pyver "$PY")" != $PYVER ] && [ -z "${GPU_CHECK_PYTHON:-}" ] && command -v python$PYVER >/dev/null; then
    PY=$(command -v python$PYVER)
fi
[ "$(pyver "$PY")" = $PYVER ] || die "$PY is Python $(pyver "$PY"); the wheels are for $PYVER (GPU_CHECK_PYTHON=python$PYVER)"
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip to install the wheels with"
# the driver's programs and libraries where the image keeps them (read-only /usr/local/nvidia)
for d in /usr/local/nvidia/bin /usr/lib/nvidia/bin; do [ -d "$d" ] && PATH=$PATH:$d; done
export PATH
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    [ -n "${GPU_CHECK_NO_GPU_OK:-}" ] || die "no GPU here: nvidia-smi missing or failing ($(nvidia-smi -L 2>&1 | head -1))"
    say "no GPU (GPU_CHECK_NO_GPU_OK set): going on; the GPU tests will skip"
fi

ENV=$OUT/env.txt
{
    echo "== date: $(date -u '+%F %T UTC'); $(uname -a); id: $(id)"
    nvidia-smi 2>&1
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,compute_mode,mig.mode.current,clocks.max.sm --format=csv 2>&1
    echo "== nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo MISSING); -server: $(command -v nvidia-cuda-mps-server || echo MISSING)"
    echo "== unshare: $(command -v unshare || echo MISSING); mount: $(command -v mount || echo MISSING)"
    echo "== ld cache:"; ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvidia-ml\.so' || echo "  (libcuda/libnvidia-ml not in the ld cache)"
    echo "== LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "== /dev/shm: $(findmnt -no FSTYPE,SIZE,OPTIONS /dev/shm 2>&1)"
    echo "== /tmp/nvidia-mps: $(ls -la /tmp/nvidia-mps 2>&1 | head -3)"
    echo "== cpu: $(grep -m1 'model name' /proc/cpuinfo); $(nproc) cores"
} >"$ENV" 2>&1
say "env: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1 | head -1)"
# The MPS daemon gets PATH and HOME only (omaticaya_py/mps/daemon.py), as in a container where the
# NVIDIA runtime has put the driver's libraries in the ld cache: do the same here when the image
# only has them on LD_LIBRARY_PATH, and say so.
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }} /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        if [ -e "$d/libcuda.so.1" ]; then
            echo "$d" >/etc/ld.so.conf.d/zz-gpu-check.conf && ldconfig \
                && say "libcuda.so.1 was not in the ld cache: added $d (as the NVIDIA runtime does)"
            break
        fi
    done
fi

# -- the venv: the wheels only, isolated from the image's packages -----------------------------
VENV=/tmp/gpu-check-venv
rm -rf "$VENV"
if "$PY" -m venv --without-pip "$VENV" 2>>"$ENV"; then
    VPY=$VENV/bin/python
    SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
else
    say "python -m venv failed (see env.txt): installing into /tmp/gpu-check-site on PYTHONPATH"
    VPY=$PY SITE=/tmp/gpu-check-site
    export PYTHONPATH=$SITE
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHL"/*.whl >>"$ENV" 2>&1 || die "pip install of the wheels failed (env.txt)"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
"$VPY" -c 'import pynvml, grpc, loguru, pydantic_settings, yaml, pytest, omaticaya_py.agent, omaticaya_py.mps' \
    >>"$ENV" 2>&1 || die "the venv cannot import the agent (env.txt)"
{ echo "== venv: $VPY"; "$VPY" -m pip --version 2>/dev/null; ls "$SITE" | grep -i dist-info; } >>"$ENV" 2>&1
say "venv: $VPY ($("$VPY" -c 'import pynvml, platform; print("Python", platform.python_version(), "nvidia-ml-py", __import__("importlib.metadata").metadata.version("nvidia-ml-py"))'))"

status=0
if [ -z "${GPU_CHECK_ONLY_TESTS:-}" ]; then
# -- the bench: real NVML, before/after GPM; then the NVML test library on this CPU -------------
BENCH=$OUT/bench.txt
step "bench: devtools/gpu_bench.py" "$BENCH" 120 "$VPY" devtools/gpu_bench.py || status=1

# -- a recorded trace (with GPM), a kernel on every SM from 4 s to 8 s --------------------------
OMA=(-c 'import sys; from omaticaya_py.cli import console_main; sys.exit(console_main())')
LOAD=$OUT/record.txt
( sleep 4; "$VPY" -c 'from tests.gpu_kernels import Cuda; c = Cuda.open(0); c and (c.spin(4.0, blocks=c.sm_count * 8, threads=256), c.close())' ) >>"$LOAD" 2>&1 &
load=$!
step "record: omaticaya record --duration 12s" "$LOAD" 60 "$VPY" "${OMA[@]}" record --duration 12s --interval 250ms -o "$OUT/trace.json" || status=1
wait $load
step "show: omaticaya show --trace trace.json --trace-at 7" "$LOAD" 30 "$VPY" "${OMA[@]}" show --trace "$OUT/trace.json" --trace-at 7 || status=1

TESTLIB=$WHL/nvml-testlib
for trace in "$OUT/trace.json" "$ROOT/tests/data/multi-gpu-trace.json"; do
    [ -f "$trace" ] || continue
    step "bench: bench/tick.py --nvml on the NVML test library ($(basename "$trace"))" "$BENCH" 60 \
        env LD_LIBRARY_PATH="$TESTLIB" NVML_TESTLIB_TRACE="$trace" "$VPY" bench/tick.py --nvml --budget-s 5 || status=1
done

# -- a DRA claim's container: the driver's files from the CDI mounts alone (issue 52, item 9) -----
step "driver files: nvidia-smi and a CUDA kernel with only the DRA plugin's mounts" \
    "$OUT/driver-files.txt" 120 env OMATICAYA_DRIVER_FILES_TOOL="$WHL/omaticaya-driver-files" \
    "$VPY" devtools/driver_files_gpu.py --python "$VPY" || status=1
grep -E '^(nvidia-smi|cuda|driver files)' "$OUT/driver-files.txt" | tail -5 >>"$SUMMARY"
fi  # GPU_CHECK_ONLY_TESTS

# -- the GPU tests ------------------------------------------------------------------------------
TESTS=${GPU_CHECK_TESTS:-tests/sources/test_nvml.py tests/sources/test_nvml_gpu_topology.py tests/mps/test_mps_nvml.py}
step "tests: pytest -m nvml $TESTS" "$OUT/tests.txt" "${GPU_CHECK_TEST_TIMEOUT_S:-300}" \
    "$VPY" -m pytest -p no:cacheprovider -m nvml -s -v -rA --junitxml="$OUT/junit.xml" \
    $TESTS || status=1
grep -E '^(PASSED|FAILED|SKIPPED|ERROR) |^tests/.*(PASSED|FAILED|SKIPPED|ERROR)|passed|failed' "$OUT/tests.txt" | tail -20 >>"$SUMMARY"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >>"$SUMMARY" 2>&1
say "done: status $status; logs in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $status
