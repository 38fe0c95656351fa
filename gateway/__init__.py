"""The gateway process: the public ``qwen3tts.v1.TextToSpeech`` API.

It validates requests, resolves every default, and drives the three internal stages: the talker
(text -> codec frames), the decoder (frames -> 24 kHz PCM) and the speaker (reference audio ->
x-vector + reference codes), then encodes and streams the audio to the client.
Run it with ``python -m gateway`` (see :mod:`gateway.config` for the flags).
"""
