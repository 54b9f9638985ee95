"""`braid bench peers`'s vLLM side, run by a Python that has vLLM's CPU build (never
braid's): python peer_vllm.py MODEL_DIR WORKLOAD TOKENS PROMPTS_JSON SAMPLING_JSON LAUNCHED.
Prints one JSON line: seconds and output tokens for all prompts at once; for start, the
seconds from LAUNCHED (the caller's time.time()) to the first token and resident memory."""

import json
import sys
import time

from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams


def main() -> None:
    model, workload, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompts, sampling = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    launched = float(sys.argv[6])
    # Its default reserves 92% of the machine's memory for the KV cache, which fails
    # wherever anything else runs; a quarter is still far more than these workloads use.
    llm = LLM(
        model=model, enable_prefix_caching=True, max_model_len=4096, gpu_memory_utilization=0.25
    )
    max_tokens = tokens if workload == "decode" else sampling["max_tokens"]
    schema = sampling.get("schema")
    structured = StructuredOutputsParams(json=schema) if schema is not None else None
    params = SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=schema is None,
        structured_outputs=structured,
    )  # fmt: skip
    if workload == "start":
        llm.generate(prompts[:1], params)
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
        print(json.dumps({"first_token_s": time.time() - launched, "rss_mb": rss}))
        return
    llm.generate(prompts[:2], params)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    print(
        json.dumps({"seconds": seconds, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)})
    )


if __name__ == "__main__":
    main()
