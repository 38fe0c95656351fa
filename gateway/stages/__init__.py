"""The gateway's side of the stage processes, one served model at a time.

:mod:`.models` (every served model by name, the shared decoder pool, the startup check that it
decodes them all) over :mod:`.backend` (one model: talker replicas, speaker stage, model info
:mod:`.model_info`, tokenizer :mod:`.tokens`); :mod:`.pipeline` (one utterance: Talker.Generate
piped into Decoder.Decode, failing over between replicas: :mod:`.failover`, chosen by
:mod:`.routing`), :mod:`.speaker` (reference audio to a voice), :mod:`.aligner` (an utterance's
audio and text to word timings; one pool for every model, like the decoder's) and :mod:`.errors`
(what a failed stage call becomes).
"""
