"""A multi-branch agent: fork the conversation into one candidate plan per tool, let the
model judge each plan with select, keep the best branch and answer from it. The branches
share the task's prefix in the KV cache and decode concurrently.

    python examples/agent_branches.py
"""

from __future__ import annotations

from braid import assistant, gen, program, select, system, user

TOOLS = {
    "calculator": "evaluates arithmetic expressions",
    "web_search": "looks facts up on the web",
    "calendar": "reads and creates calendar events",
}
TASKS = [
    "What is 17% of 2,350 euros?",
    "Book a dentist appointment next Tuesday at 10am.",
    "Who wrote the novel Frankenstein?",
]


def _margin(f) -> float:
    """How much more the model believes "yes" than "no" about a branch's plan."""
    yes, no = f.meta("verdict")["scores"]
    return yes - no


@program
def agent(s, task: str):
    s += system("You are an assistant that solves tasks with tools.")
    s += user(f"Task: {task}")
    branches = s.fork(len(TOOLS))
    for f, (tool, purpose) in zip(branches, TOOLS.items(), strict=True):
        f += assistant(
            f"I will use the {tool} tool, which {purpose}. Plan: ",
            gen("plan", max_tokens=32, stop="\n"),
        )
        f += user("Is that the right tool for this task? Answer yes or no.")
        f += assistant(select("verdict", ["yes", "no"]))
    best_tool, best = max(zip(TOOLS, branches, strict=True), key=lambda tb: _margin(tb[1]))
    s += assistant(f"I will use the {best_tool} tool. Plan: {best['plan']}")
    s += user("Now give the final answer in one short sentence.")
    s += assistant(gen("answer", max_tokens=40, stop="\n"))


def main() -> list[dict]:
    states = agent.run_batch([{"task": t} for t in TASKS], sampling={"temperature": 0})
    results = []
    for task, state in zip(TASKS, states, strict=True):
        if state.error is not None:
            raise state.error
        chosen = state.messages()[-3]["content"]
        print(f"task: {task}\n  {chosen}\n  answer: {state['answer']}\n")
        results.append({"task": task, "chosen": chosen, "answer": state["answer"]})
    return results


if __name__ == "__main__":
    main()
