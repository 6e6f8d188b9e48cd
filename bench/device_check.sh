#!/usr/bin/env bash
# One device call's plan, correctness first: the device tool gives a few short calls a session (and
# some sessions none), so the next call should be one line that cannot be mistyped.
#
#   bash bench/device_check.sh [STEP ...]        (in the repository root; results under $OUT)
#
# Steps, in the order given (default: route-tests stream-tests route l2e: the tests first):
#   route-tests    tests/test_cuda_norm_route.py                        (the cluster router, never run yet)
#   stream-tests   tests/test_cuda_stream_gemv.py tests/test_stream_conv_fits.py
#   suites         every GPU suite with the CLI and server tests (carry .devpkgs: the server's wheels)
#   all            bench/cuda_bench.py, every default section            (an H200 only: its targets are the issue's)
#   route          bench/cuda_bench.py --sections bandwidth,decode,route
#   grid           bench/cuda_bench.py --sections bandwidth,grid        (the recurrence's REC arms)
#   l2e            bench/cuda_ablation.py --arms l2experts --rows 1,4
#   ablation       bench/cuda_ablation.py --rows 1,4                     (an H200 only)
# Each step runs under its own time limit, writes $OUT/<step>.log (raw JSON under $OUT/<step>/) and
# prints its summary lines with the seconds it took; a step that fails or runs out of time is said
# so, and the next one still runs; the script exits 1 if any step failed (skips are not failures).
set -u
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || echo "no nvidia-smi: no GPU here"
git log -1 --format='commit %h %s' 2>/dev/null | cut -c1-100

FAILS=0
GPU_SUITES="tests/test_cuda_moe_pred.py tests/test_cuda_stream_moe.py tests/test_stream_fallback.py
  tests/test_cuda_moe_tail.py tests/test_cuda_fusions.py tests/test_cuda.py tests/test_cuda_server.py
  tests/test_rollback.py tests/test_launch_flags.py tests/test_prompt_graphs.py tests/test_cuda_stream_gemv.py
  tests/test_cuda_recurrence.py tests/test_prompt_pieces.py tests/test_cuda_chunk_parts.py tests/test_cli.py
  tests/test_cuda_norm_route.py"
BENCH="python3 bench/cuda_bench.py --layers 40 --tokens 32 --rounds 3"
SUMMARY='^\[(kernels|bandwidth|decode|verify|overhead|spec|correlated|route|grid)'

h200_only() {
    case "$GPU" in *H200*) return 0 ;; esac
    echo "[$1] skipped: an H200 only, this is '${GPU:-no GPU}'"
    return 1
}

# run STEP LIMIT_S FILTER COMMAND...: the command's output into $OUT/STEP.log, FILTER's lines printed
run() {
    local step=$1 limit=$2 filter=$3
    shift 3
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$step.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || FAILS=$((FAILS + 1))
    grep -E "$filter" "$OUT/$step.log" | cut -c1-900 | tail -40
    case $rc in
        0) echo "[$step] ok in $((SECONDS - t0)) s" ;;
        124) echo "[$step] ran out of its $limit s; its log: $OUT/$step.log" ;;
        *) echo "[$step] failed (rc $rc) in $((SECONDS - t0)) s; the log's end:"; tail -15 "$OUT/$step.log" ;;
    esac
}

pytest_run() {   # STEP LIMIT FILES...
    local step=$1 limit=$2
    shift 2
    run "$step" "$limit" '(passed|failed|skipped|error|FAILED|ERROR)' python3 -m pytest -q -p no:cacheprovider "$@"
}

suites() {
    # the server test's fastapi/uvicorn/openai/httpx from the carried wheels; test_cli's one subprocess
    # test wants a `verispec` script on the PATH
    if [ -d .devpkgs ]; then
        pip install -q --no-index --find-links .devpkgs --target /tmp/pk fastapi uvicorn openai httpx \
            > "$OUT/pip.log" 2>&1 || echo "[suites] the carried wheels did not install: $OUT/pip.log"
    else
        echo "[suites] no .devpkgs carried: the server suites will fail to import"
    fi
    mkdir -p /tmp/bin
    printf '#!/bin/sh\nexec python3 -m verispec.cli "$@"\n' > /tmp/bin/verispec
    chmod +x /tmp/bin/verispec
    # shellcheck disable=SC2086
    PATH=/tmp/bin:$PATH PYTHONPATH=$PYTHONPATH:/tmp/pk pytest_run suites 420 $GPU_SUITES
}

[ $# -gt 0 ] || set -- route-tests stream-tests route l2e
STEPS=" route-tests stream-tests suites all route grid l2e ablation "
for step in "$@"; do   # a mistyped step is said before any runs, not after the time is spent
    case $STEPS in *" $step "*) ;; *) echo "unknown step '$step' (one of:$STEPS)"; exit 2 ;; esac
done
for step in "$@"; do
    case $step in
        route-tests) pytest_run "$step" 240 tests/test_cuda_norm_route.py ;;
        stream-tests) pytest_run "$step" 180 tests/test_cuda_stream_gemv.py tests/test_stream_conv_fits.py ;;
        suites) suites ;;
        all) h200_only all && run all 300 "$SUMMARY" $BENCH --out "$OUT/all" ;;
        route) run route 240 "$SUMMARY" $BENCH --sections bandwidth,decode,route --out "$OUT/route" ;;
        grid) run grid 240 "$SUMMARY" $BENCH --sections bandwidth,grid --out "$OUT/grid" ;;
        l2e) run l2e 150 'l2experts\]' python3 bench/cuda_ablation.py --arms l2experts --rounds 20 --rows 1,4 \
                --out "$OUT/l2e" ;;
        ablation) h200_only ablation && run ablation 240 'ablation\]' python3 bench/cuda_ablation.py --rounds 20 \
                --rows 1,4 --out "$OUT/ablation" ;;
    esac
done
[ $FAILS -eq 0 ] || echo "$FAILS step(s) failed"
exit $((FAILS > 0))
