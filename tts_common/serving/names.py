"""Fully-qualified names of the gRPC services a server exposes, and the method prefixes of the
plumbing services (health, reflection) that answer without readiness or an API key."""

from __future__ import annotations

from types import ModuleType

from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

HEALTH_SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_SERVICE_NAME: str = reflection.SERVICE_NAME

PLUMBING_METHOD_PREFIXES: tuple[str, ...] = (
    f"/{HEALTH_SERVICE_NAME}/",
    f"/{REFLECTION_SERVICE_NAME}/",
    "/grpc.reflection.v1.ServerReflection/",
)
"""Methods of health and reflection (both reflection versions): load balancers and ``grpcurl
list`` use them before a server is ready and without credentials."""


def service_name(pb2_module: ModuleType, service: str) -> str:
    """Fully-qualified name of ``service`` defined in a generated ``*_pb2`` module, e.g.
    ``service_name(tts_pb2, "TextToSpeech") == "qwen3tts.v1.TextToSpeech"``."""
    return pb2_module.DESCRIPTOR.services_by_name[service].full_name


__all__ = ["HEALTH_SERVICE_NAME", "PLUMBING_METHOD_PREFIXES", "REFLECTION_SERVICE_NAME", "service_name"]
