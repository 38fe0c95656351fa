"""What one synthesis is made of, in the order it happens: the request prepared for its model
(:mod:`.request`, the voice :mod:`.voice`), its text cut into segments (:mod:`.segmentation`) or,
streamed, into utterances as it arrives (:mod:`.text_cutter`, :mod:`.session`), the utterances
run through the stages in sequence (:mod:`.utterances`), every response made by one builder
(:mod:`.responses`), and, asked for, each utterance's word timings (:mod:`.timestamps`);
:mod:`.context` holds what they need of the gateway."""
