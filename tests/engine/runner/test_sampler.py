"""The batched sampler: greedy rows (a native argmax on the CPU), exact top-k / top-p masks, distributions,
seeded reproducibility."""
import pytest
import torch

from stallfree.engine.request import SamplingParams
from stallfree.engine.runner.sampler import filtered_logits, first_argmax, sample


def reference_mask(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """One row, the row-by-row way: temperature, then top-k, then top-p (keeps the first token)."""
    logits = logits / p.temperature
    if p.top_k > 0:
        kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        probs = sorted_logits.softmax(-1)
        drop = (probs.cumsum(-1) - probs) >= p.top_p
        logits = logits.index_fill(0, order[drop], float("-inf"))
    return logits


def test_all_greedy_is_the_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1)] * 2 + [SamplingParams(temperature=0.0)]
    assert torch.equal(sample(logits, params, [None] * 5), logits.argmax(-1))


def test_greedy_takes_the_first_of_tied_maxima_as_argmax_does():
    logits = torch.zeros(3, 32000)
    logits[0, [7, 9000, 31999]] = 5.0  # ties far apart: a vectorized or parallel reduction may split them
    logits[1, [31998, 31999]] = 1.0
    logits[2, :] = -3.0  # all equal
    ids = sample(logits, [SamplingParams(temperature=0.0)] * 3, [None] * 3)
    assert ids.tolist() == [7, 31998, 0] == logits.argmax(-1).tolist()


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 33, 32000])  # within one vector, at its edge, with a tail
def test_first_argmax_matches_argmax_on_any_width_and_row_stride(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 3, (9, vocab + 5), generator=g).float()[:, 2:vocab + 2]  # many ties, strided rows
    logits[4, -1] = 10.0  # in the tail
    assert torch.equal(first_argmax(logits), logits.argmax(-1))


def test_top_k_and_top_p_masks_match_the_row_by_row_reference():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 40, generator=g)
    logits[2, :10] = 1.5  # ties around the k-th value
    params = [SamplingParams(temperature=0.8, top_k=5), SamplingParams(top_p=0.5),
              SamplingParams(temperature=1.3, top_k=12, top_p=0.9), SamplingParams(),
              SamplingParams(top_k=100, top_p=0.01), SamplingParams(temperature=0.5, top_k=3, top_p=0.7)]
    batched = filtered_logits(logits, params)
    for row, p in enumerate(params):
        expected = reference_mask(logits[row], p)
        assert torch.equal(batched[row].isinf(), expected.isinf()), row
        torch.testing.assert_close(batched[row][~expected.isinf()], expected[~expected.isinf()])


def empirical(logits: torch.Tensor, p: SamplingParams, draws: int = 20000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)  # one generator shared by every row: one batched draw
    tokens = sample(logits.expand(draws, -1), [p] * draws, [gen] * draws)
    return torch.bincount(tokens, minlength=logits.shape[-1]).double() / draws


def test_sampled_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    for p in (SamplingParams(temperature=0.7), SamplingParams(top_k=2), SamplingParams(top_p=0.8),
              SamplingParams(temperature=2.0, top_k=4, top_p=0.9)):
        expected = filtered_logits(logits, [p])[0].softmax(-1).double()
        freq = empirical(logits, p)
        assert torch.all(freq[expected == 0] == 0), p  # masked tokens are never drawn
        assert torch.allclose(freq, expected, atol=0.02), (p, freq, expected)  # ~6 standard deviations


def test_seeded_rows_repeat_their_tokens_in_any_batch():
    vocab = 64
    g = torch.Generator().manual_seed(3)
    steps = [torch.randn(5, vocab, generator=g) for _ in range(4)]
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=42)

    def run(row: int, companions: list[SamplingParams]) -> list[int]:
        """The seeded request at ``row`` of a batch with other requests, over several steps."""
        own, shared = torch.Generator().manual_seed(42), torch.Generator().manual_seed(0)
        params = companions[:row] + [seeded] + companions[row:]
        gens = [None if p.greedy else own if p is seeded else shared for p in params]
        out = []
        for logits in steps:
            batch = torch.cat([logits[1:row + 1], logits[:1], logits[row + 1:len(params)]])  # its row moves
            out.append(int(sample(batch, params, gens)[row]))
        return out

    alone = run(0, [])
    assert run(2, [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_k=3)]) == alone
    assert run(1, [SamplingParams(temperature=0.5, seed=1), SamplingParams()]) == alone
