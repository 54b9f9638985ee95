"""A few-shot eval harness: multiple-choice questions written for this project, answered by
select after a shared few-shot prefix, run as one batch, scored into an accuracy report.
The few-shot prefix is computed once for the whole batch (see the engine counters).

    python examples/few_shot_eval.py
"""

from __future__ import annotations

from collections import Counter

from braid import program, select
from braid.interpreter import default_backend

SHOTS = [
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What do bees make?", "honey"),
    ("How many legs does a spider have?", "eight"),
    ("Which gas do plants take in from the air?", "carbon dioxide"),
    ("What is frozen water called?", "ice"),
]

# (category, question, choices, answer)
QUESTIONS = [
    ("geography", "What is the capital of France?", ["Berlin", "Paris", "Madrid"], "Paris"),
    ("geography", "What is the capital of Japan?", ["Tokyo", "Seoul", "Beijing"], "Tokyo"),
    ("geography", "Which is the largest ocean?", ["Atlantic", "Indian", "Pacific"], "Pacific"),
    ("geography", "On which continent is Egypt?", ["Asia", "Africa", "Europe"], "Africa"),
    ("geography", "Which river flows through London?", ["Seine", "Thames", "Danube"], "Thames"),
    ("geography", "What is the capital of Italy?", ["Rome", "Milan", "Naples"], "Rome"),
    ("science", "What is the boiling point of water in Celsius?", ["50", "100", "150"], "100"),
    ("science", "Which organ pumps blood through the body?", ["lungs", "liver", "heart"], "heart"),
    ("science", "What is the closest star to Earth?", ["the Sun", "Sirius", "Polaris"], "the Sun"),
    (
        "science",
        "Which metal is liquid at room temperature?",
        ["iron", "mercury", "copper"],
        "mercury",
    ),
    ("science", "How many bones are in an adult human body?", ["106", "206", "306"], "206"),
    (
        "science",
        "What do we call animals that eat only plants?",
        ["carnivores", "herbivores", "omnivores"],
        "herbivores",
    ),
    ("arithmetic", "What is 7 times 8?", ["54", "56", "64"], "56"),
    ("arithmetic", "What is 15 plus 27?", ["42", "32", "52"], "42"),
    ("arithmetic", "What is 100 minus 37?", ["73", "63", "67"], "63"),
    ("arithmetic", "What is half of 90?", ["40", "45", "50"], "45"),
    ("arithmetic", "What is 9 squared?", ["18", "81", "99"], "81"),
    ("arithmetic", "What is 12 divided by 4?", ["3", "4", "6"], "3"),
    ("language", "What is the opposite of hot?", ["warm", "cold", "wet"], "cold"),
    ("language", "What is the plural of mouse?", ["mouses", "mice", "meese"], "mice"),
    ("language", "Which word is a verb?", ["run", "blue", "table"], "run"),
    ("language", "What is the opposite of early?", ["late", "soon", "fast"], "late"),
    ("language", "Which word rhymes with cat?", ["dog", "hat", "cup"], "hat"),
    ("language", "What is a baby dog called?", ["kitten", "puppy", "calf"], "puppy"),
]


# The options are not listed in the prompt: a 135M model tends to copy the last one listed.
FEWSHOT = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in SHOTS)


@program
def multiple_choice(s, question: str, choices: list[str]):
    s += FEWSHOT + f"Question: {question}\nAnswer:"
    s += select("answer", [" " + c for c in choices])


def main() -> dict:
    engine = default_backend().engine
    before = engine.stats()
    states = multiple_choice.run_batch(
        [{"question": q, "choices": c} for _, q, c, _ in QUESTIONS], progress=True
    )
    after = engine.stats()
    right, total = Counter(), Counter()
    for (category, _, _, answer), state in zip(QUESTIONS, states, strict=True):
        total[category] += 1
        right[category] += state["answer"].strip() == answer
    print(f"{'category':<12}{'accuracy':>10}")
    for category in total:
        print(f"{category:<12}{right[category] / total[category]:>10.0%}")
    accuracy = sum(right.values()) / len(QUESTIONS)
    print(f"{'all':<12}{accuracy:>10.0%}  ({sum(right.values())}/{len(QUESTIONS)})")
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    computed = after["prefill_tokens_computed"] - before["prefill_tokens_computed"]
    print(f"prompt tokens {prompt}, computed {computed} (the few-shot prefix once)")
    return {"accuracy": accuracy, "prompt_tokens": prompt, "computed_tokens": computed}


if __name__ == "__main__":
    main()
