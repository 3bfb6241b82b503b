#!/usr/bin/env bash
set -euo pipefail
echo "make bench: not implemented yet" >&2
exit 1
