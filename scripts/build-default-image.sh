#!/usr/bin/env bash
# Builds the offline default image lazyfork/debian:bookworm (debootstrap minbase + python3
# + procps from the machine's Debian mirror) and registers it in the image store. Exits at
# once if it is already there. The work is done by `lazyfork image build-default`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${LAZYFORK:-$PWD/bin/lazyfork}" image build-default
