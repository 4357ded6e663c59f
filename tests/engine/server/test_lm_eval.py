"""lm-evaluation-harness's ``local-completions`` model scores log-likelihoods against the server (echo with
logprobs), and its scores equal HF transformers' on the same weights (tests/data/loglikelihood_sample.jsonl)."""
from __future__ import annotations

import json

import pytest

from tests.helpers.hf_logprobs import hf_token_logprobs
from tests.helpers.paths import DATA

lm_eval = pytest.importorskip("lm_eval")

SAMPLE = DATA / "loglikelihood_sample.jsonl"


def test_local_completions_loglikelihoods_equal_hf(server, tiny_path):
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    docs = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    lm = LocalCompletionsAPI(base_url=f"{server.url}/v1/completions", model="tiny", tokenizer=str(tiny_path),
                             tokenizer_backend="huggingface", tokenized_requests=True, max_retries=1, batch_size=2)
    instances = [Instance("loglikelihood", doc, (doc["context"], doc["continuation"]), idx)
                 for idx, doc in enumerate(docs)]
    results = lm.loglikelihood(instances, disable_tqdm=True)
    assert len(results) == len(docs)
    for doc, (loglikelihood, is_greedy) in zip(docs, results, strict=True):
        context, continuation = lm.tok_encode(doc["context"]), lm.tok_encode(doc["continuation"])
        reference = hf_token_logprobs(tiny_path, context + continuation)[len(context) - 1:]
        assert abs(loglikelihood - sum(reference)) < 1e-4, doc
        assert is_greedy is False  # random weights never pick a whole sentence
