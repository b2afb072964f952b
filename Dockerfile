# One image for every gpuloom process: `gpuloom serve NAME` picks the process.
#   docker build -t gpuloom .
#   docker run --rm gpuloom gpuloom --help
# Network use at build time: pip only (PyPI wheels and the setuptools build backend).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Install the package from a throw-away copy of the sources.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs ./libs
COPY services ./services
# `[nvml]`: agents on real GPU nodes discover GPUs and watch their memory through NVML
# (libnvidia-ml.so comes from the host's driver, mounted by the NVIDIA container toolkit).
RUN pip install ".[nvml]" && rm -rf /src

# The migrations are not part of the wheel: ship them beside it.
COPY migrations /opt/gpuloom/migrations
# Inventories of the two simulated nodes of compose.yaml.
COPY deploy/inventory /etc/gpuloom

# Run as an unprivileged user; its data (agent run folders, job logs) under /var/lib/gpuloom.
RUN groupadd --system --gid 10001 gpuloom \
 && useradd --system --uid 10001 --gid gpuloom --home-dir /var/lib/gpuloom --create-home \
      --shell /usr/sbin/nologin gpuloom
USER gpuloom:gpuloom
WORKDIR /var/lib/gpuloom

ENV GPULOOM_MIGRATIONS_DIR=/opt/gpuloom/migrations \
    GPULOOM_DATA_DIR=/var/lib/gpuloom

EXPOSE 8080
CMD ["gpuloom", "--help"]
