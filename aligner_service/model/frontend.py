"""What the aligner's model pass reads: audio to log-mel features, words to the prompt's ids.

Audio (the official ``normalize_audio_input`` for an ``(array, rate)`` input, §12 step 1): mono
(the mean over channels), resampled to 16 kHz with soxr HQ exactly as ``librosa.resample``
(``tts_common.audio.resample``), divided by its peak only if the peak is above 1, clipped to
[-1, 1]. Features: transformers' ``WhisperFeatureExtractor`` built from the checkpoint's
``preprocessor_config.json`` (the official processor's own feature extractor), on each utterance
alone: ``n // 160`` frames of 128 log-mel bands.

The official processor computes the features of a batch on the waveforms zero-padded to the
longest one, so a shorter utterance's last frames (and, when its length is not a multiple of 160
samples, its frame count, hence its audio token count) differ from those of the same utterance
alone. We compute every utterance alone, as the official code does for a batch of one: batching
never changes what an utterance is aligned with.

Prompt (§12 step 3): ``<|audio_start|>`` + ``<|audio_pad|>`` x audio_token_count + ``<|audio_end|>``
then, per word, its tokens and two ``<timestamp>``. The official code tokenizes that whole string;
its added tokens cut it into segments that are normalised and split separately, so tokenizing
each word alone gives the same ids. The split regex is Qwen2's (``tts_common.text.tokenizer``, as
everywhere in this project); the official loader swaps in the "Mistral regex" for a local copy of
a release whose ``config.json`` has no ``transformers_version`` <= 4.57.2 (ARCHITECTURE.md §1, §12),
which for the cleaned words (letters, digits and ``'`` only) changes the ids of words with a
capital after a lower-case letter (``iPhone``) or letters after a contraction (``don'tcha``),
never those of other Latin, CJK, kana or Hangul words.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tts_common.audio import check_sample_rate, resample
from tts_common.text.tokenizer import TextTokenizer, TokenizerError

from .audio_encoder import audio_token_count
from .config import AlignerCheckpointError, ForcedAlignerConfig

SAMPLE_RATE = 16000
"""The rate the features are computed at."""
MIN_SAMPLES = 400
"""Shortest audio at 16 kHz: one STFT window (the feature extractor's reflect padding needs more
than half a window, and the model at least one 10 ms frame)."""
MAX_AUDIO_SECONDS = 180.0
"""Longest audio the official package aligns in one pass (``MAX_FORCE_ALIGN_INPUT_SECONDS``);
a checkpoint with fewer timestamp classes than that needs allows less (see
:attr:`AlignerFrontend.max_audio_seconds`)."""
AUDIO_START = "<|audio_start|>"
AUDIO_END = "<|audio_end|>"
TIMESTAMP = "<timestamp>"


class AlignInputError(ValueError):
    """An alignment input that cannot be used (bad audio, rate, or word list)."""


@dataclass(frozen=True)
class AlignInput:
    """One utterance to align."""

    audio: np.ndarray
    """float32 samples, mono ``[n]`` (``[n, channels]`` is averaged to mono)."""
    sample_rate: int
    """Rate of ``audio`` in Hz (resampled to 16 kHz inside)."""
    words: list[str]
    """The words to time, already split and cleaned (the text processor's output)."""


@dataclass(frozen=True)
class AlignPrompt:
    """An :class:`AlignInput` made ready for the model: its features and prompt ids."""

    features: np.ndarray
    """float32 log-mel features [num_mel_bins, frames]."""
    input_ids: list[int]
    """The prompt's token ids (2 ``<timestamp>`` per word)."""
    num_words: int


def prepare_waveform(
    audio: np.ndarray, sample_rate: int, max_seconds: float = MAX_AUDIO_SECONDS
) -> np.ndarray:
    """Mono float32 16 kHz samples in [-1, 1] as the official package prepares them; raises
    :class:`AlignInputError` for audio that cannot be aligned (over ``max_seconds`` among others)."""
    try:
        rate = check_sample_rate(sample_rate)
    except ValueError as exc:
        raise AlignInputError(str(exc)) from exc
    x = np.asarray(audio)
    if x.dtype.kind != "f":
        raise AlignInputError(f"audio must be floating point samples, got dtype {x.dtype}")
    if x.ndim == 2:
        x = x.astype(np.float32, copy=False).mean(axis=1, dtype=np.float32)
    elif x.ndim != 1:
        raise AlignInputError(f"audio must be [samples] or [samples, channels], got shape {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise AlignInputError("audio contains NaN or infinite samples")
    seconds = x.shape[0] / rate
    if seconds > max_seconds:
        raise AlignInputError(f"audio is {seconds:.1f} s long; at most {max_seconds:g} s can be aligned")
    if rate != SAMPLE_RATE:
        x = resample(x, rate, SAMPLE_RATE)
    if x.shape[0] < MIN_SAMPLES:
        raise AlignInputError(
            f"audio is too short to align ({x.shape[0]} samples at 16 kHz, at least {MIN_SAMPLES})"
        )
    peak = float(np.max(np.abs(x)))
    if peak > 1.0:
        x = x / np.float32(peak)
    return np.clip(x, -1.0, 1.0)


class AlignerFrontend:
    """Features and prompt ids for :class:`AlignInput` s, from a checkpoint's processor files."""

    def __init__(
        self, config: ForcedAlignerConfig, tokenizer: TextTokenizer, feature_extractor: object
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        try:
            self.audio_start_id = tokenizer.token_id(AUDIO_START)
            self.audio_end_id = tokenizer.token_id(AUDIO_END)
            timestamp_id = tokenizer.token_id(TIMESTAMP)
        except KeyError as exc:
            raise AlignerCheckpointError(f"the tokenizer has no {exc.args[0]} token") from exc
        if timestamp_id != config.timestamp_token_id:
            raise AlignerCheckpointError(
                f"config.json timestamp_token_id {config.timestamp_token_id} is not the tokenizer's "
                f"{TIMESTAMP} ({timestamp_id})"
            )
        self._reserved = tuple(tokenizer.added_tokens)
        self.max_audio_seconds = min(
            MAX_AUDIO_SECONDS, config.classify_num * config.timestamp_segment_time / 1000.0
        )
        """Longest audio an input may have: the official limit, or less where the classes cannot
        reach further (the release's 5000 x 80 ms reach 400 s)."""

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: ForcedAlignerConfig) -> AlignerFrontend:
        """Tokenizer (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``) and Whisper feature
        extractor (``preprocessor_config.json``) of checkpoint ``path``."""
        from transformers import WhisperFeatureExtractor  # heavy import: only where a model loads

        root = Path(path)
        try:
            tokenizer = TextTokenizer.from_checkpoint(root)
        except TokenizerError as exc:
            raise AlignerCheckpointError(str(exc)) from exc
        _check_audio_token(root, tokenizer, config)
        if not (root / "preprocessor_config.json").is_file():
            raise AlignerCheckpointError(f"no preprocessor_config.json in {root}")
        extractor = WhisperFeatureExtractor.from_pretrained(str(root))
        if extractor.sampling_rate != SAMPLE_RATE or extractor.feature_size != config.audio.num_mel_bins:
            raise AlignerCheckpointError(
                f"preprocessor_config.json: {extractor.feature_size} mel bands at {extractor.sampling_rate} Hz; "
                f"the model needs {config.audio.num_mel_bins} at {SAMPLE_RATE}"
            )
        return cls(config, tokenizer, extractor)

    def features(self, waveform: np.ndarray) -> np.ndarray:
        """Log-mel features [mel, n // 160] of one 16 kHz waveform."""
        out = self.feature_extractor(  # type: ignore[operator]
            waveform,
            sampling_rate=SAMPLE_RATE,
            padding="longest",
            truncation=False,
            return_attention_mask=False,
            return_tensors="np",
        )
        return np.asarray(out["input_features"][0], dtype=np.float32)

    def word_ids(self, words: Sequence[str]) -> list[int]:
        """The prompt's tail: each word's tokens then two ``<timestamp>``."""
        ts = self.config.timestamp_token_id
        ids: list[int] = []
        for i, word in enumerate(words):
            if not isinstance(word, str) or not word:
                raise AlignInputError(f"word {i} is empty")
            if any(ch.isspace() for ch in word):
                # the official word lists never hold whitespace (they are split on it), and a
                # space would change the word's tokens
                raise AlignInputError(f"word {i} contains whitespace")
            for token in self._reserved:
                if token in word:
                    raise AlignInputError(f"word {i} contains the reserved token text {token!r}")
            ids += self.tokenizer.encode(word)
            ids += [ts, ts]
        return ids

    def prompt_ids(self, mel_frames: int, words: Sequence[str]) -> list[int]:
        """``<|audio_start|>``, the audio placeholders, ``<|audio_end|>``, the words."""
        audio = [self.config.audio_token_id] * audio_token_count(mel_frames)
        return [self.audio_start_id, *audio, self.audio_end_id, *self.word_ids(words)]

    def prepare(self, item: AlignInput) -> AlignPrompt:
        """Validate one input and compute its features and prompt ids."""
        if not isinstance(item.words, (list, tuple)) or not item.words:
            raise AlignInputError("an alignment needs at least one word")
        features = self.features(prepare_waveform(item.audio, item.sample_rate, self.max_audio_seconds))
        ids = self.prompt_ids(features.shape[1], item.words)
        return AlignPrompt(features=features, input_ids=ids, num_words=len(item.words))


def _check_audio_token(root: Path, tokenizer: TextTokenizer, config: ForcedAlignerConfig) -> None:
    """The official processor finds the audio placeholder's text only under
    ``extra_special_tokens.audio_token`` of ``tokenizer_config.json`` (§12); its id must be the
    config's ``audio_token_id``, or the official model would not find the audio positions."""
    try:
        extra = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8")).get(
            "extra_special_tokens"
        )
    except (OSError, ValueError) as exc:
        raise AlignerCheckpointError(f"{root}/tokenizer_config.json: unreadable: {exc}") from exc
    name = extra.get("audio_token") if isinstance(extra, dict) else None
    if not isinstance(name, str):
        raise AlignerCheckpointError(
            f"{root}/tokenizer_config.json: extra_special_tokens.audio_token is missing "
            "(the official processor reads the audio placeholder only from there)"
        )
    try:
        got = tokenizer.token_id(name)
    except KeyError as exc:
        raise AlignerCheckpointError(f"{root}/tokenizer_config.json: {name!r} is not a token") from exc
    if got != config.audio_token_id:
        raise AlignerCheckpointError(
            f"audio token {name!r} has id {got}, config.json audio_token_id is {config.audio_token_id}"
        )
