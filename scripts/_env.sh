# Sourced by scripts/run and scripts/test: find a Python 3.12+ interpreter,
# create .venv beside the project, install requirements-dev.txt and the project
# itself (editable, with every extra) into it — only when pyproject.toml or
# requirements-dev.txt changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

find_python() {
    local candidates=()
    [ -n "${CHOKAQ_PYTHON:-}" ] && candidates+=("$CHOKAQ_PYTHON")
    candidates+=(python3.13 python3.12 python3 python)
    if command -v pyenv >/dev/null 2>&1; then
        local root; root="$(pyenv root)"
        for d in "$root"/versions/3.1[2-9]*/bin/python "$root"/versions/3.[2-9][0-9]*/bin/python; do
            [ -x "$d" ] && candidates+=("$d")
        done
    fi
    for d in "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]; do
        [ -x "$d" ] && candidates+=("$d")
    done
    for c in "${candidates[@]}"; do
        if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
            command -v "$c" 2>/dev/null || echo "$c"
            return 0
        fi
    done
    echo "No Python 3.12+ interpreter found (set CHOKAQ_PYTHON=/path/to/python3.12)" >&2
    return 1
}

VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
    PY="$(find_python)"
    echo "Creating .venv with $("$PY" -V)"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.requirements.sha"
EXTRAS="postgres,redis,mssql,otel,server"
WANT="$(cat pyproject.toml requirements-dev.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
    echo "Installing requirements-dev.txt and django-chokaq[$EXTRAS] (editable) into .venv"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt -e ".[$EXTRAS]" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export PYTHONUNBUFFERED=1
