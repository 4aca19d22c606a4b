#!/usr/bin/env bash
# The GPU exporter on a real H200 (the device tool's machine), idle and under a bf16 matmul
# load: NVML and nvidia-smi sources, --once and the HTTP endpoint. Read-only towards the GPU's
# settings (no MIG, clock or power changes). Its outputs become fixtures of
# tests/unit/test_gpu_exporter_h200.py:
#   run: bash tests/device/h200_gpu_exporter.sh "$OUT"
set -u
OUT="${1:?usage: h200_gpu_exporter.sh OUTDIR}"
EXPORTER=roles/monitoring/files/mlinfra_gpu_exporter.py
export PYTHONUNBUFFERED=1
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*"; }

log "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,mig.mode.current --format=csv,noheader)"
python3 -c 'import pynvml; print("pynvml", pynvml.__file__)' || log "pynvml does not import"
nvidia-smi -q -x >"$OUT/idle-nvidia-smi-q.xml"
python3 "$EXPORTER" --once --source nvml --hostname h200-device >"$OUT/idle-nvml.prom" 2>"$OUT/idle-nvml.log"
log "idle nvml rc=$?"

# Load: bf16 matmuls on a 16 GiB working set for 75 s, utilisation near 100 %.
python3 - <<'PY' >"$OUT/load.log" 2>&1 &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ballast = torch.empty(16 * 1024**3, dtype=torch.uint8, device="cuda")  # memory in use
n, t0 = 0, time.time()
while time.time() - t0 < 75:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize(); n += 50
dt = time.time() - t0
print(f"matmuls={n} seconds={dt:.1f} tflops={2*8192**3*n/dt/1e12:.0f}")
PY
LOAD=$!
sleep 20
python3 "$EXPORTER" --once --source nvml --hostname h200-device >"$OUT/load-nvml.prom" 2>"$OUT/load-nvml.log"
log "load nvml rc=$?"
python3 "$EXPORTER" --once --source nvidia-smi --hostname h200-device >"$OUT/load-nvidia-smi.prom" 2>"$OUT/load-nvidia-smi.log"
log "load nvidia-smi rc=$?"
nvidia-smi -q -x >"$OUT/load-nvidia-smi-q.xml"
python3 "$EXPORTER" --listen 127.0.0.1:9400 --hostname h200-device >"$OUT/http.log" 2>&1 &
HTTP=$!
for _ in $(seq 50); do curl -fsS -o "$OUT/load-http.prom" http://127.0.0.1:9400/metrics && break; sleep 0.2; done
log "http scrape: $(grep -c '^DCGM' "$OUT/load-http.prom" 2>/dev/null) DCGM samples"
/usr/bin/time -v -o "$OUT/scrape-cost.txt" python3 "$EXPORTER" --once --source nvml >/dev/null 2>&1
kill "$HTTP" 2>/dev/null
wait "$LOAD"; log "load: $(tail -1 "$OUT/load.log")"
nvidia-smi mig -lgip >"$OUT/mig-lgip.txt" 2>&1; log "mig -lgip rc=$? (read-only listing)"
for f in idle-nvml load-nvml load-nvidia-smi load-http; do
  log "$f: $(grep -E '^DCGM_FI_DEV_(GPU_UTIL|FB_USED|POWER_USAGE|GPU_TEMP)\{' "$OUT/$f.prom" | sed 's/{.*}//' | tr '\n' ' ')"
done
cat "$OUT"/*.log | grep -v '^$' | tail -20
