"""Speaker service: x-vector speaker embeddings and ICL reference codes for voice cloning."""
