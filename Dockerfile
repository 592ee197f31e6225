# gpuq image: the library, the `gpuq` CLI and the ready worker apps (workers/), no dev extras.
# One image serves every role; the compose command picks it: reaper, worker, exporter, enqueue,
# status.
#
#   docker build -t gpuq:local .
#   docker run --rm gpuq:local --help

# --- build: a wheel of the project (setuptools needs the package dirs to build it) -----------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# README.md is pyproject's readme (the wheel's description); the * keeps the build going without it
COPY pyproject.toml README.md* ./
COPY gpuq ./gpuq
COPY workers ./workers
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- runtime -----------------------------------------------------------------------------------
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, read from [project].dependencies alone (no extras), so this layer is
# rebuilt only when pyproject.toml changes, not on every source edit.
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/pyproject.toml /tmp/requirements.txt

# Then the project itself: its dependencies are already met, so pip only checks them.
COPY --from=build /wheels /tmp/wheels
RUN pip install /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && pip check

RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/gpuq gpuq
USER 10001:10001
WORKDIR /home/gpuq

# Metrics ports, for the record (each needs its flag): gpuq exporter --port 9108 (the pool),
# gpuq worker --metrics-port 9200 (one worker's GPU and tasks).
EXPOSE 9108 9200

# Exec form: gpuq gets SIGTERM itself (workers drain on it; compose adds an init as PID 1).
ENTRYPOINT ["gpuq"]
CMD ["--help"]
