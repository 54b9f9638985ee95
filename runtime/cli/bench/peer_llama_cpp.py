"""`braid bench peers`'s llama.cpp side, run by a Python that has llama-cpp-python (never
braid's): python peer_llama_cpp.py GGUF WORKLOAD TOKENS PROMPTS_JSON SAMPLING_JSON LAUNCHED.
Prints one JSON line: decode tok/s after the first token; start's seconds from LAUNCHED (the
caller's time.time()) to the first token and resident memory; else seconds and tokens (and
prefill's prompt tokens)."""

import json
import os
import sys
import time

from llama_cpp import Llama, LlamaGrammar


def main() -> None:
    path, workload, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompts, sampling = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    launched = float(sys.argv[6])
    # Every core, as braid uses: llama-cpp-python's default is half of them (a guess for
    # hyperthreaded machines), which cost it much of its decode rate (docs/benchmarks.md).
    cores = os.cpu_count()
    llm = Llama(model_path=path, n_ctx=4096, n_threads=cores, n_threads_batch=cores, verbose=False)
    grammar = None
    if "schema" in sampling:
        grammar = LlamaGrammar.from_json_schema(json.dumps(sampling["schema"]), verbose=False)
    max_tokens = tokens if workload == "decode" else sampling["max_tokens"]

    def complete(prompt: str, stream: bool = False):
        return llm.create_completion(
            prompt, max_tokens=max_tokens, temperature=0, grammar=grammar, stream=stream
        )

    if workload == "start":
        complete(prompts[0])
        print(json.dumps({"first_token_s": time.time() - launched, "rss_mb": rss_mb()}))
        return
    complete(prompts[0])  # warm-up
    if workload == "decode":
        first = last = 0.0
        count = 0
        for _ in complete(prompts[0], stream=True):
            now = time.perf_counter()
            first = first or now
            count += 1
            last = now
        print(json.dumps({"tok_s": (count - 1) / (last - first)}))
        return
    if workload == "prefill":
        llm.reset()  # the warm-up's prompt is cached: compute it again
    start = time.perf_counter()
    usage = [complete(p)["usage"] for p in prompts]
    result = {"seconds": time.perf_counter() - start}
    result["tokens"] = sum(u["completion_tokens"] for u in usage)
    result["prompt_tokens"] = sum(u["prompt_tokens"] for u in usage)
    print(json.dumps(result))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


if __name__ == "__main__":
    main()
