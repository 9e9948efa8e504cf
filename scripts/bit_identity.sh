#!/usr/bin/env bash
# Are the default model's checkpoints bit-identical between two commits of qcal?
# Usage: bash scripts/bit_identity.sh BASE_COMMIT [HEAD_COMMIT] [extra quantize args]
# Each commit is checked out into a temporary worktree (models/ and data/ shared with this
# one), GPTQ (act-order) and AWQ quantize the default model in the GPTQ layout, and the
# sha256 of each model.safetensors is printed; equal digests mean identical weights.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base=$1; head=${2:-HEAD}; shift $(( $# >= 2 ? 2 : 1 )); extra=("$@")
work=$(mktemp -d)
trap 'for t in "$work"/tree-*; do git worktree remove --force "$t" 2>/dev/null || true; done; rm -rf "$work"' EXIT
for rev in "$base" "$head"; do
  tree="$work/tree-$rev"
  git worktree add -q --detach "$tree" "$rev"
  ln -s "$root/models" "$tree/models"; ln -s "$root/data" "$tree/data"
  mkdir "$tree/.kpath"; ln -s ../kernels "$tree/.kpath/qcal_kernels"
  for method in "gptq --desc-act" "awq"; do
    name=${method%% *}
    # shellcheck disable=SC2086
    (cd "$tree" && PYTHONPATH="$tree:$tree/.kpath" "$root/.venv/bin/python" -m qcal quantize \
      --method $method --calib debian-handbook --nsamples 8 --seqlen 256 --format gptq \
      "${extra[@]}" -o "$work/out-$rev-$name" > "$work/$rev-$name.log" 2>&1) \
      || { echo "$rev $name failed: see $work/$rev-$name.log"; exit 1; }
    echo "$rev $name $(sha256sum "$work/out-$rev-$name/model.safetensors" | cut -d' ' -f1)"
  done
done
