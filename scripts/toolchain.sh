#!/usr/bin/env bash
# Makes sure a Rust toolchain at Cargo.toml's rust-version or newer is on this machine: installs it
# with rustup (https://rustup.rs) into ~/.cargo when cargo is missing (Debian's own rustc is too old),
# or updates a rustup toolchain that is older. Idempotent; does nothing when cargo is recent enough.
# Callers then put it on their PATH: export PATH="$HOME/.cargo/bin:$PATH" (scripts/demo.sh, test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
log() { printf '[toolchain %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml)
if ! command -v cargo >/dev/null; then
  log "installing Rust $need or newer with rustup"
  apt=()
  command -v curl >/dev/null || apt+=(curl ca-certificates)
  command -v cc >/dev/null || apt+=(build-essential)
  if [ ${#apt[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { log "ERROR: needs ${apt[*]}: install them (as root) first"; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${apt[@]}" >/dev/null
  fi
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y -q --profile minimal
fi
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
  command -v rustup >/dev/null || { log "ERROR: rustc $have is older than $need; install a newer toolchain (https://rustup.rs)"; exit 1; }
  log "rustc $have is older than $need: rustup update stable"
  rustup update stable
fi
