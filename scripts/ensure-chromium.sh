#!/usr/bin/env bash
# Headless Chromium for the status page's browser test (tests/integration/test_status_page.py): Debian's
# `chromium` package, installed once where missing. Prints the browser's path; exits non-zero, saying why, if it
# cannot be installed (not root and no sudo, no package source reached).
set -euo pipefail

found() { command -v chromium || command -v chromium-browser; }

if path=$(found); then echo "$path"; exit 0; fi
if [ "$(id -u)" = 0 ]; then as_root=(); elif command -v sudo >/dev/null; then as_root=(sudo -n); else
    echo "ensure-chromium: chromium is missing and installing it needs root (apt-get install chromium)" >&2; exit 1
fi
log=$(mktemp)
if ! { "${as_root[@]}" apt-get update -qq && DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq \
        --no-install-recommends chromium; } >"$log" 2>&1; then
    tail -20 "$log" >&2
    echo "ensure-chromium: could not install Debian's chromium package (see above)" >&2
    rm -f "$log"; exit 1
fi
rm -f "$log"
if path=$(found); then echo "$path"; exit 0; fi
echo "ensure-chromium: chromium was installed but is not on PATH" >&2
exit 1
