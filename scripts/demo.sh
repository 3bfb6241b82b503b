#!/usr/bin/env bash
set -euo pipefail
echo "make demo: not implemented yet" >&2
exit 1
