#!/usr/bin/env bash
# Smoke test of the real window: starts the workbench under Xvfb on an experiment, lets it
# run (QUANTSCOPE_AUTORUN=1), and takes a screenshot of the whole screen with ImageMagick.
#
#   tools/smoke_gui.sh [EXPERIMENT.ron] [TAB] [SECONDS] [OUT.png]
#
# EXPERIMENT defaults to the bundled sample (sample_models/fashion_scenes_deeplab.ron);
# TAB is compare, masks, calibration or log (default compare); SECONDS is how long to wait
# before the screenshot (default 90); OUT defaults to target/smoke_gui_<tab>.png.
# Needs: apt-get install -y xvfb imagemagick
set -euo pipefail
cd "$(dirname "$0")/.."
exp="${1:-sample_models/fashion_scenes_deeplab.ron}"
tab="${2:-compare}"
wait_s="${3:-90}"
out="${4:-target/smoke_gui_${tab}.png}"
: "${CARGO_TARGET_DIR:=target}"
export CARGO_TARGET_DIR
for tool in Xvfb import; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y xvfb imagemagick" >&2; exit 2; }
done
cargo build --quiet
bin="$CARGO_TARGET_DIR/debug/quantscope"
display=":${SMOKE_DISPLAY:-99}"
Xvfb "$display" -screen 0 1600x1000x24 -nolisten tcp &
xvfb_pid=$!
app_pid=""
cleanup() {
  [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null || true
  kill "$xvfb_pid" 2>/dev/null || true
}
trap cleanup EXIT
sleep 2
log="$CARGO_TARGET_DIR/smoke_gui_${tab}.log"
mkdir -p "$(dirname "$out")" "$CARGO_TARGET_DIR"
DISPLAY="$display" WAYLAND_DISPLAY= QUANTSCOPE_AUTORUN=1 QUANTSCOPE_TAB="$tab" \
  "$bin" gui "$exp" >"$log" 2>&1 &
app_pid=$!
for _ in $(seq "$wait_s"); do
  sleep 1
  if ! kill -0 "$app_pid" 2>/dev/null; then
    echo "the workbench exited early; log:" >&2
    cat "$log" >&2
    exit 1
  fi
done
DISPLAY="$display" import -window root "$out"
echo "screenshot: $out (log: $log)"
