#!/bin/bash
# Refresh requirements/lock.txt: the newest versions within pyproject.toml's ranges, installed into a
# fresh venv and frozen (torch by its public version: the `+cpu` label is dropped). Re-measure the
# goldens afterwards: numbers may move with the stack. Usage: requirements/refresh-lock.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3.11}" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check -e '.[book,sweep,test,lab]'
{
  awk '/^#/ { print; next } { exit }' requirements/lock.txt  # the header comment
  "$tmp/venv/bin/pip" freeze --exclude-editable | sed -E 's/^(torch==[^+]+)\+cpu$/\1/' | LC_ALL=C sort -f
} > "$tmp/lock.txt"
mv "$tmp/lock.txt" requirements/lock.txt
echo "requirements/lock.txt refreshed; now: rm -rf .venv && make env && .venv/bin/python -m pytest tests/test_environment.py"
