"""Decoder service: 12 Hz codec frames -> 24 kHz float32 PCM (streaming, causal, with left context)."""
