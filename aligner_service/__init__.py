"""The aligner stage: word (or character) timings for synthesized audio with Qwen3-ForcedAligner
(issue 24).

Read in the order a request flows: :mod:`.server` (the gRPC servicer) cuts the text into units
(:mod:`.text`), collects concurrent utterances into batches (:mod:`.batcher`) for one forward
pass of the model (:mod:`.model`: our own ``torch.nn.Module``s loading the released
``Qwen/Qwen3-ForcedAligner-0.6B`` layout, :func:`~aligner_service.model.load_aligner`), and
repairs the timestamps (:mod:`.text.repair`).
"""
