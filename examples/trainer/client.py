"""The trainer SDK's client against a running service (``prorl up``): one job, a GRPO group,
a cancel, and how to read an outcome.

    python examples/trainer/client.py [--gateway http://127.0.0.1:8080]
"""
import argparse

from prorl_celery.trainer import RolloutClient, RolloutOutcome, reward_of

parser = argparse.ArgumentParser()
parser.add_argument("--gateway", default="http://127.0.0.1:8080")
gateway = parser.parse_args().gateway

problem = {"data_source": "math", "problem": "What is 2 + 3?", "answer": "5"}
sampling = {"max_tokens": 64, "temperature": 1.0}

with RolloutClient(gateway) as client:
    # one job: submit answers at once with its id, wait blocks until it has ended
    job_id = client.submit(problem, sampling_params=sampling)
    result = client.wait(job_id, timeout_s=300)
    trajectory = result["trajectory"]
    print(f"{job_id}: {result['status']}, reward {reward_of(result)}, "
          f"{len(trajectory['prompt_ids'])} prompt and {len(trajectory['response_ids'])} response tokens")

    # a GRPO group of 4 rollouts of one problem, each result taken as soon as it ends
    group = client.submit_group(problem, 4, sampling_params=sampling)
    rewards = []
    for result in client.as_completed(group, timeout_s=300):
        ending = RolloutOutcome.of(result)
        if ending.reward_valid:       # only ok and agent_error measure the policy
            rewards.append(ending.reward)
        else:                         # env, backend or eval error, timeout, cancel: never a 0
            print("not trainable:", ending.describe())
    print(f"group {group[0].rsplit('-', 1)[0]}: {len(rewards)} valid rewards {rewards}")

    # cancel a job; it ends "cancelled", with no reward
    slow = client.submit(problem, sampling_params={"max_tokens": 2048})
    print("cancelled:", client.cancel(slow).cancelled)
    ending = RolloutOutcome.of(client.wait(slow, timeout_s=60))
    print(f"{slow}: {ending.outcome}, reward {ending.reward}")
