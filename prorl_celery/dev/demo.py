"""``prorl demo``: a handful of math rollouts through a running gateway, as a table."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
from tqdm import tqdm

from handlers.math import load_samples


def run_demo(gateway_url: str, jobs: int, max_tokens: int = 48, tools: bool = False,
             temperature: float = 1.0) -> str:
    """``tools``: the python tool in a sandbox and three turns (what the model that
    ``--llm vllm`` serves was tuned to use: a tool call, then the boxed answer)."""
    problems = load_samples("math")[:jobs]
    extra = {"tools": ["python"], "max_iterations": 3} if tools else {"max_iterations": 2}
    with httpx.Client(base_url=gateway_url, timeout=600) as client:
        def rollout(problem: dict) -> dict:
            body = {"instance": {"data_source": "math", **problem, **extra},
                    "sampling_params": {"temperature": temperature, "max_tokens": max_tokens, "seed": 7}}
            response = client.post("/process", json=body)
            response.raise_for_status()
            return response.json()

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(tqdm(pool.map(rollout, problems), total=len(problems), desc="rollouts"))
    return format_table(problems, results)


def oracle_rules(jobs: int) -> list[dict]:
    """Scripted-server rules for the demo: right answers for even problems, wrong ones for odd,
    and the first problem answered only after a follow-up (two turns)."""
    rules = []
    for i, problem in enumerate(load_samples("math")[:jobs]):
        answer = problem["answer"] if i % 2 == 0 else f"{problem['answer']} + 1"
        final = f"Working through it step by step, the answer is \\boxed{{{answer}}}."
        replies = ["Let me think about this carefully.", final] if i == 0 else [final]
        rules.append({"match": re.escape(problem["problem"][:40]), "replies": replies, "scope": "prompt"})
    return rules


def format_table(problems: list[dict], results: list[dict]) -> str:
    header = f"{'problem':<30} {'answer':>12} {'status':>9} {'reward':>6} {'turns':>5} {'prompt':>6} " \
             f"{'resp':>5} {'model':>5} {'run_s':>6}"
    lines = [header, "-" * len(header)]
    for problem, result in zip(problems, results):
        trajectory = result.get("trajectory") or {}
        mask = trajectory.get("response_mask", [])
        lines.append(
            f"{problem['problem'][:30]:<30} {str(problem['answer'])[:12]:>12} {result['status']:>9} "
            f"{result['reward']:>6.1f} {trajectory.get('num_turns', 0):>5} {len(trajectory.get('prompt_ids', [])):>6} "
            f"{len(mask):>5} {sum(mask):>5} {result['timing']['run_s']:>6.2f}")
    mean = sum(r["reward"] for r in results) / max(1, len(results))
    lines.append(f"\n{len(results)} jobs, mean reward {mean:.2f} (resp = response tokens, model = tokens "
                 "the model generated; the rest are observations)")
    return "\n".join(lines)
