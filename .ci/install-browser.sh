#!/usr/bin/env bash
# Make Debian's Chromium available for the browser tests (tests/browser, marker `browser`).
# Playwright itself comes from pip (requirements-dev.txt); we never run `playwright install`:
# the tests drive /usr/bin/chromium. Idempotent: does nothing when Chromium is already there.
# Exits 0 even when Chromium cannot be installed (not root, no apt-get, no network): the browser
# tests then skip with a message saying why.
set -uo pipefail
CHROMIUM="${LLMCOURSE_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-browser: no apt-get here; browser tests will be skipped (install Chromium at $CHROMIUM)" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install-browser: not root and no password-less sudo; browser tests will be skipped" >&2
    echo "install-browser: run 'sudo apt-get install -y chromium' to enable them" >&2
    exit 0
  fi
fi
echo "install-browser: installing Debian's chromium (apt-get) for the browser tests ..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq >/dev/null; then
  echo "install-browser: apt-get update failed; browser tests will be skipped" >&2
  exit 0
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
  echo "install-browser: apt-get install chromium failed; browser tests will be skipped" >&2
  exit 0
fi
echo "install-browser: $("$CHROMIUM" --version 2>/dev/null || echo "chromium installed")" >&2
