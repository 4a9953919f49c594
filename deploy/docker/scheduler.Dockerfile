# hami scheduler image: `hami scheduler` (extender + webhook) and `hami certgen`.
# Build from the repository root:  docker build -f deploy/docker/scheduler.Dockerfile .
# (`make images` does this when a container engine exists.)

ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# -- stage 1: a virtual environment with hami and its runtime packages ----------------------
FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/hami/venv
WORKDIR /src
COPY deploy/docker/requirements-scheduler.txt /src/requirements.txt
RUN /opt/hami/venv/bin/pip install --no-compile -r /src/requirements.txt
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN /opt/hami/venv/bin/pip install --no-compile /src \
    && find /opt/hami/venv -name '__pycache__' -prune -exec rm -rf {} +

# -- stage 2: runtime -------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="hami-scheduler" \
      org.opencontainers.image.description="hami scheduler extender, admission webhook and certgen" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=venv /opt/hami/venv /opt/hami/venv
ENV PATH=/opt/hami/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# No shell needed at run time; the chart runs it read-only as this user.
USER 65532:65532
EXPOSE 9443 9395
ENTRYPOINT ["hami"]
CMD ["scheduler"]
