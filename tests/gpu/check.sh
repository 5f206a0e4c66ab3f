#!/usr/bin/env bash
# The GPU check (issue 15): "exec'ing the training script on its GPU", on a machine with an NVIDIA GPU, a
# preinstalled CUDA torch, this repository and no network. Nothing is installed: slurmlaunch runs from the
# repository through PYTHONPATH (submitit is not needed: only `submit --scheduler local` and `run` are used).
#
#   bash tests/gpu/check.sh              # GPU checks; without a usable GPU they are skipped, each with a line
#   bash tests/gpu/check.sh --cpu-only   # skip the GPU checks; run the CPU ones (what CI runs)
#
# Environment: PYTHON (default python3), SLURMLAUNCH_GPU_CHECK_WORKDIR (default a new temporary directory),
# CHECK_TIMEOUT (seconds per command, default 120). Prints PASS/FAIL/SKIP per check and a summary; exits 1
# when a check failed. Every command runs under `timeout`; the whole check takes about a minute on a GPU node.
set -u

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
LIMIT=${CHECK_TIMEOUT:-120}
CPU_ONLY=0
[ "${1:-}" = "--cpu-only" ] && CPU_ONLY=1
WORK=${SLURMLAUNCH_GPU_CHECK_WORKDIR:-$(mktemp -d /tmp/slurmlaunch-gpu-check.XXXXXX)}
mkdir -p "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# a run inside a real Slurm job must not read that job's variables as its own
for v in $(env | grep -oE '^(SLURM[A-Z_]*|MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|OMP_NUM_THREADS)=' | tr -d =); do
  unset "$v"
done
PROBE="$REPO/tests/gpu/probe.py"
PASSED=0 FAILED=0 SKIPPED=0

pass() { echo "PASS $1"; PASSED=$((PASSED + 1)); }
fail() { echo "FAIL $1"; FAILED=$((FAILED + 1)); }
skip() { echo "SKIP $1"; SKIPPED=$((SKIPPED + 1)); }
# run NAME CMD...: CMD's output goes to $WORK/NAME.out; its exit code is returned
run() {
  local name=$1; shift
  timeout -k 10 "$LIMIT" "$@" >"$WORK/$name.out" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "  ($name: timed out after ${LIMIT}s)"
  return $rc
}
show() { sed 's/^/  | /' "$WORK/$1.out" | tail -n "${2:-15}"; }
# probes NAME N: the number of PROBE lines with ok=True in NAME's output equals N
probes_ok() { [ "$(grep -c 'PROBE .*ok=True' "$WORK/$1.out")" -eq "$2" ] && ! grep -q 'ok=False' "$WORK/$1.out"; }

# step RANK NTASKS GPUS_ON_NODE CVD ARGS...: sets STEP to the launcher as one task of an emulated `srun` step on
# one node (then: run NAME "${STEP[@]}"); CVD "-" leaves CUDA_VISIBLE_DEVICES unset
step() {
  local rank=$1 ntasks=$2 gpus=$3 cvd=$4; shift 4
  local -a vars=(SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID="$rank" SLURM_NTASKS="$ntasks"
    SLURM_STEP_NUM_TASKS="$ntasks" SLURM_STEP_NODELIST=gpunode SLURM_STEP_NUM_NODES=1
    SLURM_STEP_TASKS_PER_NODE="$ntasks" SLURM_NODEID=0 SLURM_LOCALID="$rank" SLURMD_NODENAME=gpunode
    SLURM_GPUS_ON_NODE="$gpus" MASTER_ADDR=127.0.0.1 PROBE_STARTED="$WORK/started")
  if [ "$cvd" = "-" ]; then STEP=(env -u CUDA_VISIBLE_DEVICES); else STEP=(env CUDA_VISIBLE_DEVICES="$cvd"); fi
  STEP+=("${vars[@]}" "$PY" -m slurmlaunch launch "$@")
}

echo "slurmlaunch GPU check: repo $REPO, python $PY, work dir $WORK"
# -- the environment ---------------------------------------------------------------------------------------
if run env "$PY" -c '
import sys, torch, jinja2, slurmlaunch
print(f"python {sys.version.split()[0]} torch {torch.__version__} cuda {torch.version.cuda} "
      f"available={torch.cuda.is_available()} devices={torch.cuda.device_count() if torch.cuda.is_available() else 0} "
      f"nccl={torch.cuda.nccl.version() if torch.cuda.is_available() else None} slurmlaunch from {slurmlaunch.__file__}")
'; then
  pass "environment: $(tail -n 1 "$WORK/env.out")"
else
  fail "environment: python, torch, jinja2 and slurmlaunch (from the repo) must import"; show env
  echo "summary: $PASSED passed, $FAILED failed, $SKIPPED skipped"; exit 1
fi
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi -L 2>/dev/null | sed 's/^/  /'
if [ "$CPU_ONLY" = 1 ]; then GPUS=0; WHY="--cpu-only"; else WHY="no CUDA GPU visible to torch"; fi

# -- checks without a GPU (they run everywhere) ---------------------------------------------------------------
# the GPU rule, as the launcher applies it under an emulated step (no CUDA touched): shared GPUs -> LOCAL_RANK,
# one GPU bound per task (--gpus-per-task) -> index 0
ok=1
for r in 0 1; do
  { step "$r" 2 2 0,1 --no-preflight "$PROBE" env; run "rule-shared-$r" "${STEP[@]}"; } || ok=0
  grep -q "PROBE rank=$r local_rank=$r local_device=$r " "$WORK/rule-shared-$r.out" || ok=0
  { step "$r" 2 2 "$r" --no-preflight "$PROBE" env; run "rule-bound-$r" "${STEP[@]}"; } || ok=0
  grep -q "PROBE rank=$r local_rank=$r local_device=0 " "$WORK/rule-bound-$r.out" || ok=0
done
if [ $ok = 1 ]; then pass "launcher under an emulated step: SLURMLAUNCH_LOCAL_DEVICE follows the GPU rule (shared, per task)"
else fail "launcher under an emulated step: SLURMLAUNCH_LOCAL_DEVICE"; for f in "$WORK"/rule-*.out; do show "$(basename "$f" .out)" 3; done; fi

# more ranks than GPUs: refused before anything starts
rm -rf "$WORK/started"
{ step 1 2 1 0 "$PROBE" env; run refuse-launch "${STEP[@]}"; }; rc=$?
if [ $rc -ne 0 ] && grep -q "only 1 GPU(s) visible" "$WORK/refuse-launch.out" && [ ! -e "$WORK/started" ]; then
  pass "launcher: 2 ranks on 1 visible GPU refused before exec (exit $rc)"
else fail "launcher: 2 ranks on 1 visible GPU must be refused before exec (exit $rc)"; show refuse-launch; fi
run refuse-run "$PY" -m slurmlaunch run --nproc-per-node $((GPUS > 0 ? GPUS + 1 : 1)) "$PROBE" world; rc=$?
if [ "$GPUS" -gt 0 ]; then wanted="more than the $GPUS GPU"; else wanted="run on the CPU"; fi
if [ "$GPUS" -gt 0 ] && [ $rc -eq 2 ] && grep -q "$wanted" "$WORK/refuse-run.out" && [ ! -e "$WORK/started" ]; then
  pass "run --nproc-per-node $((GPUS + 1)) on $GPUS GPU(s) refused before start"
elif [ "$GPUS" -eq 0 ]; then
  run refuse-run-gpu "$PY" -m slurmlaunch run --nproc-per-node gpu "$PROBE" world; rc=$?
  if [ $rc -eq 2 ] && grep -q "no GPU is visible" "$WORK/refuse-run-gpu.out"; then
    pass "run --nproc-per-node gpu without a GPU refused (exit 2)"
  else fail "run --nproc-per-node gpu without a GPU must be refused"; show refuse-run-gpu; fi
else fail "run --nproc-per-node $((GPUS + 1)) on $GPUS GPU(s) must be refused (exit $rc)"; show refuse-run; fi

if [ "$GPUS" -eq 0 ]; then
  # the same plumbing as the GPU worlds below, on the CPU (gloo)
  if (cd "$WORK" && run run-gloo "$PY" -m slurmlaunch run --cpu --nproc-per-node 2 "$PROBE" world) && probes_ok run-gloo 2; then
    pass "a gloo world of 2 through run (the CPU stand-in for the NCCL world)"
  else fail "a gloo world of 2 through run"; show run-gloo; fi
  for c in "NCCL world through the local scheduler" "NCCL world through run" \
           "launcher on its GPU under an emulated step (shared and per-task CUDA_VISIBLE_DEVICES)" \
           "local submit with more GPUs per node than the machine has" "Lightning fit on the GPU"; do
    skip "$c ($WHY)"
  done
  echo "summary: $PASSED passed, $FAILED failed, $SKIPPED skipped"
  [ "$FAILED" -eq 0 ]; exit
fi

# -- GPU checks ---------------------------------------------------------------------------------------------
N=$((GPUS < 2 ? GPUS : 2))  # NCCL refuses two ranks of one communicator on one GPU: at most one rank per GPU
mkdir -p "$WORK/local"
if (cd "$WORK/local" && run local-nccl "$PY" -m slurmlaunch submit --scheduler local --gpus-per-node "$N" "$PROBE" world) \
   && probes_ok local-nccl "$N"; then
  pass "NCCL world of $N through the local scheduler"; grep -h PROBE "$WORK"/local/slurmlaunch-logs/*.log | sed 's/^/  /'
else fail "NCCL world of $N through the local scheduler"; show local-nccl; tail -n 20 "$WORK"/local/slurmlaunch-logs/*.log 2>/dev/null; fi

if (cd "$WORK" && run run-nccl "$PY" -m slurmlaunch run --nproc-per-node gpu "$PROBE" world) && probes_ok run-nccl "$GPUS"; then
  pass "NCCL world of $GPUS through run --nproc-per-node gpu"; grep PROBE "$WORK/run-nccl.out" | sed 's/^/  /'
else fail "NCCL world through run"; show run-nccl; fi

# the launcher under an emulated step, on the device: shared GPUs (every task sees all, uses LOCAL_RANK) and
# one GPU bound per task (CUDA_VISIBLE_DEVICES is the task's own; it uses index 0, whatever its LOCAL_RANK)
ok=1
ALL=$(seq -s, 0 $((GPUS - 1)))
for r in $(seq 0 $((N - 1))); do
  { step "$r" "$N" "$GPUS" "$ALL" --no-preflight "$PROBE" device; run "dev-shared-$r" "${STEP[@]}"; } || ok=0
  grep -q "local_device=$r .*used=cuda:$r .*ok=True" "$WORK/dev-shared-$r.out" || ok=0
done
{ step 0 1 "$GPUS" - --no-preflight "$PROBE" device; run dev-shared-unset "${STEP[@]}"; } || ok=0
grep -q "local_device=0 .*used=cuda:0 .*ok=True" "$WORK/dev-shared-unset.out" || ok=0
for r in 0 1; do
  { step "$r" 2 2 $((r % GPUS)) --no-preflight "$PROBE" device; run "dev-bound-$r" "${STEP[@]}"; } || ok=0
  grep -q "local_rank=$r local_device=0 .*used=cuda:0 of 1 visible.*ok=True" "$WORK/dev-bound-$r.out" || ok=0
done
if [ $ok = 1 ]; then pass "launcher under an emulated step: each rank computes on the GPU SLURMLAUNCH_LOCAL_DEVICE names"
else fail "launcher under an emulated step: the device used"; fi
grep -h PROBE "$WORK"/dev-*.out | sed 's/^/  /'

rm -rf "$WORK/started" && mkdir -p "$WORK/local-refuse"
(cd "$WORK/local-refuse" && run local-refuse env PROBE_STARTED="$WORK/started" "$PY" -m slurmlaunch submit \
   --scheduler local --gpus-per-node $((GPUS + 1)) "$PROBE" world); rc=$?
if [ $rc -ne 0 ] && [ ! -e "$WORK/started" ]; then
  pass "local submit --gpus-per-node $((GPUS + 1)) on $GPUS GPU(s) refused before start (exit $rc: $(grep -m1 -i gpu "$WORK/local-refuse.out" | cut -c1-160))"
else fail "local submit --gpus-per-node $((GPUS + 1)) on $GPUS GPU(s) must be refused before start (exit $rc)"; show local-refuse; fi

if "$PY" -c 'import lightning' 2>/dev/null || "$PY" -c 'import pytorch_lightning' 2>/dev/null; then
  if (cd "$WORK" && run lightning "$PY" -m slurmlaunch run --nproc-per-node 1 "$REPO/tests/gpu/lightning_fit.py") \
     && probes_ok lightning 1; then
    pass "Lightning fit on the GPU through run: $(grep -m1 PROBE "$WORK/lightning.out" | cut -c7-)"
  else fail "Lightning fit on the GPU"; show lightning 25; fi
else
  skip "Lightning fit on the GPU (neither lightning nor pytorch_lightning is installed)"
fi

# a hung NCCL job (issue 29): rank 1 sleeps in a function of its own while rank 0 waits in all_reduce;
# `slurmlaunch stacks` names rank 1 and its function, and the flight recorder dumps at the NCCL timeout
# (TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE) for fr_trace. Not yet run on a GPU machine.
if [ "$GPUS" -ge 2 ]; then
  mkdir -p "$WORK/hang" && cat > "$WORK/hang/hang.py" <<'PY'
import datetime, os, sys, time, torch, torch.distributed as dist
def load_batch():
    open(os.path.join(sys.argv[1], "sleeping"), "w").close()
    time.sleep(90)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=20))
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
if rank == 1:
    load_batch()
dist.all_reduce(t)
torch.cuda.synchronize()
PY
  (cd "$WORK/hang" && TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
     TORCH_FR_DUMP_TEMP_FILE="$WORK/hang/nccl_trace_rank_" timeout -k 10 "$LIMIT" "$PY" -m slurmlaunch submit \
     --scheduler local --gpus-per-node 2 -o "$WORK/hang/logs" hang.py "$WORK/hang" >"$WORK/hang.out" 2>&1) &
  for _ in $(seq 600); do [ -e "$WORK/hang/sleeping" ] && break; sleep 0.1; done
  sleep 2
  job=$(ls "$WORK/hang/logs" | sed -n 's/^job-\([0-9]*\)\.json$/\1/p' | head -n 1)
  (cd "$WORK/hang" && run stacks "$PY" -m slurmlaunch stacks "$job")
  wait
  if grep -q "rank 1 on 127.0.0.1: hang.py:4 in load_batch" "$WORK/stacks.out"; then
    pass "stacks names the sleeping rank of a hung NCCL job: $(grep -m1 '^rank 1' "$WORK/stacks.out" | cut -c1-120)"
  else fail "stacks on a hung NCCL job"; show stacks 20; fi
  if ls "$WORK/hang"/nccl_trace_rank_* >/dev/null 2>&1 && \
     run frtrace "$PY" -m torch.distributed.flight_recorder.fr_trace "$WORK/hang" -p nccl_trace_rank_ --allow-incomplete-ranks; then
    pass "NCCL flight recorder dumped at the timeout and fr_trace read it"
  else fail "NCCL flight recorder dump / fr_trace"; show hang 20; show frtrace 20; fi
else
  skip "stacks and the NCCL flight recorder on a hung job (needs 2 GPUs, $GPUS visible)"
fi

echo "summary: $PASSED passed, $FAILED failed, $SKIPPED skipped (work dir $WORK)"
[ "$FAILED" -eq 0 ]
