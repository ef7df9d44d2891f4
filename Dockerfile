# ChokaQ for Django: one image for the web process (daphne) and the workers (chokaq_worker).
# Run-time only: the package and its extras (the tools of requirements-dev.txt stay out), no tests/bench/docs
# (.dockerignore), curl/gnupg only while fetching the ODBC driver.
FROM python:3.12-slim

# INSTALL_MSSQL_DRIVER=1 adds Microsoft's ODBC Driver 18 (the `mssql` compose profile builds with it).
ARG INSTALL_MSSQL_DRIVER=0
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 CHOKAQ_VAR_DIR=/app/var

RUN apt-get update \
    && apt-get install -y --no-install-recommends unixodbc ca-certificates \
    && if [ "$INSTALL_MSSQL_DRIVER" = "1" ]; then \
         apt-get install -y --no-install-recommends curl gnupg \
         && curl -fsSL https://packages.microsoft.com/keys/microsoft.asc | gpg --dearmor -o /usr/share/keyrings/microsoft.gpg \
         && echo "deb [signed-by=/usr/share/keyrings/microsoft.gpg] https://packages.microsoft.com/debian/12/prod bookworm main" \
            > /etc/apt/sources.list.d/mssql-release.list \
         && apt-get update && ACCEPT_EULA=Y apt-get install -y --no-install-recommends msodbcsql18 \
         && apt-get purge -y --auto-remove curl gnupg; \
       fi \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . .
# The package with the extras a deployment uses, plus the demo project's settings helper and static server.
RUN pip install --no-cache-dir '.[postgres,redis,mssql,otel,server]' 'dj-database-url>=2.1' 'whitenoise>=6.8' \
    && rm -rf build *.egg-info
# The processes run from /app (manage.py's folder comes first on sys.path), so /app's packages are the ones
# imported, not pip's compiled copy: compile them here, since PYTHONDONTWRITEBYTECODE keeps every process from
# writing .pyc files. Otherwise each worker compiles ChokaQ from source at every start (its start-up memory peak).
RUN python -m compileall -q chokaq_core deck config shop
# Static files with content-hashed names (served by WhiteNoise with a ten-year immutable cache lifetime)
RUN python manage.py collectstatic --noinput -v0
RUN useradd --create-home chokaq && mkdir -p /app/var && chown -R chokaq /app/var
USER chokaq

EXPOSE 8000 9100
# No --proxy-headers here: docker-compose.yml adds it only with DJANGO_BEHIND_PROXY=1 (a declared trusted proxy).
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
