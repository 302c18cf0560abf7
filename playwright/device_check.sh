#!/usr/bin/env bash
# The check on a lent machine with a real GPU: `pyshim doctor` (adapters, kernel self-test, roofline),
# `pyshim bench` on full-size synthetic models natively through wgpu (Vulkan) and in headless Chromium on
# the same GPU, and the kernel and engine tests.
#
# Such a machine is bare and offline (no pip, no apt, no model hub) and takes at most 64 MiB along a call,
# so what it lacks is gathered here (online, in a checkout after `make setup`):
#   playwright/device_check.sh --prepare          the native check's part (~12 MB):
#     .gl/   the Vulkan/GL loaders as Debian packages (its image has the NVIDIA driver, not the loader)
#     .whl/  wgpu, cffi, gguf and their small dependencies as wheels for its Python (3.12)
#     .dev/  tokenizer-only GGUFs (a few MB; the shipped models are 100-500 MB) to write synthetic models
#   playwright/device_check.sh --prepare-browser  the browser's part (~120 MB, so over several calls):
#     .chr/part-N and .chr/SHA256SUMS: one xz archive, in pieces of 50 MiB, of Debian's
#     chromium-headless-shell with the libraries it links (beside it, for LD_LIBRARY_PATH), Playwright and
#     the dev server's wheels installed for Python 3.12, and web/vendor (Pyodide, the wheels, wllama)
# There, while the machine stays warm between calls:
#   playwright/device_check.sh --receive          (one call per piece but the last, carrying .chr/part-N)
#                                                 keeps the piece in $CARRY (/var/tmp/pyshim-carry)
#   playwright/device_check.sh                    (carrying .gl .whl .dev, the last piece and SHA256SUMS)
#     checks and unpacks the pieces when all are there (else the browser's part is skipped, said so) and
#     runs the check; reports go to $REPORT (artifacts/device/), packed into $OUT/device-check.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=${CARRY:-/var/tmp/pyshim-carry}

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

if [ "${1:-}" = "--prepare-browser" ]; then
  set -e
  py=.venv/bin/python
  [ -f web/vendor/pyodide/pyodide.asm.wasm ] || { echo "web/vendor is missing: run 'make setup' first" >&2; exit 1; }
  stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
  # Debian's headless shell (the browser Playwright itself drives headless) and the data files it reads
  # from chromium-common, which must be the same version.
  version=$(dpkg-query -W -f='${Version}' chromium)
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial && apt-get $o update -qq
  (cd "$stage" && apt-get $o download "chromium-headless-shell=$version" "chromium-common=$version")
  for deb in "$stage"/*.deb; do dpkg -x "$deb" "$stage/x"; done
  src=$stage/x/usr/lib/chromium dst=$stage/pack/chromium
  mkdir -p "$dst/lib" "$dst/locales"
  cp -a "$src"/{chromium-headless-shell,headless_command_resources.pak,headless_lib_data.pak,headless_lib_strings.pak} \
    "$src"/{icudtl.dat,snapshot_blob.bin,v8_context_snapshot.bin,resources.pak,chrome_100_percent.pak} \
    "$src"/{libvulkan.so.1,libvk_swiftshader.so,vk_swiftshader_icd.json} "$dst/"
  cp "$src/locales/en-US.pak" "$dst/locales/"
  # Every library it links but the C library itself: the lent machine's image has few of them, and
  # this machine's glibc (2.36) is older than any it would run.
  for lib in $(ldd "$src/chromium-headless-shell" | awk '/=>/ {print $3}'); do
    case $lib in */libc.so*|*/libm.so*|*/libdl.so*|*/libpthread.so*|*/librt.so*|*/libresolv.so*|*/ld-linux*) ;;
      *) cp -L "$lib" "$dst/lib/" ;; esac
  done
  # A bare image has no fontconfig setup either, and the headless shell aborts on a page's first text
  # without one ("SkFontMgr_FontConfigInterface: Not implemented"): one font and a config beside it.
  mkdir -p "$dst/fonts" && cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf "$dst/fonts/"
  printf '%s\n' '<?xml version="1.0"?>' '<!DOCTYPE fontconfig SYSTEM "fonts.dtd">' \
    '<fontconfig><dir prefix="relative">.</dir><cachedir>/tmp/pyshim-fontconfig</cachedir></fontconfig>' \
    > "$dst/fonts/fonts.conf"
  printf '%s\n' '#!/bin/sh' \
    '# Debian'"'"'s chromium-headless-shell with the libraries it was linked against and a font beside it' \
    'here=$(dirname "$(readlink -f "$0")")' \
    'export FONTCONFIG_FILE="${FONTCONFIG_FILE:-$here/fonts/fonts.conf}"' \
    'LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/chromium-headless-shell" "$@"' \
    > "$dst/chrome"
  chmod +x "$dst/chrome"
  # Playwright and the dev server with everything they require on Linux and CPython 3.12, at the versions
  # installed here (a fixed list missed fastapi's new opentelemetry-api once).
  wheels=$($py - <<'PY'
import importlib.metadata as md
from packaging.requirements import Requirement
env = {"extra": "", "python_version": "3.12", "sys_platform": "linux", "platform_system": "Linux",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
pins, todo = {}, ["playwright", "fastapi", "uvicorn"]
while todo:
    dist = md.distribution(todo.pop())
    if dist.name.lower() not in pins:
        pins[dist.name.lower()] = f"{dist.name}=={dist.version}"
        todo += [r.name for r in map(Requirement, dist.requires or []) if not r.marker or r.marker.evaluate(env)]
print(" ".join(sorted(pins.values())))
PY
)
  $py -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --target "$stage/pack/site" $wheels
  mkdir -p "$stage/pack/web" && cp -a web/vendor "$stage/pack/web/"
  rm -rf .chr && mkdir .chr
  tar cf - -C "$stage/pack" chromium site web | xz -9 -T0 | split -b 50M -d -a 1 - .chr/part-
  (cd .chr && sha256sum part-* > SHA256SUMS)
  ls -la .chr
  exit 0
fi

if [ "${1:-}" = "--receive" ]; then
  mkdir -p "$CARRY" && mv -f .chr/part-* "$CARRY/" && ls -la "$CARRY"
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

# The browser's part, when every piece came along (earlier calls' --receive and this call's last one).
BROWSER_MODELS=${BROWSER_MODELS-smollm2-135m,qwen2.5-1.5b}
browser=""
if [ -f .chr/SHA256SUMS ]; then
  mkdir -p "$CARRY" && mv -f .chr/part-* "$CARRY/" 2>/dev/null
  if (cd "$CARRY" && sha256sum --quiet -c -) < .chr/SHA256SUMS; then
    unpacked=/var/tmp/pyshim-browser
    rm -rf "$unpacked" && mkdir -p "$unpacked"
    cat "$CARRY"/part-* | xz -dc | tar x -C "$unpacked" && browser=yes
    [ -d web/vendor ] || cp -a "$unpacked/web/vendor" web/
    export PYTHONPATH=$unpacked/site:$PYTHONPATH PYSHIM_CHROMIUM=$unpacked/chromium/chrome
  fi
fi
[ -n "$browser" ] || echo "Chromium's pieces are not all here (see --prepare-browser): the browser's part is skipped"


# The synthetic models are written while the doctor runs (each up to ~40 s of single-threaded NumPy).
all_models=$(echo "$MODELS${browser:+,$BROWSER_MODELS}" | tr , '\n' | grep . | sort -u | paste -sd,)
[ -n "$all_models" ] && python3 - "$all_models" >"$REPORT/synthetic.log" 2>&1 <<'PY' &
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

echo "== doctor (adapters natively and in Chromium, kernel self-tests, roofline)"
python3 -m pyshim.cli doctor $([ -n "$browser" ] && echo --chromium-gpu || echo --no-browser) --out "$REPORT" --timeout 240
wait
cat "$REPORT/synthetic.log" 2>/dev/null
pack
# Chromium on the same GPU first (the new numbers), each model its own report; the peer (wllama on
# llama.cpp's WebGPU backend) beside the first model only.
peer=${PEER:-wllama}
for model in ${browser:+${BROWSER_MODELS//,/ }}; do
  echo "== bench $model (Chromium, real-GPU flags, peer $peer)"
  timeout "${BROWSER_TIMEOUT:-200}" python3 -m pyshim.cli bench --backends browser --chromium-gpu --peer "$peer" \
    --runs "${RUNS:-1}" --models "$model" --out "$REPORT" ${BUDGET_MB:+--budget-mb $BUDGET_MB} ${BENCH_ARGS:-}
  peer=none
  pack
done
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
