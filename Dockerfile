# The image every dl2ray pod runs on Kubernetes: the agent (configs/k8s/agent.yaml) and each DL2Job's
# coordinator, PS and worker pods (clusters/k8s/objects.py writes their command lines:
#   python -m clusters.k8s.coordinator --host $(POD_IP) --port 5555 ...
#   python -m elastic_mxnet.server --host $(POD_IP)
#   python -m elastic_mxnet.demo_train --model mlp ...
# the same commands the tests run as local processes behind the emulated pods, tests/clusters/k8s/kubelet.py).
#   docker build -t dl2ray:0.1.0 .
FROM python:3.11-slim

# MXNet 1.9.1 links libgomp and libquadmath; the wheel does not ship them.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libquadmath0 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY dl2ray ./dl2ray
COPY clusters ./clusters
COPY serve ./serve
COPY elastic_mxnet ./elastic_mxnet
COPY configs ./configs
COPY models ./models

# torch is pinned to 2.13.0; take the CPU build (the default index would pull the CUDA one).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu . \
    && python -c "import elastic_mxnet._mx, elastic_mxnet.server, elastic_mxnet.demo_train, clusters.k8s.coordinator"

ENV PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
RUN useradd --uid 1000 --create-home dl2ray
USER 1000
CMD ["dl2ray", "--help"]
