"""`braid bench peers`'s vLLM side, run by a Python that has vLLM's CPU build (never
braid's): python peer_vllm.py MODEL_DIR WORKLOAD TOKENS PROMPTS_JSON SAMPLING_JSON.
Prints one JSON line: seconds and output tokens for all prompts at once."""

import json
import sys
import time

from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams


def main() -> None:
    model, workload, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompts, sampling = json.loads(sys.argv[4]), json.loads(sys.argv[5])
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
    llm.generate(prompts[:2], params)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    print(
        json.dumps({"seconds": seconds, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)})
    )


if __name__ == "__main__":
    main()
