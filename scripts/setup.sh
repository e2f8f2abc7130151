#!/usr/bin/env bash
# Creates .venv and installs the package editable with pinned torch/torchvision.
# Sourced by scripts/lab and scripts/test; re-running is fast when nothing changed
# (a stamp of pyproject.toml, this file and the requested extras is kept in .venv).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
venv="$root/.venv"

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python_bin="$candidate"; break; fi
  done
fi
[ -n "$python_bin" ] || { echo "setup: no python3 found; install Python 3.11 first" >&2; exit 1; }

case "$(uname -m)" in
  x86_64) torch_pins="torch==2.14.1 torchvision==0.29.1" ;;
  aarch64|arm64) torch_pins="torch==2.9.1 torchvision==0.24.1" ;;
  *) torch_pins="torch torchvision" ;;
esac

stamp_want="$(cat "$root/pyproject.toml" "$root/constraints.txt" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1) $extras $torch_pins"
stamp_file="$venv/.setup-stamp"
if [ -x "$venv/bin/python" ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp_want" ]; then
  exit 0
fi

# This machine's pip mirrors print a warning per package for absent local folders: drop those.
quiet_pip() { "$venv/bin/python" -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

started=$SECONDS
step() { echo "setup [$((SECONDS - started)) s]: $*"; }
step "preparing $venv (torch: $torch_pins; extras: ${extras:-none})"
if [ ! -x "$venv/bin/python" ]; then
  step "creating the virtual environment with $python_bin"
  "$python_bin" -m venv "$venv"
fi
step "upgrading pip"
quiet_pip --upgrade pip
{ read -r torch_options; read -r torch_reason; } < <("$venv/bin/python" "$root/scripts/torch_source.py")
step "installing $torch_pins: $torch_reason (the longest step; quiet while it downloads)"
# shellcheck disable=SC2086
quiet_pip $torch_options $torch_pins
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
step "installing the package (editable) with ${extras:-no} extras within constraints.txt (about 0.3 GB)"
quiet_pip -c "$root/constraints.txt" -e "$spec"
echo "$stamp_want" > "$stamp_file"
step "done"
