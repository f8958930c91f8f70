"""SGLang's layout for one model, TP/PP and options (Prepared): the pools' geometry per pipeline stage and the
plan of `batch` requests of `ctx` tokens; the Mamba state pool's split of a budget (mamba_split)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines import layout
from kvplan.engines.base import KVDtypes, PlanGroup
from kvplan.engines.sglang import dsv4
from kvplan.engines.sglang.pools import KIND_RULES, pooled, rule_of
from kvplan.engines.sglang.rules import ENGINE, MAMBA_FULL_MEMORY_RATIO, Rules
from kvplan.engines.versions import Selected
from kvplan.spec import CrossAttention, LayerCache, ModelSpec, RecurrentState


@dataclass(frozen=True)
class Prepared(layout.StagedLayout):
    selected: Selected[Rules]
    spec: ModelSpec
    stages: tuple[layout.Caches, ...]
    kvd: KVDtypes
    page: int
    tp: int
    pp: int
    hybrid_swa: bool
    state: tuple[dtypes.DType, dtypes.DType]
    assumptions: tuple[str, ...]
    max_total_tokens: int | None = None
    dsa_plain_fp8: bool = False  # a DSA latent in fp8 is stored plain (576 B), not as the 656 B record
    # Encoder tokens a request keeps in the shared token pool (ENCODER_IN_POOL): every pooled layer, self- and
    # cross-attention alike, holds ctx + encoder_tokens rows per request; 0 for every other model
    encoder_tokens: int = 0
    # SGLang's derived context_len where it is not the model maximum kvplan prints (Whisper: 2048), else None
    context_len: int | None = None
    # DeepSeek-V4 (0.5.23, dsv4.py): each stage's counts for DSV4PoolConfigurator, the window, and the
    # --max-running-requests the configurator reserves c128 state rings for; () for every other model
    dsv4: tuple[dsv4.Dsv4Stage, ...] = ()
    dsv4_window: int = 0
    dsv4_requests: int = 0
    # Mamba hybrids (Rules.mamba_pool): one request's state bytes as SGLang charges them (mamba_cache_per_req: every
    # state layer in 0.5.10, the largest stage's in 0.5.23), state slots per running request, r, and a given
    # --max-mamba-cache-size; per_req 0 for every other model
    mamba_per_req: int = 0
    mamba_ratio: int = 0
    mamba_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int | None = None

    @property
    def label(self) -> str:
        return self.selected.label

    def _token_bytes(self, c: LayerCache) -> int:
        return rule_of(c).token_bytes(c, self)

    def cell_size(self, stage: int) -> int:
        """Bytes one token takes across the stage's pooled layers (SGLang's cell_size)."""
        return sum(self._token_bytes(c) for _, c in self.stages[stage] if pooled(c))

    def has_fixed_state(self) -> bool:
        """Cross-attention K/V: a fixed cost per request beside the token pool (not the encoder tokens of
        ENCODER_IN_POOL models, which are pool rows). Mamba slots are a pool of their own (mamba_split)."""
        return any(getattr(rule_of(c), "fixed", False) and not (self.encoder_tokens and isinstance(c, CrossAttention))
                   and not isinstance(c, RecurrentState) for st in self.stages for _, c in st)

    def mamba_split(self, budget: int) -> tuple[int, int]:
        """(max_mamba_cache_size, the token pool's bytes) from a stage's KV budget, as SGLang splits the rest."""
        per, r, rest = self.mamba_per_req, self.mamba_memory_ratio, max(0, budget) / (1 << 30)
        new = self.selected.rules.mamba_padding_slot_charged
        if self.max_mamba_cache_size is not None:
            k = self.max_mamba_cache_size
        elif new:
            k = int((rest * r / (1 + r) * (1 << 30) - per) // per)
        else:
            k = int(rest * r / (1 + r) * (1 << 30) // per)
        pool = (k + 1 if new else k) * per
        return max(0, k), int((rest - pool / (1 << 30)) * (1 << 30))

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        out = []
        for c, layers, rule in layout.groups(ENGINE.name, KIND_RULES, self.stages[stage]):
            if isinstance(rule, layout.NoCacheRule):
                out.append(layout.no_cache_group(c, layers))
            else:
                out.append(rule.group(c, layers, ctx, batch, self))
        return out

    def details(self, ctx: int, batch: int, stage: int) -> dict[str, Any]:
        if self.dsv4:
            st = self.dsv4[stage]
            return {"page_size": self.page, "bytes_per_full_token": st.bytes_per_full_token(),
                    "bytes_per_swa_token": st.bytes_per_swa_token(),
                    "c128_state_fixed_bytes": st.c128_state_fixed_bytes(self.dsv4_requests),
                    "padding_bytes": dsv4.padding_bytes(st, ctx, batch, self.dsv4_window)}
        return {"page_size": self.page, "cell_size": self.cell_size(stage)}
