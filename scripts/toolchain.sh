#!/usr/bin/env bash
# Checks that a Rust toolchain at Cargo.toml's rust-version or newer is on this machine, and says
# how to get one when it is not. It downloads nothing itself: the project's scripts fetch only from
# the package registries (crates.io, PyPI, Debian), never an installer from elsewhere.
# Callers put ~/.cargo/bin on their PATH first (scripts/demo.sh, test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
log() { printf '[toolchain %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml)
if ! command -v cargo >/dev/null; then
  log "ERROR: cargo is missing: install Rust $need or newer (rustup, https://rustup.rs; Debian's rustc is too old)"
  exit 1
fi
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  log "ERROR: rustc $have is older than $need: rustup update stable (or install a newer toolchain)"
  exit 1
fi
