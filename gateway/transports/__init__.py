"""The gateway's transports: how requests arrive and answers leave, each a thin layer over the
transport-free core (:class:`gateway.core.Gateway`): the gRPC API (:mod:`.grpc_api`), the
OpenAI-compatible HTTP API with its WebSocket and playground (:mod:`.http`), and the API keys
both check (:mod:`.auth`)."""
