"""Speech-tokenizer decoder models: whole-utterance and seamless streaming decoding."""
