"""Pipeline stages of a decoder: contiguous runs of layers, the first stage also embedding the tokens and the
last also the final norm and LM head. The simulator's deployments split layers by the same rule
(engine/simulator/deployment.py), so a real stage and a simulated one hold the same layers."""
from __future__ import annotations

import re
from dataclasses import dataclass

LAYER_NAME = re.compile(r"^layers\.(\d+)\.")  # an engine parameter name, "model." removed
FIRST_STAGE_WEIGHTS = ("embed_tokens.",)
LAST_STAGE_WEIGHTS = ("norm.", "lm_head.")


def stage_layer_counts(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per stage: as even as possible, the earlier stages taking the remainder."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"{num_stages} pipeline stages for {num_layers} layers: each stage needs a layer")
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (stage < extra) for stage in range(num_stages))


@dataclass(frozen=True)
class PipelineStage:
    index: int
    num_stages: int
    layers: range  # the model's layer indices this stage runs

    @classmethod
    def of(cls, num_layers: int, index: int, num_stages: int) -> PipelineStage:
        counts = stage_layer_counts(num_layers, num_stages)
        start = sum(counts[:index])
        return cls(index, num_stages, range(start, start + counts[index]))

    @classmethod
    def whole(cls, num_layers: int) -> PipelineStage:
        return cls.of(num_layers, 0, 1)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.num_stages - 1

    def local_name(self, name: str, tie_word_embeddings: bool) -> str | None:
        """The name of checkpoint weight ``name`` (engine naming) in this stage's model, its layer renumbered
        from 0; None when the stage does not hold it. With tied embeddings the last stage's LM head is the
        embedding matrix."""
        if (match := LAYER_NAME.match(name)) is not None:
            layer = int(match.group(1))
            return f"layers.{layer - self.layers.start}.{name[match.end():]}" if layer in self.layers else None
        if name.startswith(FIRST_STAGE_WEIGHTS):
            if self.first:
                return name
            return "lm_head.weight" if self.last and tie_word_embeddings and name == "embed_tokens.weight" else None
        if name.startswith(LAST_STAGE_WEIGHTS):
            return name if self.last else None
        return name
