"""qwen3-tts-grpc entry points: the ``qwen3-tts`` command (offline synthesis, dev checkpoint,
local stack, client) composing the stage packages."""
