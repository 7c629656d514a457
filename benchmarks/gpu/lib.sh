# Shared by the GPU scripts: settings, the never-fatal `run NAME TIMEOUT PROFILE-ARGS...`, and the export.
# Source it from the repository root.
OUT="${OUT:-/tmp/ftscope-char}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
DB="$OUT/${STORE:-gpu-runs}.sqlite"
LOG="$OUT/${STORE:-gpu-runs}.log"
DEVICE=cuda
BUDGET=${BUDGET_S:-450}          # stop starting new runs after this many seconds
if [ "${DRY_RUN:-0}" = 1 ]; then DEVICE=cpu; BUDGET=${BUDGET_S:-300}; fi
start=$(date +%s)

run() {  # run NAME TIMEOUT ARGS...: one profile invocation, never fatal
  local name=$1 limit=$2; shift 2
  local now=$(( $(date +%s) - start ))
  if [ "$now" -ge "$BUDGET" ]; then echo "skip $name (budget spent at ${now}s)" | tee -a "$LOG"; return; fi
  if [ "${DRY_RUN:-0}" = 1 ]; then set -- "$@" --shrink layers=1,hidden=128,vocab=512 --steps 1 --warmup 0; limit=120; fi
  echo "== $name (t=${now}s)" | tee -a "$LOG"
  timeout "$limit" "$PY" -m ftscope.cli profile "$@" --device "$DEVICE" --db "$DB" --json > "$OUT/last.json" 2>>"$LOG" \
    && "$PY" - "$OUT/last.json" <<'PYEOF' | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["points"]:
    m = p.get("memory") or {}
    reserved = m.get("peak_reserved_bytes")
    peak = (reserved or m.get("peak_allocated_bytes") or 0) / 2**30
    # CUDA: reserved vs the estimate's reserved; CPU: tracked tensor bytes vs the estimate's allocated
    est = ((p.get("estimate") or {}).get("memory") or {}).get("peak_gib" if reserved else "allocated_gib")
    print(f"  b{p['batch']:<3} {p['status']:5} step {p.get('step_s') or 0:.4f}s  peak {peak:.2f} GiB  (ftscope {est})")
if r.get("max_batch"):
    print("  max batch", r["max_batch"]["max_batch"])
PYEOF
  [ $? -eq 0 ] || echo "  (failed or timed out: see the log)" | tee -a "$LOG"
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$LOG"


export_store() {
  "$PY" -c "from ftscope.measure.store import Store; Store('$DB').export_json('${DB%.sqlite}.json')" && echo "exported ${DB%.sqlite}.json" | tee -a "$LOG"
  rm -f "$OUT/last.json"
  echo "total $(( $(date +%s) - start ))s" | tee -a "$LOG"
}
