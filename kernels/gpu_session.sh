#!/usr/bin/env bash
# Everything issue 7 asks of the lent GPU machine, in one device call (see kernels/README.md):
#
#   device run, carry [".whl"], timeout_s 600:   bash kernels/gpu_session.sh
#
# Steps, each capped by what is left of BUDGET seconds (default 560), logs under $OUT:
#   1. install the carried wheels (once per machine), generate the gRPC stubs, name the GPU;
#   2. FlashInfer's first calls (AOT modules from the bundle, else its JIT): warmup.log;
#   3. the unit-level GPU tests (kernels, IPC, decode graphs against eager) and the GPU cluster tests, side
#      by side: gpu-unit.log, gpu-e2e.log;
#   4. the benchmarks (KV transfer, decode eager and from CUDA graphs with the 8B shapes, 4k prefill against
#      the matmul peak; attention too when SECTIONS names it): bench-gpu.md and bench-gpu.json ($BENCH), the
#      engine's log lines in bench-gpu.log;
#   5. one decode step profiled eager and from graphs (host ms, launches, GPU ms): profile.md (logs: profile.log).
# SECTIONS="attention transfer decode prefill sampling", STEPS="warmup unit e2e bench profile" and PRESETS (decode's
# model shapes) pick parts.
set -o pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-560}
STEPS=${STEPS:-warmup unit e2e bench profile}
SECTIONS=${SECTIONS:-transfer decode prefill sampling}
BENCH=${BENCH:-bench-gpu}  # the bench's file names under $OUT: $BENCH.md and $BENCH.json
PRESETS=${PRESETS:-}  # decode's model shapes when set (e.g. qwen3-30b-a3b-12l, the MoE), else the suite's
started=$SECONDS
SITE=${SITE:-/tmp/site}
export PYTHONPATH=$SITE:$PWD:$PWD/protos/python FLASHINFER_WORKSPACE_BASE=/tmp/fi PYTHONUNBUFFERED=1
unset PYTORCH_CUDA_ALLOC_CONF  # expandable segments share memory by file descriptor, which a sandbox may refuse

elapsed() { echo $((SECONDS - started)); }
cap() {  # cap SECONDS: the lesser of SECONDS and what is left of the budget
    local left=$((BUDGET - $(elapsed)))
    left=$((left < $1 ? left : $1))
    echo $((left > 1 ? left : 1))
}
wants() { [[ " $STEPS " == *" $1 "* ]]; }
note() { echo "[gpu-session $(elapsed)s] $*" | tee -a "$OUT/session.log"; }

note "install"
if [ ! -d "$SITE/flashinfer" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .whl/*.whl || { note "wheel install failed"; exit 1; }
fi
python3 protos/generate.py >/dev/null || { note "stub generation failed"; exit 1; }
nvidia-smi -L | tee -a "$OUT/session.log"
python3 -c 'import flashinfer, torch; print("flashinfer", flashinfer.__version__, "torch", torch.__version__,
torch.cuda.get_device_name())' 2>&1 | tail -3 | tee -a "$OUT/session.log"

if wants warmup; then
    note "warmup (cap $(cap 200) s)"
    timeout -k 5 "$(cap 200)" python3 -m services.bench.gpu.attention --warmup-only 2>&1 | tee "$OUT/warmup.log"
    note "warmup rc=$?"
fi

PYTEST=(python3 -m pytest -q -ra -p no:cacheprovider --durations=8 -m gpu)
if wants unit || wants e2e; then
    limit=$(cap 240)
    note "GPU tests (cap $limit s)"
    if wants unit; then
        timeout -k 5 "$limit" "${PYTEST[@]}" tests/kernels tests/kvcache tests/engine/test_decode_graphs_gpu.py \
            tests/engine/test_device_sampling.py tests/engine/test_moe_grouped_gpu.py \
            >"$OUT/gpu-unit.log" 2>&1 &
        unit=$!
    fi
    if wants e2e; then
        timeout -k 5 "$limit" "${PYTEST[@]}" --basetemp=/tmp/pt-e2e tests/e2e/test_gpu_cluster.py \
            >"$OUT/gpu-e2e.log" 2>&1 &
        e2e=$!
    fi
    [ -n "${unit:-}" ] && { wait "$unit"; note "unit rc=$?"; tail -15 "$OUT/gpu-unit.log"; }
    if [ -n "${e2e:-}" ]; then
        wait "$e2e"
        rc=$?
        note "e2e rc=$rc"
        tail -15 "$OUT/gpu-e2e.log"
        if [ "$rc" != 0 ]; then  # the cluster's own logs, for a failure's cause
            for log in /tmp/pt-e2e/*/cluster.log; do
                [ -f "$log" ] && { echo "== $log"; grep -v '"level": "debug"' "$log" | tail -40; } >>"$OUT/gpu-e2e.log"
            done
        fi
    fi
fi

if wants bench; then
    note "bench $SECTIONS (cap $(cap 400) s)"
    # shellcheck disable=SC2086
    timeout -k 5 "$(cap 400)" python3 -m services.bench.gpu.suite --sections $SECTIONS ${PRESETS:+--presets $PRESETS} \
        --json "$OUT/$BENCH.json" 2>"$OUT/$BENCH.log" | tee "$OUT/$BENCH.md"
    rc=$?
    note "bench rc=$rc"
    [ "$rc" != 0 ] && tail -20 "$OUT/$BENCH.log"
fi
if wants profile; then
    note "profile (cap $(cap 90) s)"
    timeout -k 5 "$(cap 90)" python3 -m services.bench.gpu.profile_step --batches 1 32 >"$OUT/profile.md" 2>"$OUT/profile.log"
    note "profile rc=$?"
    tail -8 "$OUT/profile.md"
fi
note "done"
