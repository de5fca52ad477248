#!/usr/bin/env bash
# Runs the loader fuzz harness (tests/fuzz_loader.rs) for longer than CI's ~40 s, in release mode.
#
#   tools/fuzz.sh [SECONDS]          # default 600 (10 minutes), a fresh seed
#   FUZZ_SEED=123 tools/fuzz.sh 60   # replay the mutants of a given seed
#   FUZZ_SEED=123 FUZZ_ITER=4567 tools/fuzz.sh   # replay one mutant alone (prints its edits)
#
# Mutants of the bundled models go through Model::from_bytes, then an FP32 CPU engine is built
# and run once. The first line printed is the seed (FUZZ_SEED reproduces the run); the last is the
# summary (mutants, loaded, built, ran, loader crashes, contained tract panics by location).
# A panic in the loader fails the run; each crashing mutant is written to
# target/fuzz-crashes/<seed>-<i>.onnx (a hang to <seed>-<i>-hang.onnx), and the first mutant per
# contained-panic location to target/fuzz-crashes/contained-<seed>-<i>.onnx.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SEED=${FUZZ_SEED:-random} FUZZ_SECONDS=${1:-600} exec cargo test --release --test fuzz_loader -- --nocapture
