"""Scripted LLM replies for agents no one here wrote, and small agent programs of our own
(a plain ``openai`` SDK agent, a history-rewriting one), for the ``agent`` task's tests."""
from __future__ import annotations

from handlers.tool_calls import tool_call
from tests.support.swe import ROMANUM


def bash_block(thought: str, command: str) -> str:
    """One mini-swe-agent textbased reply: a THOUGHT and exactly one bash block."""
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


#: mini-swe-agent (textbased) fixes romanum-14 with the gold patch, then submits
MINI_SWE_RULES = [
    {"match": "to_roman\\(\\) writes nine hundreds as DCD", "scope": "prompt", "replies": [
        bash_block("Let me look at the numeral table first.", "nl -ba romanum/numerals.py | sed -n '1,25p'"),
        bash_block("The table has no entry for 900, so 900 is written as D + CD. I add (900, \"CM\").",
                   "sed -i 's/^    (1000, \"M\"),$/    (1000, \"M\"),\\n    (900, \"CM\"),/' romanum/numerals.py "
                   "&& git diff"),
        bash_block("Now I check the example from the issue.",
                   "python3 -c 'from romanum import to_roman, from_roman; "
                   "print(to_roman(1994), from_roman(to_roman(1994)))'"),
        bash_block("The fix works. Submitting.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ]},
]



#: the openai SDK agent below: a function call, then the answer
SDK_RULES = [
    {"match": "SDK-AGENT", "scope": "prompt", "replies": [
        "I will compute it.\n" + tool_call("python", code="print(6 * 7)"),
        "The answer is \\boxed{42}."]},
    {"match": "SLOW-AGENT", "replies": ["too late"], "delay_s": 120},
    {"match": "REWRITE-AGENT", "scope": "prompt", "replies": ["first answer", "second answer", "third answer"]},
    {"match": "THINK-AGENT", "scope": "prompt", "replies": [
        "<think>\nA greeting.\n</think>\n\nHello!", "<think>\nNow the sum.\n</think>\n\n\\boxed{5}"]},
]

#: a plain openai SDK agent: function tools, streaming, the answer written to answer.txt
SDK_AGENT = r'''
import json, os, subprocess, sys
from openai import OpenAI

client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
tools = [{"type": "function", "function": {"name": "python", "description": "run Python code",
          "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]
messages = [{"role": "system", "content": "You solve problems with a python tool."},
            {"role": "user", "content": open(os.environ["PRORL_TASK_FILE"]).read()}]
for _ in range(5):
    stream = client.chat.completions.create(model=os.environ["PRORL_LLM_MODEL"], messages=messages, tools=tools,
                                            stream=True)
    content, calls = "", {}
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
    messages.append(message)
    if not calls:
        open("answer.txt", "w").write(content)
        break
    for call in calls.values():
        code = json.loads(call["arguments"])["code"]
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
print("done")
'''

#: an agent that edits an earlier message of its history before its third call
REWRITE_AGENT = r'''
import os
from openai import OpenAI

client = OpenAI()
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "REWRITE-AGENT one"}]
for turn in range(3):
    if turn == 2:
        messages[0] = {"role": "system", "content": "Be very brief."}  # rewrites history
    reply = client.chat.completions.create(model="policy", messages=messages)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                 {"role": "user", "content": f"next {turn}"}]
print("done")
'''

#: a Qwen3 <think> conversation: two user turns, the agent sends back only the content
THINK_AGENT = r'''
from openai import OpenAI

client = OpenAI()
messages = [{"role": "user", "content": "THINK-AGENT hello"}]
for question in ("what is 2 + 3?", None):
    reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message
    messages.append({"role": "assistant", "content": reply.content})
    if question is None:
        break
    messages.append({"role": "user", "content": question})
open("answer.txt", "w").write(messages[-1]["content"])
'''

ROMANUM_ID = ROMANUM["instance_id"]

#: an agent that checks what it can reach from inside its sandbox, with and without its key
PROBE_AGENT = r'''
import json, os, socket, sys, urllib.request, urllib.error
report = {"run_dir": sorted(os.listdir("/run/toolserver"))}
base = os.environ["OPENAI_BASE_URL"]
def status(url, key=None):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__
report["no_key"] = status(base + "/models")
report["wrong_key"] = status(base + "/models", "not-the-key")
report["own_key"] = status(base + "/models", os.environ["OPENAI_API_KEY"])
gateway = open(os.environ["PRORL_TASK_FILE"]).read().strip()
report["gateway"] = status(gateway + "/status", os.environ["OPENAI_API_KEY"])
other = [p for p in os.listdir("/run/toolserver") if p not in ("tool.sock", "llm.sock")]
report["other_sockets"] = other
report["key"] = os.environ["OPENAI_API_KEY"]
open("answer.txt", "w").write(json.dumps(report))
'''

#: an agent whose one call the scripted server answers after a minute (cancellation)
SLOW_AGENT = r'''
from openai import OpenAI
OpenAI(max_retries=0).chat.completions.create(model="policy", messages=[{"role": "user", "content": "SLOW-AGENT"}])
'''


#: the sub-agent program below: its main conversation delegates to a sub-agent (its own system
#: prompt and tools), and a title comes from a small model under another name (as Claude Code does)
SUBAGENT_RULES = [
    {"match": "TITLE-SYS", "scope": "prompt", "replies": ["Listing the workspace"]},
    {"match": "SUB-SYS", "scope": "prompt", "replies": [tool_call("bash", command="ls"),
                                                        "The workspace holds a.txt."]},
    {"match": "MAIN-SYS", "scope": "prompt", "replies": [
        "I delegate the listing.\n" + tool_call("task", prompt="List the workspace."),
        "The workspace holds a.txt."]},
]

#: an openai SDK agent with a Task tool: each task runs a sub-agent conversation of its own
SUBAGENT_AGENT = r'''
import json, os, subprocess
from openai import OpenAI

client = OpenAI()
model = os.environ["PRORL_LLM_MODEL"]
task = open(os.environ["PRORL_TASK_FILE"]).read()


def function(name, description, **properties):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string"} for k in properties}, "required": list(properties)}}}


def converse(system, prompt, tools, act):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    for _ in range(6):
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools).choices[0].message
        message = {"role": "assistant", "content": reply.content or ""}
        if reply.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments}} for c in reply.tool_calls]
        messages.append(message)
        if not reply.tool_calls:
            return reply.content
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": act(call.function.name, json.loads(call.function.arguments))})


def bash(name, arguments):
    return subprocess.run(arguments["command"], shell=True, capture_output=True, text=True).stdout


def sub_agent(name, arguments):
    return converse("SUB-SYS You list files.", arguments["prompt"], [function("bash", "run", command="")], bash)


title = client.chat.completions.create(model=model + "-small", messages=[
    {"role": "system", "content": "TITLE-SYS Write a title."}, {"role": "user", "content": task}])
answer = converse("MAIN-SYS You lead.", task, [function("task", "run a sub-agent", prompt="")], sub_agent)
open("answer.txt", "w").write(answer + "\n" + title.choices[0].message.content)
'''

#: the scripted model's answers to the Anthropic and Responses agents below
API_AGENT_RULES = [
    {"match": "CLAUDE-SDK-AGENT|RESPONSES-AGENT", "scope": "prompt", "replies": [
        "<think>\nUse the tool.\n</think>\n\nI will compute it.\n" + tool_call("python", code="print(6 * 7)"),
        "The answer is \\boxed{42}."]},
]

#: an ``anthropic`` SDK agent (Claude Code's API): a custom tool, streaming, thinking blocks sent back
ANTHROPIC_AGENT = r'''
import os, subprocess, sys
import anthropic

client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from the environment
tools = [{"name": "python", "description": "run Python code",
          "input_schema": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}]
messages = [{"role": "user", "content": "CLAUDE-SDK-AGENT " + open(os.environ["PRORL_TASK_FILE"]).read()}]
for _ in range(5):
    with client.messages.stream(model="claude-sonnet-4-5", max_tokens=512, tools=tools, messages=messages,
                                system=[{"type": "text", "text": "You solve problems with a python tool."}]) as stream:
        message = stream.get_final_message()
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
    uses = [b for b in message.content if b.type == "tool_use"]
    if message.stop_reason != "tool_use":
        open("answer.txt", "w").write("".join(b.text for b in message.content if b.type == "text"))
        break
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use.id,
         "content": subprocess.run([sys.executable, "-c", use.input["code"]], capture_output=True, text=True).stdout}
        for use in uses]})
print("done")
'''

#: an ``openai`` SDK agent on the Responses API (Codex's API): streaming, chained by previous_response_id
RESPONSES_AGENT = r'''
import json, os, subprocess, sys
from openai import OpenAI

client = OpenAI()
tools = [{"type": "function", "name": "python", "description": "run Python code", "strict": False,
          "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}]
task = "RESPONSES-AGENT " + open(os.environ["PRORL_TASK_FILE"]).read()
previous, items = None, [{"role": "user", "content": task}]
for _ in range(5):
    stream = client.responses.create(model=os.environ["PRORL_LLM_MODEL"], instructions="You solve problems.",
                                     tools=tools, input=items, previous_response_id=previous, stream=True)
    done = [event for event in stream if event.type == "response.completed"][0].response
    calls = [item for item in done.output if item.type == "function_call"]
    if not calls:
        open("answer.txt", "w").write(done.output_text)
        break
    previous, items = done.id, [
        {"type": "function_call_output", "call_id": call.call_id,
         "output": subprocess.run([sys.executable, "-c", json.loads(call.arguments)["code"]],
                                  capture_output=True, text=True).stdout} for call in calls]
print("done")
'''
