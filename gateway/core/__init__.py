"""The gateway's transport-free core, one module per concern (:mod:`.gateway` assembles them):
Synthesize (:mod:`.unary`), StreamingSynthesize (:mod:`.streamed`), registered voices
(:mod:`.voices`, :mod:`.designs`; the process's voice library, :mod:`.library`), model
descriptions (:mod:`.catalog`) and the stream places they share (:mod:`.admission`)."""

from .gateway import Gateway

__all__ = ["Gateway"]
