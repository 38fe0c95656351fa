"""Loading a checkpoint's talker stage: config, text tokenizer and the Talker weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from tts_common.config import CheckpointConfig, load_checkpoint_config
from tts_common.text.tokenizer import TextTokenizer, read_tokenizer_files
from tts_common.weights import load_module_weights

from .prompt import PromptInputs, TalkerPrompt, build_prompt
from .talker import KVCache, Talker


@dataclass
class TalkerModel:
    """Everything the talker stage needs from one checkpoint directory."""

    config: CheckpointConfig
    tokenizer: TextTokenizer
    talker: Talker
    device: torch.device
    dtype: torch.dtype
    tokenizer_files: dict[str, bytes] = field(default_factory=dict, repr=False)
    """The files ``tokenizer`` was built from (the talker serves them to the gateway)."""

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> TalkerModel:
        """Load ``path`` strictly (float32 default like the official loader; bfloat16 selectable).

        The linear layers are torch's: the engine that runs the model chooses its kernels for
        the batches it will run (:class:`~talker_service.engine.TalkerEngine`).
        """
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"unsupported dtype {dtype}")
        cfg = load_checkpoint_config(path)
        files = read_tokenizer_files(cfg.path)
        tokenizer = TextTokenizer.from_files(files, source=str(cfg.path))
        with torch.device("meta"):
            talker = Talker(cfg.model.talker)
        # Built on the meta device (no random init of ~1e9 parameters), then materialised.
        talker = talker.to_empty(device=device).to(dtype)
        load_module_weights(talker, cfg.weights_path, "talker.", dtype=dtype)
        talker.eval().requires_grad_(False)
        return cls(
            config=cfg,
            tokenizer=tokenizer,
            talker=talker,
            device=torch.device(device),
            dtype=dtype,
            tokenizer_files=files,
        )

    def build_prompt(
        self,
        request: PromptInputs,
        text_ids: list[int] | None = None,
        text_open: bool = False,
        role_ids: list[int] | None = None,
    ) -> TalkerPrompt:
        """The talker prompt of ``request`` (validated by the caller); the other arguments as in
        :func:`~talker_service.model.prompt.build_prompt` (incremental text)."""
        return build_prompt(
            self.talker, self.tokenizer, self.config.model, request, text_ids, text_open, role_ids
        )

    def allocate_cache(self, num_slots: int, max_len: int) -> KVCache:
        """A talker KV cache for ``num_slots`` concurrent requests of ``max_len`` positions."""
        return KVCache.allocate(self.config.model.talker, num_slots, max_len, self.device, self.dtype)
