"""Turn a coding instance, in any accepted shape, into a prompt plus hidden tests.

Accepted shapes (one normalised :class:`CodeInstance` comes out of each):

plain row (this project's ``data/problems.jsonl``, Codeforces/Eurus/DeepCoder style)
    ``{"problem": str, "tests": [{"input": str, "output": str}, ...], "time_limit_s", "memory_mb"}``
    for stdin/stdout programs; with ``"fn_name"`` the tests are calls, ``input`` being the list of
    arguments and ``output`` the return value; with ``"test_code"`` (a Python file of ``test_*``
    functions or top-level asserts, ``from solution import ...``) the tests are pytest-style.
    ``question``/``description`` may name the statement; ``input_output`` (TACO/APPS: JSON
    ``{"inputs", "outputs", "fn_name"?}``), ``official_tests`` (Codeforces) and
    ``verification_info`` (PrimeIntellect: JSON ``{"test_cases": [{"type", "input", "output",
    "fn_name"?}]}``) may carry the tests; ``time_limit``/``memory_limit`` may give the limits
    (numbers, or strings like "2 seconds", "256 megabytes"). ``examples`` (public cases) and
    ``starter_code`` are shown in the prompt; the tests never are.
verl row (DeepCoder, Eurus-2-RL, ProRL Agent Server clients)
    ``{"data_source", "prompt": [messages], "reward_model": {"style": "rule", "ground_truth"},
    "extra_info": {...}}``; ``ground_truth`` is a JSON string or the decoded value: a dict of
    ``inputs``/``outputs`` lists (optionally ``fn_name``), a list of ``{"input", "output",
    "testtype"?}`` cases (LiveCodeBench ``functional`` cases: one JSON argument per input line,
    ``metadata.func_name``), a dict with ``test_cases`` or with ``test_code``. The prompt messages
    are used unchanged; limits and ``fn_name`` may also sit in ``extra_info``.

Every problem is a ``ValueError`` naming the field (the gateway answers 400).
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

from handlers.rows import parse_row, verl_row

DEFAULT_TIME_LIMIT_S = 2.0
MAX_TIME_LIMIT_S = 60.0
DEFAULT_MEMORY_MB = 256
MIN_MEMORY_MB, MAX_MEMORY_MB = 32, 8192
DEFAULT_MAX_ITERATIONS = 12
MAX_ITERATIONS_CAP = 40
TOOL_NAMES = ("editor", "bash", "python")
DEFAULT_TOOLS = ("editor", "bash")
SOLUTION_FILE = "solution.py"

SHAPE_HINT = ("a code instance needs 'problem' with 'tests' (or 'input_output', 'official_tests', "
              "'verification_info', 'test_code'), or 'prompt' messages with 'reward_model.ground_truth'")

SYSTEM_PROMPT = (
    "You are an expert Python programmer. You solve a programming problem by writing a Python 3 "
    "solution file with the editor tool and testing it with the bash tool in /workspace. When the "
    "solution is complete, call the finish tool. Without tools, reply with the complete solution in "
    "one ```python code block."
)


@dataclass(frozen=True)
class CodeInstance:
    """A coding instance in the one shape the handler works with."""

    messages: list[dict[str, Any]]
    #: hidden tests: {"kind": "stdio", "input", "output"} | {"kind": "call", "args", "output"}
    #: | {"kind": "pytest", "test_name"}
    tests: list[dict[str, Any]]
    fn_name: str | None = None
    test_code: str | None = None
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    float_tolerance: float | None = None
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    tools: tuple[str, ...] = DEFAULT_TOOLS
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def style(self) -> str:
        return self.tests[0]["kind"]


def normalize_instance(instance: Any) -> CodeInstance:
    """The instance as prompt + hidden tests; ValueError names what is wrong."""
    return parse_row(instance, verl=_from_verl_row, plain=_from_plain_row)


def validate_instance(instance: Any) -> None:
    normalize_instance(instance)


# -- the two shapes -------------------------------------------------------------------------------

def _from_plain_row(instance: dict[str, Any]) -> CodeInstance:
    statement_key = next((k for k in ("problem", "question", "description", "prompt")
                          if instance.get(k) is not None), None)
    if statement_key is None:
        raise ValueError(SHAPE_HINT)
    statement = instance[statement_key]
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError(f"field '{statement_key}' must be a non-empty string")
    if statement_key == "description":  # Codeforces rows split the statement
        statement = "\n\n".join(part for part in (statement, _section(instance, "input_format", "Input"),
                                                  _section(instance, "output_format", "Output")) if part)
    fn_name = _fn_name(instance.get("fn_name"), "fn_name")
    test_code = instance.get("test_code")
    tests_key = next((k for k in ("tests", "input_output", "official_tests", "verification_info")
                      if instance.get(k) is not None), None)
    if test_code is not None:
        tests, fn = _pytest_tests(test_code, "test_code"), fn_name
    elif tests_key is None:
        raise ValueError(SHAPE_HINT)
    else:
        tests, fn = _parse_tests(_decode(instance[tests_key], tests_key), tests_key, fn_name)
    config = _config(instance, {})
    examples = _examples(instance.get("examples"))
    starter = instance.get("starter_code")
    if starter is not None and not isinstance(starter, str):
        raise ValueError("field 'starter_code' must be a string")
    style = tests[0]["kind"]
    messages = default_messages(statement, style, fn or "", examples, starter or "", **config["limits"])
    metadata = {"format": "plain", **{k: instance[k] for k in ("id", "source", "difficulty", "rating", "name")
                                       if isinstance(instance.get(k), (str, int, float))}}
    return CodeInstance(messages, tests, fn, test_code, metadata=metadata, **config["fields"])


def _from_verl_row(instance: dict[str, Any]) -> CodeInstance:
    row = verl_row(instance, SHAPE_HINT)
    fn_name = _fn_name(instance.get("fn_name", row.extra_info.get("fn_name")), "fn_name")
    where = "reward_model.ground_truth"
    ground_truth = _decode(row.ground_truth, where)
    if isinstance(ground_truth, dict) and ground_truth.get("test_code") is not None:
        tests, fn = _pytest_tests(ground_truth["test_code"], f"{where}.test_code"), fn_name
        test_code = ground_truth["test_code"]
    else:
        tests, fn = _parse_tests(ground_truth, where, fn_name)
        test_code = None
    config = _config(instance, row.extra_info)
    return CodeInstance(row.messages, tests, fn, test_code, metadata=row.metadata, **config["fields"])


# -- tests ----------------------------------------------------------------------------------------

def _decode(value: Any, where: str) -> Any:
    """Datasets store test cases as JSON strings as often as as values."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as error:
            raise ValueError(f"field '{where}' is a string but not valid JSON: {error}") from None
    return value


def _parse_tests(value: Any, where: str, fn_name: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """Hidden tests from any of the public encodings; returns (tests, fn_name)."""
    if isinstance(value, dict) and "test_cases" in value:  # PrimeIntellect verification_info
        return _parse_cases(value["test_cases"], f"{where}.test_cases", fn_name)
    if isinstance(value, dict):
        if "inputs" not in value or "outputs" not in value:
            raise ValueError(f"field '{where}' must have 'inputs' and 'outputs' lists")
        inputs, outputs = value["inputs"], value["outputs"]
        if not isinstance(inputs, list) or not isinstance(outputs, list):
            raise ValueError(f"field '{where}.inputs' and '{where}.outputs' must be lists")
        if len(inputs) != len(outputs):
            raise ValueError(f"field '{where}' has {len(inputs)} inputs but {len(outputs)} outputs")
        fn_name = _fn_name(value.get("fn_name"), f"{where}.fn_name") or fn_name
        cases = [{"input": i, "output": o} for i, o in zip(inputs, outputs)]
        return _parse_cases(cases, where, fn_name, paired=True)
    if isinstance(value, list):
        return _parse_cases(value, where, fn_name)
    raise ValueError(f"field '{where}' must be a list of test cases or an object with 'inputs' and 'outputs'")


def _parse_cases(cases: Any, where: str, fn_name: str | None, paired: bool = False
                 ) -> tuple[list[dict[str, Any]], str | None]:
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"field '{where}' must be a non-empty list of test cases")
    tests = []
    for index, case in enumerate(cases):
        at = f"{where}.inputs[{index}]" if paired else f"{where}[{index}]"
        if not isinstance(case, dict) or "input" not in case or "output" not in case:
            raise ValueError(f"field '{at}' must be an object with 'input' and 'output'")
        case_type = case.get("testtype", case.get("type"))
        metadata = given if isinstance(given := case.get("metadata"), dict) else {}
        name = _fn_name(case.get("fn_name", metadata.get("func_name")), f"{at}.fn_name") or fn_name
        functional = case_type in ("functional", "function_call") or (case_type is None and name is not None)
        if functional:
            if name is None:
                raise ValueError(f"field '{at}' is a function-call test but no 'fn_name' is given")
            fn_name = name
            tests.append({"kind": "call", "args": _call_args(case["input"], at),
                          "output": _call_output(case["output"], at, case_type == "functional")})
        else:
            tests.append({"kind": "stdio", "input": _text(case["input"], f"{at}.input"),
                          "output": _text(case["output"], f"{at}.output")})
    if len({t["kind"] for t in tests}) > 1:
        raise ValueError(f"field '{where}' mixes stdin/stdout and function-call tests")
    return tests, fn_name


def _call_args(value: Any, where: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if isinstance(value, str):  # LiveCodeBench: one JSON value per line
        try:
            return [json.loads(line) for line in value.splitlines() if line.strip()]
        except ValueError:
            raise ValueError(f"field '{where}.input' must be a list of arguments or JSON lines") from None
    raise ValueError(f"field '{where}.input' must be a list of arguments")


def _call_output(value: Any, where: str, encoded: bool) -> Any:
    if encoded and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ValueError(f"field '{where}.output' must be JSON") from None
    return value


def _text(value: Any, where: str) -> str:
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value)  # TACO sometimes stores lines
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"field '{where}' must be a string")
    return value


def _pytest_tests(code: Any, where: str) -> list[dict[str, Any]]:
    """One test per top-level ``test_*`` function, or the whole module when there is none."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError(f"field '{where}' must be a non-empty string of Python code")
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        raise ValueError(f"field '{where}' is not valid Python: {error}") from None
    names = [node.name for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test")]
    return [{"kind": "pytest", "test_name": name} for name in names] or [{"kind": "pytest", "test_name": "__module__"}]


# -- configuration and prompt --------------------------------------------------------------------

def _config(instance: dict[str, Any], extra_info: dict[str, Any]) -> dict[str, Any]:
    def pick(*keys: str) -> tuple[str | None, Any]:
        for source, prefix in ((instance, ""), (extra_info, "extra_info.")):
            for key in keys:
                if source.get(key) is not None:
                    return prefix + key, source[key]
        return None, None

    key, value = pick("time_limit_s", "time_limit")
    time_limit = DEFAULT_TIME_LIMIT_S if key is None else _quantity(value, key, "second")
    if not 0 < time_limit <= MAX_TIME_LIMIT_S:
        raise ValueError(f"field '{key}' must be between 0 and {MAX_TIME_LIMIT_S:g} seconds, got {value!r}")
    key, value = pick("memory_mb", "memory_limit")
    memory = DEFAULT_MEMORY_MB if key is None else _quantity(value, key, "megabyte")
    if not MIN_MEMORY_MB <= memory <= MAX_MEMORY_MB:
        raise ValueError(f"field '{key}' must be between {MIN_MEMORY_MB} and {MAX_MEMORY_MB} MB, got {value!r}")
    key, tolerance = pick("float_tolerance")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
                                  or not 0 <= tolerance < 1):
        raise ValueError(f"field '{key}' must be a number in [0, 1), got {tolerance!r}")
    key, iterations = pick("max_iterations")
    if iterations is None:
        iterations = DEFAULT_MAX_ITERATIONS
    elif isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"field '{key}' must be a positive integer, got {iterations!r}")
    tools = instance.get("tools", list(DEFAULT_TOOLS))
    if not isinstance(tools, list) or not tools or set(tools) - set(TOOL_NAMES):
        raise ValueError(f"field 'tools' must be a non-empty list of {', '.join(TOOL_NAMES)}, got {tools!r}")
    return {"fields": {"time_limit_s": float(time_limit), "memory_mb": int(memory),
                       "float_tolerance": None if tolerance is None else float(tolerance),
                       "max_iterations": min(iterations, MAX_ITERATIONS_CAP), "tools": tuple(tools)},
            "limits": {"time_limit_s": float(time_limit), "memory_mb": int(memory)}}


_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def _quantity(value: Any, key: str, unit: str) -> float:
    """A number, or a string like "2 seconds" / "256 megabytes" (TACO, Codeforces)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _QUANTITY.match(value) if isinstance(value, str) else None
    words = {"second": ("", "s", "sec", "second", "seconds"), "megabyte": ("", "mb", "megabyte", "megabytes", "m")}
    if match is None or match.group(2).lower() not in words[unit]:
        raise ValueError(f"field '{key}' must be a number of {unit}s, got {value!r}")
    return float(match.group(1))


def _fn_name(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise ValueError(f"field '{where}' must be a Python identifier, got {value!r}")
    return value


def _examples(value: Any) -> list[dict[str, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError("field 'examples' must be a list of {'input', 'output'}")
    examples = []
    for index, case in enumerate(value):
        if not isinstance(case, dict) or "input" not in case or "output" not in case:
            raise ValueError(f"field 'examples[{index}]' must be an object with 'input' and 'output'")
        examples.append({"input": _text(case["input"], f"examples[{index}].input"),
                         "output": _text(case["output"], f"examples[{index}].output")})
    return examples


def _section(instance: dict[str, Any], key: str, title: str) -> str:
    value = instance.get(key)
    return f"{title}\n{value.strip()}" if isinstance(value, str) and value.strip() else ""


def default_messages(statement: str, style: str, fn_name: str, examples: list[dict[str, str]],
                     starter_code: str, *, time_limit_s: float, memory_mb: int) -> list[dict[str, str]]:
    """The system + user prompt built for a plain row (the tests are never in it)."""
    parts = [statement.strip()]
    for number, example in enumerate(examples, 1):
        parts.append(f"Example {number}\nInput:\n```\n{example['input'].rstrip()}\n```\n"
                     f"Output:\n```\n{example['output'].rstrip()}\n```")
    if starter_code.strip():
        parts.append(f"Starter code:\n```python\n{starter_code.rstrip()}\n```")
    if style == "stdio":
        task = (f"Write a complete Python 3 program in /workspace/{SOLUTION_FILE} that reads the input from "
                f"standard input and prints the answer to standard output. You can run it with bash, for "
                f"example `python3 {SOLUTION_FILE} < input.txt`.")
    elif style == "call":
        task = (f"Write /workspace/{SOLUTION_FILE} defining the function `{fn_name}` (or a class `Solution` "
                f"with that method). Hidden tests call it with arguments and compare the returned value.")
    else:
        task = (f"Write /workspace/{SOLUTION_FILE}; hidden tests import it (`from solution import ...`) "
                f"and check it with assertions.")
    parts.append(f"{task} Limits per test: {time_limit_s:g} s of CPU time and {memory_mb} MB of memory. "
                 "When the solution is complete, call the finish tool.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]
