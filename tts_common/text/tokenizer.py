"""Qwen2 byte-level BPE text tokenizer built from a checkpoint's slow-tokenizer files.

Shared: the talker builds its prompts with it, the gateway counts text tokens with the same files
(served by the talker, ``Talker.GetTokenizer``) to cut long texts into segments.

The official package loads ``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json`` through
``Qwen2TokenizerFast``; we build the equivalent ``tokenizers.Tokenizer`` directly (no
``transformers`` import): NFC normaliser, Qwen2 split regex (isolated) followed by ByteLevel
without its own regex, BPE without unk/prefix/suffix, ByteLevel decoder, and the added tokens of
``added_tokens_decoder``. The split regex is Qwen2's (ARCHITECTURE.md §1: the fixtures and hub-id
loading use it, not the "Mistral regex" patch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


SYNTHESIS_ROLE = "<|im_start|>assistant\n"
"""What precedes the text in :meth:`TextTokenizer.synthesis_ids`."""
SYNTHESIS_TAIL = "<|im_end|>\n<|im_start|>assistant\n"
"""What follows the text in :meth:`TextTokenizer.synthesis_ids`."""
ROLE_SEGMENT = "assistant\n"
"""The part of :data:`SYNTHESIS_ROLE` after its special token: the start of the text's segment
(added tokens cut the input into segments that are normalised and split separately)."""
SYNTHESIS_TEMPLATE = SYNTHESIS_ROLE + "{}" + SYNTHESIS_TAIL
"""The text to speak in the official chat template."""
INSTRUCT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n"
"""An instruction in the official chat template (prepended to the prompt)."""
REF_TEMPLATE = "<|im_start|>assistant\n{}<|im_end|>\n"
"""A voice-clone reference transcript in the official chat template."""

ROLE_TOKENS = 3
"""Tokens of ``<|im_start|>assistant\\n`` in front of the text in :meth:`TextTokenizer.synthesis_ids`."""
TAIL_TOKENS = 5
"""Tokens of ``<|im_end|>\\n<|im_start|>assistant\\n`` behind the text."""


class TokenizerError(ValueError):
    """The checkpoint's tokenizer files are missing or inconsistent."""


TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
"""The checkpoint files the tokenizer is built from (the last one optional)."""


def read_tokenizer_files(path: str | Path) -> dict[str, bytes]:
    """The contents of the :data:`TOKENIZER_FILES` present in checkpoint directory ``path``."""
    root = Path(path)
    return {name: (root / name).read_bytes() for name in TOKENIZER_FILES if (root / name).is_file()}


class TextTokenizer:
    """Text -> token ids exactly as the official processor (with the Qwen2 split regex)."""

    def __init__(self, tokenizer: Tokenizer, added: dict[str, int], plain_added: bool = True) -> None:
        self._tok = tokenizer
        self._added = dict(added)
        self._split = pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False)
        self.plain_added_tokens = plain_added
        """Every added token is matched on the raw text as is (not normalised, no whitespace
        stripping, no word-boundary rule): what the incremental tokenizer relies on."""

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> TextTokenizer:
        """Build from ``vocab.json``, ``merges.txt`` and ``tokenizer_config.json`` of ``path``."""
        return cls.from_files(read_tokenizer_files(path), source=str(path))

    @classmethod
    def from_files(cls, files: Mapping[str, bytes], source: str = "tokenizer files") -> TextTokenizer:
        """Build from the contents of the files :data:`TOKENIZER_FILES` names (as
        :func:`read_tokenizer_files` returns them, or as the talker serves them to the gateway);
        ``tokenizer_config.json`` is optional. ``source`` names them in error messages."""
        for name in ("vocab.json", "merges.txt"):
            if name not in files:
                raise TokenizerError(f"missing tokenizer file: {source}/{name}")
        try:
            vocab: dict[str, int] = json.loads(files["vocab.json"].decode("utf-8"))
            cfg: dict = (
                json.loads(files["tokenizer_config.json"].decode("utf-8"))
                if "tokenizer_config.json" in files
                else {}
            )
            merges_text = files["merges.txt"].decode("utf-8")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"unreadable tokenizer files in {source}: {exc}") from exc
        merges: list[tuple[str, str]] = []
        for i, line in enumerate(merges_text.split("\n")):
            # The first line is the "#version" header; blank lines carry nothing.
            if (i == 0 and line.startswith("#version")) or not line.strip():
                continue
            a, _, b = line.partition(" ")
            merges.append((a, b))
        cfg_file = f"{source}/tokenizer_config.json"

        tok = Tokenizer(
            models.BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                unk_token=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                byte_fallback=False,
            )
        )
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()

        added: dict[str, int] = {}
        plain = True
        entries = sorted(((int(k), v) for k, v in (cfg.get("added_tokens_decoder") or {}).items()))
        for tid, spec in entries:
            token = AddedToken(
                spec["content"],
                single_word=bool(spec.get("single_word", False)),
                lstrip=bool(spec.get("lstrip", False)),
                rstrip=bool(spec.get("rstrip", False)),
                normalized=bool(spec.get("normalized", not spec.get("special", False))),
                special=bool(spec.get("special", False)),
            )
            if token.special:
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            got = tok.token_to_id(spec["content"])
            if got != tid:
                raise TokenizerError(
                    f"{cfg_file}: added token {spec['content']!r} got id {got}, config says {tid} "
                    "(added tokens must follow the vocabulary contiguously)"
                )
            added[spec["content"]] = tid
            plain = plain and not (token.normalized or token.lstrip or token.rstrip or token.single_word)
        return cls(tok, added, plain)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added; special-token strings map to their ids)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text``: the measure segments are packed by (a ``TokenCounter``). A text
        placed in the synthesis template tokenizes the same (the template's special tokens and
        line break stand apart in the split regex), so this is the talker's ``text_tokens``."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    @property
    def added_tokens(self) -> tuple[str, ...]:
        """The contents of the added (and special) tokens, matched in the raw text first."""
        return tuple(self._added)

    def normalize(self, text: str) -> str:
        """``text`` through the tokenizer's normaliser (NFC)."""
        return self._tok.normalizer.normalize_str(text)

    def split(self, normalized: str) -> list[tuple[int, int]]:
        """Character spans of the pre-tokens of ``normalized`` (Qwen2 split regex): BPE merges
        never cross them."""
        return [span for _, span in self._split.pre_tokenize_str(normalized)]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Inverse of :meth:`encode` (for logs and debugging)."""
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, content: str) -> int:
        """Id of an added/special token (e.g. ``"<|im_start|>"``); KeyError if unknown."""
        tid = self._added.get(content)
        if tid is None:
            tid = self._tok.token_to_id(content)
        if tid is None:
            raise KeyError(content)
        return tid

    # Chat-template wrappers used by the official prompt builder (ARCHITECTURE.md §4).
    def synthesis_ids(self, text: str) -> list[int]:
        """``<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n``: the text's tokens
        with :data:`ROLE_TOKENS` in front and :data:`TAIL_TOKENS` behind."""
        return self.encode(SYNTHESIS_TEMPLATE.format(text))

    def text_ids(self, text: str) -> list[int]:
        """The tokens of ``text`` as the prompt uses them: :meth:`synthesis_ids` without the role
        and tail tokens (the official ``ids[3:-5]``, quirks included: a text starting with a line
        break merges it into the role's)."""
        return self.synthesis_ids(text)[ROLE_TOKENS:-TAIL_TOKENS]

    def instruct_ids(self, instruct: str) -> list[int]:
        """``<|im_start|>user\\n{instruct}<|im_end|>\\n``."""
        return self.encode(INSTRUCT_TEMPLATE.format(instruct))

    def ref_ids(self, ref_text: str) -> list[int]:
        """``<|im_start|>assistant\\n{ref_text}<|im_end|>\\n`` (ICL reference transcript)."""
        return self.encode(REF_TEMPLATE.format(ref_text))
