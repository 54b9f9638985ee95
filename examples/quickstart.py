"""A tour of braid on the default model: gen, select, fork and streaming.

python examples/quickstart.py
"""

from __future__ import annotations

from braid import assistant, gen, program, select, user


@program
def qa(s, question: str):
    s += user(question)
    s += assistant(gen("answer", max_tokens=40, stop="\n"))


@program
def review(s, text: str):
    s += user(f"Classify the sentiment of this review as positive or negative.\nReview: {text}")
    s += assistant("Sentiment: ", select("sentiment", ["positive", "negative"]))


@program
def ideas(s, topic: str, n: int = 3):
    s += user(f"Give one short idea for {topic}.")
    forks = s.fork(n)  # the conversation so far is computed once for all branches
    for i, f in enumerate(forks):
        f += assistant(gen("idea", max_tokens=24, stop="\n", temperature=0.8, seed=i))
    # Reading a fork's variable waits for it; the three gens ran concurrently.
    s += assistant("Ideas:\n" + "\n".join(f"- {f['idea']}" for f in forks))


def main() -> dict:
    greedy = {"temperature": 0}
    answer = qa.run(question="Name the capital of France.", sampling=greedy)
    print("Q: Name the capital of France.\nA:", answer["answer"])

    sentiment = review.run(text="The battery died after two days. Avoid.")["sentiment"]
    print("sentiment:", sentiment)

    print(ideas.run(topic="a rainy weekend").messages()[-1]["content"])

    print("streaming: ", end="")
    streamed = qa.run(question="Name a primary color.", stream=True, sampling=greedy)
    for piece in streamed.text_iter("answer"):
        print(piece, end="", flush=True)
    print()
    return {"answer": answer["answer"], "sentiment": sentiment, "streamed": streamed["answer"]}


if __name__ == "__main__":
    main()
