"""Iterations of an exact shape, produced through the engine's public API: requests are added so that the
scheduler builds the wanted iteration (nothing here calls the model), so a study runs unchanged on any runner
(the real model, or a simulated deployment on a virtual clock).

* decode-only batches of B at context C: the ``vllm`` policy (prefill-prioritizing, whole prompts) prefills
  newcomers while the running requests wait, so everyone decodes at the same context; batch sizes grow
  in place (the newcomers' prompts match the running requests' length);
* a prefill-only iteration of P tokens: one prompt of P tokens alone (``vllm``), sampling its one token;
* a hybrid iteration of c - k prefill tokens plus k decodes: ``sarathi`` with a token budget of c, k requests
  decoding, and a prompt of c - k tokens;
* a chunked prefill of L tokens at chunk size c: ``sarathi`` with budget c and a prompt of L tokens alone.

Every shape runs ``warmup`` unmeasured times first (one-off costs: kernel and oneDNN primitive creation).
"""
from __future__ import annotations

import random
from collections.abc import Iterator

from stallfree.engine import LLMEngine, SamplingParams

ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


class ShapeError(RuntimeError):
    """The scheduler built another iteration than the one asked for."""


class IterationDriver:
    def __init__(self, engine: LLMEngine, warmup: int, repeats: int, seed: int = 0):
        self.engine, self.warmup, self.repeats = engine, warmup, repeats
        self.rng = random.Random(seed)
        self.max_prompt = engine.max_model_len - 1
        self.request_ids: list[str] = []  # every request added since the last reset

    # -- plumbing ----------------------------------------------------------------------------------

    def _prompt(self, tokens: int) -> list[int]:
        return [self.rng.randrange(3, self.engine.vocab_size) for _ in range(tokens)]

    def _add(self, tokens: int, max_tokens: int = 1) -> None:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True) if max_tokens > 1 \
            else ONE_TOKEN
        self.request_ids.append(self.engine.add_request(self._prompt(tokens), params))

    def _step(self, required: bool = True):
        """One iteration; its BatchRecord. A pipelined deployment's step may only collect the micro-batch in
        flight and run none: None then, unless ``required``."""
        before = len(self.engine.batch_records)
        self.engine.step()
        if len(self.engine.batch_records) == before:
            if required:
                raise ShapeError("the engine ran no iteration")
            return None
        return self.engine.batch_records[-1]

    def _reset(self, **scheduler) -> None:
        """Abort everything, drop the records, switch the scheduler."""
        for request_id in self.request_ids:
            self.engine.abort(request_id)  # None for the finished ones
        self.request_ids.clear()
        self.engine.batch_records.clear()
        self.engine.reconfigure_scheduler(**scheduler)

    def _vllm(self) -> None:
        self._reset(policy="vllm", max_num_batched_tokens=max(self.engine.max_model_len, 4096))

    def _measured(self, records: Iterator, check) -> list:
        """The measured records of ``warmup + repeats`` iterations from ``records``, each checked."""
        out = []
        for i in range(self.warmup + self.repeats):
            record = next(records)
            if not check(record):
                raise ShapeError(f"unexpected iteration: {record.num_prefill_tokens} prefill tokens in "
                                 f"{record.num_prefill_seqs} sequences, {record.num_decode_seqs} decodes")
            if i >= self.warmup:
                out.append(record)
        return out

    # -- shapes ------------------------------------------------------------------------------------

    def decode_batches(self, batch_sizes: list[int], context: int) -> dict[int, list]:
        """Decode-only iterations at each batch size (ascending), every decode at about ``context`` tokens."""
        self._vllm()
        steps = len(batch_sizes) * (self.warmup + self.repeats) + 1
        out, running, length = {}, 0, min(context, self.max_prompt - steps) - 1
        for batch in sorted(batch_sizes):
            for _ in range(batch - running):
                self._add(length, max_tokens=steps + 1)
            record = self._step()
            while record.num_prefill_tokens:  # the newcomers' prefills; the others wait
                record = self._step()
            running = batch

            def decodes(first=record):
                yield first
                while True:
                    yield self._step()
            out[batch] = self._measured(decodes(), lambda r, b=batch: r.num_decode_seqs == b
                                        and not r.num_prefill_tokens)
            length = self.engine.batch_records[-1].decode_context_tokens // batch  # the newcomers match it
        self._reset()
        return out

    def prefill(self, tokens: int) -> list:
        """Prefill-only iterations of one ``tokens``-token prompt."""
        self._vllm()

        def prefills():
            while True:
                self._add(tokens)
                yield self._step()
        return self._measured(prefills(), lambda r: r.num_prefill_tokens == tokens and not r.num_decode_seqs)

    def hybrid(self, chunk_size: int, decodes: int, context: int) -> list:
        """Iterations of ``chunk_size - decodes`` prefill tokens (one prompt) plus ``decodes`` decodes."""
        self._reset(policy="sarathi", chunk_size=chunk_size)
        steps = 2 * (self.warmup + self.repeats) + chunk_size
        for _ in range(decodes):
            self._add(min(context, self.max_prompt - steps) - 1, max_tokens=steps)
        record = self._step()
        while self.engine.num_waiting or record.num_prefill_tokens:  # until all of them decode
            record = self._step()

        def hybrids():
            while True:
                self._add(chunk_size - decodes)
                yield self._step()
        out = self._measured(hybrids(), lambda r: r.num_decode_seqs == decodes
                             and r.num_prefill_tokens == chunk_size - decodes)
        self._reset()
        return out

    def chunked_prefill(self, prompt_tokens: int, chunk_size: int) -> list[list]:
        """The iterations of each measured prefill of a ``prompt_tokens`` prompt in chunks of ``chunk_size``."""
        self._reset(policy="sarathi", chunk_size=chunk_size)
        passes = []
        for i in range(self.warmup + self.repeats):
            self._add(prompt_tokens)
            records = []
            while self.engine.has_unfinished():
                if (record := self._step(required=False)) is not None:
                    records.append(record)
            if sum(r.num_prefill_tokens for r in records) != prompt_tokens or any(r.num_decode_seqs for r in records):
                raise ShapeError(f"a {prompt_tokens}-token prefill at chunk {chunk_size} ran other work too")
            if i >= self.warmup:
                passes.append(records)
        self._reset()
        return passes
