#!/usr/bin/env bash
# The GPU figures issue 38 owes, in one go on the device machine (one H100; ../shared/gpu/README.md).
#
#   run(command="bash .whl/setup.sh && bash bench/gpu_update_checks.sh", carry=[".whl"], timeout_s=590)
#
# (.whl holds the wheels of ../shared/gpu/wheels.txt, trl==1.16.0 among them, and setup.sh.) Each stage has
# its own time limit, so one that hangs leaves time for the rest; results land in $OUT:
#   1. the owed checks: tests/components/engines/test_cuda_graphs.py, test_lean_decoder.py;
#   2. bench/local_vs_trl.py on the ~1.3 B shape (allocator retries per update in its JSON), with the packed
#      update (the default) and with local.update_path=padded, each against TRL: training tokens/s, update
#      time per step (max/min);
#   3. bench/update_memory.py on the ~1.3 B shape: padded vs packed vs TRL's log-prob path at 4k-16k tokens,
#      peak CUDA memory and tokens/s;
#   4. the longest trajectory that trains (lengths doubled from 4k until an update fails), ~1.3 B full
#      fine-tuning and ~8 B LoRA, for padded, packed and TRL's log-prob path, activation checkpointing on
#      for all three (what long trajectories need; local.gradient_checkpointing: auto turns it on).
# The limits add up to ~560 s (one call). With less device time, run some stages per call:
# STAGES="owed_tests vs_trl_packed" bash bench/gpu_update_checks.sh.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
Q15='tiny://q15?layers=28&hidden=1536&heads=12&kv_heads=2&intermediate=8960'
SHAPE15='layers=28,hidden=1536,heads=12,kv_heads=2,intermediate=8960'
SHAPE8B='layers=36,hidden=4096,heads=32,kv_heads=8,intermediate=12288'
STAGES=${STAGES:-owed_tests vs_trl_packed vs_trl_padded update_memory_1p3b longest_1p3b_full longest_8b_lora}

stage() {  # stage NAME SECONDS COMMAND...: run it with a limit, log to $OUT/NAME.log, note the exit status
    local name=$1 limit=$2
    shift 2
    case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
    local started=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
}

nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
stage owed_tests 100 python3 -m pytest tests/components/engines/test_cuda_graphs.py tests/components/engines/test_lean_decoder.py -q -x -p no:cacheprovider
stage vs_trl_packed 100 python3 bench/local_vs_trl.py --device cuda --model "$Q15" --prompts 16 --generations 8 \
    --max-tokens 128 --json "$OUT/local_vs_trl_packed.json"
stage vs_trl_padded 80 python3 bench/local_vs_trl.py --device cuda --model "$Q15" --prompts 16 --generations 8 \
    --max-tokens 128 --local update_path=padded --json "$OUT/local_vs_trl_padded.json"
stage update_memory_1p3b 80 python3 bench/update_memory.py --device cuda --dtype bfloat16 --shape "$SHAPE15" \
    --paths padded,packed,trl --lengths 4096,8192,16384 --no-compare --repeats 2 --json "$OUT/update_memory_1p3b.json"
stage longest_1p3b_full 100 python3 bench/update_memory.py --device cuda --dtype bfloat16 --shape "$SHAPE15" \
    --paths padded,packed,trl --lengths 4096 --find-longest --checkpointing --no-compare --repeats 1 --json "$OUT/longest_1p3b_full.json"
stage longest_8b_lora 100 python3 bench/update_memory.py --device cuda --dtype bfloat16 --shape "$SHAPE8B" \
    --lora-rank 16 --paths padded,packed,trl --lengths 4096 --find-longest --checkpointing --no-compare --repeats 1 \
    --json "$OUT/longest_8b_lora.json"
cat "$OUT/summary.txt"
