"""Scripted agent turns that solve shipped tasks, for the tests and the benches that drive an
agent with the reference LLM server's rules instead of a model."""
from __future__ import annotations

from handlers.tool_calls import tool_call

#: the shipped swe instance ``prorl-swe__romanum-14`` fixed in four turns: read the numeral
#: table, add the missing 900 entry, check it, finish
ROMANUM_FIX = [
    "Let me look at the conversion table.\n" + tool_call("editor", command="view",
                                                         path="romanum/romanum/numerals.py", view_range=[1, 25]),
    "The table has no entry for 900. Adding it.\n" + tool_call(
        "editor", command="str_replace", path="romanum/romanum/numerals.py",
        old_str='    (1000, "M"),\n    (500, "D"),', new_str='    (1000, "M"),\n    (900, "CM"),\n    (500, "D"),'),
    tool_call("bash", command="python -c 'from romanum import to_roman, from_roman; "
                              "print(to_roman(1994), from_roman(to_roman(1994)))'"),
    tool_call("finish", answer="added the CM entry to the numeral table"),
]
