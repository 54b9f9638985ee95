"""`braid bench spec`'s llama.cpp side, run by a Python that has llama-cpp-python (never
braid's): python peer_llama_cpp_spec.py < JOB_JSON.

JOB: {"gguf", "lookup" (prompt-lookup draft tokens; 0: plain decoding), "max_tokens",
"conversations"}, each conversation {"messages", "tool_results", "schema"} as spec.py builds
them. The conversations run one after another (llama-cpp-python serves one sequence), each
step a greedy chat completion under the GGUF's own chat template, constrained by the grammar
llama.cpp makes from the schema; after each reply but the last, the reply and the next tool
result join the messages. Prints one JSON line: seconds, output and prompt tokens, every
reply's text, and the drafting counters."""

import json
import os
import sys
import time

from llama_cpp import Llama, LlamaGrammar
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding


class CountingLookup(LlamaPromptLookupDecoding):
    """Prompt lookup that counts what it drafts and what the model keeps: llama-cpp-python
    calls the draft model once a verification step, with the tokens kept so far, so each
    call shows how much of the previous draft survived."""

    def __init__(self, num_pred_tokens: int) -> None:
        super().__init__(num_pred_tokens=num_pred_tokens)
        self.steps = self.proposed = self.accepted = 0
        self.forget()

    def forget(self) -> None:
        """A new completion: the last draft belonged to another sequence."""
        self.last_start, self.last_draft = 0, []

    def __call__(self, input_ids, /, **kwargs):
        kept = input_ids[self.last_start : self.last_start + len(self.last_draft)].tolist()
        for drafted, token in zip(self.last_draft, kept, strict=False):
            if drafted != token:
                break
            self.accepted += 1
        draft = super().__call__(input_ids, **kwargs)
        self.steps += len(draft) > 0
        self.proposed += len(draft)
        self.last_start, self.last_draft = len(input_ids), draft.tolist()
        return draft


def main() -> None:
    job = json.load(sys.stdin)
    draft = CountingLookup(job["lookup"]) if job["lookup"] else None
    # Every core, as braid uses: llama-cpp-python's default is half of them.
    cores = os.cpu_count()
    llm = Llama(
        model_path=job["gguf"],
        n_ctx=8192,
        n_threads=cores,
        n_threads_batch=cores,
        draft_model=draft,
        # Drafts are verified from every position's logits; this version sizes its logits
        # buffer by this flag, not by the draft model, and fails without it.
        logits_all=draft is not None,
        verbose=False,
    )
    conversations = job["conversations"]
    grammars = {}  # compiled before the clock starts, once per schema
    for c in conversations:
        key = json.dumps(c["schema"])
        if c["schema"] is not None and key not in grammars:
            grammars[key] = LlamaGrammar.from_json_schema(key, verbose=False)

    def reply(conversation: dict, messages: list[dict], max_tokens: int) -> dict:
        return llm.create_chat_completion(
            messages,
            max_tokens=max_tokens,
            temperature=0,
            grammar=grammars.get(json.dumps(conversation["schema"])),
        )

    # Warm-up as braid's side: the first request, 8 tokens, then its KV forgotten so the timed
    # run computes every prompt.
    reply(conversations[0], conversations[0]["messages"], 8)
    llm.reset()
    if draft is not None:
        draft.steps = draft.proposed = draft.accepted = 0
    texts, tokens, prompt_tokens = [], 0, 0
    start = time.perf_counter()
    for c in conversations:
        messages = list(c["messages"])
        for step in range(len(c["tool_results"]) + 1):
            if draft is not None:
                draft.forget()
            out = reply(c, messages, job["max_tokens"])
            text = out["choices"][0]["message"]["content"]
            texts.append(text)
            tokens += out["usage"]["completion_tokens"]
            prompt_tokens += out["usage"]["prompt_tokens"]
            if step < len(c["tool_results"]):
                messages.append({"role": "assistant", "content": text})
                messages.append({"role": "tool", "content": c["tool_results"][step]})
    result = {"seconds": time.perf_counter() - start, "output_tokens": tokens}
    result.update(prompt_tokens=prompt_tokens, texts=texts)
    if draft is not None:
        result.update(
            spec_steps=draft.steps,
            spec_proposed_tokens=draft.proposed,
            spec_accepted_tokens=draft.accepted,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
