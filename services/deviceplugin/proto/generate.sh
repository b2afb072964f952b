#!/bin/sh
# Regenerate services/deviceplugin/api_pb2.py, api_pb2.pyi and api_pb2_grpc.py from
# api.proto with grpcio-tools (the `dev` extra). Run from the repository root:
#   sh services/deviceplugin/proto/generate.sh
# The proto is mapped to services/deviceplugin/api.proto so that the generated gRPC
# module imports its messages as `services.deviceplugin.api_pb2`; the proto package
# stays `v1beta1`, so the method paths are the kubelet's (/v1beta1.DevicePlugin/...).
set -eu
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m grpc_tools.protoc \
  --proto_path=services/deviceplugin=services/deviceplugin/proto \
  --python_out=. --pyi_out=. --grpc_python_out=. \
  services/deviceplugin/api.proto
