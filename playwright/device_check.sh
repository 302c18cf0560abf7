#!/usr/bin/env bash
# The check on a lent machine with a real GPU: `pyshim doctor` (adapters, kernel self-test, roofline),
# `pyshim bench` on full-size synthetic models and the kernel and engine tests, natively through wgpu
# (Vulkan).
#
# Such a machine is bare and offline (no pip, no apt, no model hub) and takes at most 64 MiB along, so
#   playwright/device_check.sh --prepare      (here, online, in the checkout) gathers what it lacks:
#     .gl/   the Vulkan/GL loaders as Debian packages (its image has the NVIDIA driver, not the loader)
#     .whl/  wgpu, cffi, gguf and their small dependencies as wheels for its Python (3.12)
#     .dev/  tokenizer-only GGUFs (a few MB; the shipped models are 100-500 MB) to write synthetic models
#   playwright/device_check.sh                (there, with .gl .whl .dev carried) runs the check; reports
#     go to $REPORT (artifacts/device/), packed into $OUT/device-check.tgz when $OUT is set.
# Chromium is not part of it: its packages alone (~95 MB compressed) exceed what one call carries.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  py=.venv/bin/python
  mkdir -p .gl .whl .dev /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  wheels=""
  for pkg in wgpu cffi gguf rendercanvas pycparser; do
    wheels="$wheels $pkg==$($py -m pip show $pkg | sed -n 's/^Version: //p')"
  done
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $wheels
  $py -c "
from pyshim.setup import synthetic
from pyshim.setup.catalog import resolve_model
for name in ('qwen2.5', 'smollm2'):
    print(synthetic.write_tokenizer(resolve_model(name), '.dev/tokenizer-' + name + '.gguf'))"
  du -sh .gl .whl .dev
  exit 0
fi

REPORT=${REPORT:-artifacts/device}
mkdir -p "$REPORT"
# What comes back from the lent machine is a few files: one archive, rewritten after each stage.
pack() { if [ -n "${OUT:-}" ]; then tar czf "$OUT/device-check.tgz" -C "$REPORT" .; fi; }
MODELS=${MODELS-smollm2-135m,qwen2.5-1.5b,qwen2.5-7b,qwen2.5-7b-q4_k_m,olmoe-1b-7b}
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
nv=/usr/local/nvidia/share
if [ -f $nv/vulkan/icd.d/nvidia_icd.json ] && ! ls /usr/share/vulkan/icd.d/*nvidia* /etc/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then
  export VK_DRIVER_FILES=$nv/vulkan/icd.d/nvidia_icd.json __EGL_VENDOR_LIBRARY_FILENAMES=$nv/glvnd/egl_vendor.d/10_nvidia.json
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$REPORT/gpu.csv"
# WebGPU does not say how much memory the GPU has (pyshim plans for 4 GiB, and streams layers past it):
# the driver does, so the bench plans for 90% of it.
gpu_mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
BUDGET_MB=${BUDGET_MB:-${gpu_mb:+$((gpu_mb * 9 / 10))}}
echo "$(nproc) CPUs; $(python3 --version)"

# The synthetic models are written while the doctor runs (each up to ~40 s of single-threaded NumPy).
[ -n "$MODELS" ] && python3 - "$MODELS" >"$REPORT/synthetic.log" 2>&1 <<'PY' &
import sys, time
from concurrent.futures import ProcessPoolExecutor
from pyshim.setup import synthetic

def one(name):
    t0 = time.perf_counter()
    tok = f".dev/tokenizer-{synthetic.SHAPES[synthetic.split_name(name)[0]].tokenizer_from}.gguf"
    return f"{synthetic.write(name, tok)} {time.perf_counter() - t0:.1f} s"

names = sys.argv[1].split(",")
with ProcessPoolExecutor(len(names)) as pool:
    for line in pool.map(one, names):
        print(line, flush=True)
PY

echo "== doctor (native: adapters, kernel self-test, roofline)"
python3 -m pyshim.cli doctor --no-browser --out "$REPORT" --timeout 240
wait
cat "$REPORT/synthetic.log" 2>/dev/null
pack
# Each model benched on its own (a report each), so a slow one costs only its own rows; the tests get
# what is left of BUDGET_S (a lent machine's call is bounded).
deadline=$((SECONDS + ${BUDGET_S:-430}))
for model in ${MODELS//,/ }; do
  echo "== bench $model (native)"
  timeout "${BENCH_TIMEOUT:-110}" python3 -m pyshim.cli bench --backends gpu --peer none --runs "${RUNS:-1}" \
    --models "$model" --out "$REPORT" ${BUDGET_MB:+--budget-mb $BUDGET_MB} ${BENCH_ARGS:-}
  pack
done
for model in $(echo "${PROFILE_MODELS-qwen2.5-1.5b,qwen2.5-7b}" | tr , " "); do
  echo "== where a decode step of $model goes"
  timeout 90 python3 playwright/profile_decode.py "$model" ${BUDGET_MB:+--budget-mb $BUDGET_MB} | tee "$REPORT/profile-$model.txt"
done
pack
echo "== kernel and engine tests on this adapter"
TESTS=${TESTS:-tests/test_kernels*.py tests/test_prefill_kernels.py tests/test_gpu_variants.py tests/test_kv_types.py
  tests/test_moe.py tests/test_gpu_executor.py tests/test_prefill_models.py tests/test_rope_scaling.py tests/test_profile.py}
timeout "$((deadline - SECONDS > 30 ? deadline - SECONDS : 30))" python3 -m pytest -q -p no:cacheprovider \
  -m "not browser and not models" --durations=5 $TESTS 2>&1 | tee "$REPORT/pytest.log"
pack
