"""The gateway process: the public ``qwen3tts.v1.TextToSpeech`` API over one or more models.

Its subpackages read in the order a request flows:

1. :mod:`gateway.transports` — gRPC (:mod:`~gateway.transports.grpc_api`) and the
   OpenAI-compatible HTTP API (:mod:`~gateway.transports.http`), API keys;
2. :mod:`gateway.core` — the transport-free core, one module per concern: Synthesize,
   StreamingSynthesize, voices, model descriptions, admission (:class:`gateway.core.Gateway`);
3. :mod:`gateway.synthesis` — what one synthesis is made of: a request prepared for its model,
   its text cut into segments or utterances, the utterances run in sequence, and the one
   response builder that counts the samples sent;
4. :mod:`gateway.stages` — the served models (talker replicas, speaker stage, model info,
   tokenizer) and the shared decoder pool: pipelines, routing, failover;
5. :mod:`gateway.encoding` — the output chain (speed, resampling, codecs).

:mod:`gateway.voice_library` keeps registered voices (the voice library every gateway over
one database shares: SQLite or PostgreSQL) and :mod:`gateway.config` the settings; the library
imports nothing else of the gateway, the settings only the library's own. Run it with ``python -m
gateway`` (see :mod:`gateway.config` for the flags).
"""
