"""The gateway's transport-free core, one module per concern (:mod:`.gateway` assembles them):
Synthesize (:mod:`.unary`), StreamingSynthesize (:mod:`.streamed`), registered voices
(:mod:`.voices`), model descriptions (:mod:`.catalog`) and the stream places they share
(:mod:`.admission`)."""

from .gateway import Gateway

__all__ = ["Gateway"]
