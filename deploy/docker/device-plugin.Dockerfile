# hami device-plugin image: `hami device-plugin`, `hami monitor` and libvgpu.so.
# Build from the repository root:  docker build -f deploy/docker/device-plugin.Dockerfile .
# (`make images` does this when a container engine exists.)

# libvgpu is preloaded into the GPU containers of every user, so it is built against an
# old glibc: the builder's glibc (2.31 here) is the oldest one a GPU container may have.
ARG LIB_BUILDER_IMAGE=ubuntu:20.04
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# -- stage 1: the C library -----------------------------------------------------------------
FROM ${LIB_BUILDER_IMAGE} AS libvgpu
# The toolchain is pinned by the pinned release image (20.04 gets no new gcc/glibc);
# patch-level pins of libc6-dev would break with every security update.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY native/libvgpu /src/native/libvgpu
RUN make -C native/libvgpu build/libvgpu.so \
    && strip --strip-unneeded native/libvgpu/build/libvgpu.so

# -- stage 2: a virtual environment with hami and its runtime packages ----------------------
FROM ${PYTHON_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/hami/venv
WORKDIR /src
COPY deploy/docker/requirements-device-plugin.txt /src/requirements.txt
RUN /opt/hami/venv/bin/pip install --no-compile -r /src/requirements.txt
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN /opt/hami/venv/bin/pip install --no-compile /src \
    && find /opt/hami/venv -name '__pycache__' -prune -exec rm -rf {} +

# -- stage 3: runtime -------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="hami-device-plugin" \
      org.opencontainers.image.description="hami device plugin, vGPU monitor and libvgpu" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=venv /opt/hami/venv /opt/hami/venv
COPY --from=libvgpu /src/native/libvgpu/build/libvgpu.so /opt/hami/lib/libvgpu.so
ENV PATH=/opt/hami/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Root: it writes kubelet's device-plugin directory and root-owned host paths; the chart
# drops every capability except CHOWN, DAC_OVERRIDE and FOWNER and runs it unprivileged.
# hadolint ignore=DL3002
USER 0:0
EXPOSE 9394
ENTRYPOINT ["hami"]
CMD ["device-plugin"]
