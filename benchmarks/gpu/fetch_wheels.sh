#!/usr/bin/env bash
# Here, before a GPU check: the wheels drill needs that the GPU machine's image lacks (it has
# torch, numpy, xxhash, rich, pyyaml, psutil, prometheus-client, pytest, hypothesis), for its
# Python 3.12 on x86-64, into .whl/ (ignored by git; carried by the `run` call).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
fetch() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d .whl "$@"; }
fetch "typer==0.28.0" "annotated-doc>=0.0.2" "shellingham>=1.3" \
      "sqlalchemy>=2.0,<3" "greenlet>=3" "alembic>=1.13" "mako>=1.3" \
      "apscheduler>=3.10,<4" "tzlocal>=5" \
      "boto3>=1.34" "botocore>=1.34" "s3transfer>=0.10" "jmespath>=1" \
      "psycopg>=3.1" "psycopg-binary>=3.1"
du -sh .whl
