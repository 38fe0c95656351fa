"""Code shared by every qwen3-tts-grpc process: checkpoint config, weights, audio, serving plumbing."""
