"""The aligner stage: word timings for synthesized audio with Qwen3-ForcedAligner (issue 24).

``aligner_service.model`` holds the model (our own ``torch.nn.Module``s loading the released
``Qwen/Qwen3-ForcedAligner-0.6B`` layout); the server is built on :func:`load_aligner`.
"""
