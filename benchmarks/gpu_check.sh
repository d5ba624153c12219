#!/usr/bin/env bash
# The GPU checks of the CUDA backend, on a one-GPU machine without a package index, in under 8 minutes:
#
#     bash benchmarks/gpu_check.sh [OUTDIR]        (default: $OUT, else ./gpu_out)
#
# The machine must have PyTorch with CUDA, NVIDIA's nvrtc/cublas/cudnn (and nccl) wheels, numpy, onnx, onnxruntime,
# pluggy and pytest; anything else (cffi and pycparser here) is installed from wheels in .whl/ of the checkout
# (`pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl cffi pycparser`).
# Each stage writes its log to OUTDIR; a failing stage is reported and the next one runs. Stages: install, singa info,
# kernel precompilation, the CUDA package's tests, the backend conformance suite on cuda, the seeds' and graph-mode
# tests on cuda, onnx's light real models on cuda, benchmarks/gpu_check.py (matrix products, training against the CPU
# backend's losses and PyTorch's time), the NCCL communicator's check when it is installed.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUTDIR=${1:-${OUT:-gpu_out}}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
start=$SECONDS
failed=()
ONLY=${GPU_CHECK_STAGES:-}  # a comma-separated subset of the stage names, to re-run some of them
stage() {  # stage NAME SECONDS COMMAND... : run with a time limit, log to OUTDIR/NAME.log
    local name=$1 limit=$2
    shift 2
    case ",$ONLY," in ",,"|*",$name,"*) ;; *) return 0 ;; esac
    echo "==> [$((SECONDS - start))s] $name" | tee -a "$OUTDIR/stages.log"
    if ! timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1; then
        failed+=("$name")
        echo "    FAILED (exit $?): see $name.log" | tee -a "$OUTDIR/stages.log"
    fi
    tail -n 3 "$OUTDIR/$name.log" | sed 's/^/    /' | tee -a "$OUTDIR/stages.log"
}

export PYTHONUNBUFFERED=1 SINGA_CUDA_CACHE=${SINGA_CUDA_CACHE:-/tmp/singa-cuda-cache}
if compgen -G ".whl/*.whl" >/dev/null; then
    stage wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/singa-site .whl/*.whl
    export PYTHONPATH=/tmp/singa-site${PYTHONPATH:+:$PYTHONPATH}
fi
pkgs=(./packages/singa-core ./packages/singa-onnx ./packages/singa-backend-cuda ./tests/plugins/singa-plugin-hostmem)
[ -d packages/singa-comm-nccl ] && pkgs+=(./packages/singa-comm-nccl)
stage install 180 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation "${pkgs[@]}"
stage info 60 "$PY" -m singa info
stage precompile 240 "$PY" -m singa_backend_cuda precompile
stage cuda_tests 300 "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short packages/singa-backend-cuda/tests
stage gpu_check 420 "$PY" benchmarks/gpu_check.py --out "$OUTDIR"
stage conformance 420 "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short --maxfail=60 --pyargs singa.testing.conformance \
    --singa-device cuda
# the seeds' examples, graph mode, float16, layers (CudnnRNN against torch.nn), bad input and threads, on cuda
tests_on_cuda=(tests/test_autograd_seed.py tests/test_training_doc.py tests/test_graph.py tests/test_half.py
               tests/test_layer.py)
for t in tests/test_singa_script_forms.py tests/test_bad_input.py tests/test_threads.py; do
    [ -f "$t" ] && tests_on_cuda+=("$t")
done
stage tests_on_cuda 300 env SINGA_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short --maxfail=30 \
    "${tests_on_cuda[@]}"
stage onnx_models 300 "$PY" benchmarks/onnx_conformance.py --device cuda --output - --category real \
    --category simple --category pytorch-converted --category pytorch-operator
if [ -f packages/singa-comm-nccl/tests/gpu_check.py ]; then
    stage nccl 180 "$PY" packages/singa-comm-nccl/tests/gpu_check.py
fi
echo "==> [$((SECONDS - start))s] done; failed stages: ${failed[*]:-none}" | tee -a "$OUTDIR/stages.log"
# one file of every log's end (what comes back from a remote machine may be limited to a few files)
for f in "$OUTDIR"/*.log; do
    [ "$(basename "$f")" = stages.log ] && continue
    { echo "===== $(basename "$f")"; tail -n 150 "$f"; } >>"$OUTDIR/all_logs.txt"
done
[ ${#failed[@]} -eq 0 ]
