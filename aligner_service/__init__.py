"""Aligner service: word (or character) timings for an utterance's audio (Qwen3-ForcedAligner)."""
