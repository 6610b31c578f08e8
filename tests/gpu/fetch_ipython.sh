#!/usr/bin/env bash
# Bring IPython to a GPU machine whose image has none (the lent H200's had none on 2026-12-02), for
# tests/gpu/test_attach_gpu.py's notebook test: run HERE, where pip reaches an index. It downloads
# IPython and its dependencies as wheels into .ipython/wheels (about 8 MB; .ipython/ is ignored by
# git). Carry .ipython/wheels to the GPU machine (`run`'s carry: [".ipython/wheels"]): the test
# installs them there into .ipython/site (pip --no-index) and runs its IPython shell with that folder
# on PYTHONPATH, never into the machine's own environment.
#
# Usage: bash tests/gpu/fetch_ipython.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .ipython/wheels
python3 -m pip download -q ipython -d .ipython/wheels
ls .ipython/wheels
