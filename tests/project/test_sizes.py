"""The house's sizes (issue 49, item 6), held: no hand-written module of omaticaya_py over 400
lines, no function over 60 lines or 6 parameters (devtools/sizes.py counts them; generated
protobuf stubs are left out)."""

from __future__ import annotations

from devtools.sizes import MAX_FUNCTION_LINES, MAX_MODULE_LINES, MAX_PARAMS, breaches, measure


def test_no_breach_of_the_size_rules():
    assert [str(b) for b in breaches()] == []


def test_the_rules_count_what_they_say(tmp_path):
    """A made-up module over each limit is found: the counting can fail."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    params = ", ".join(f"a{i}" for i in range(MAX_PARAMS + 1))
    src = tmp_path / "big.py"
    src.write_text(f"def long():\n{body}\n\n\ndef wide(self, {params}):\n    pass\n"
                   + "\n" * MAX_MODULE_LINES)  # fmt: skip
    lines, functions = measure(src)
    assert lines > MAX_MODULE_LINES
    by_name = {where.split(" ", 1)[1]: (n, p) for where, n, p in functions}
    assert by_name["long"][0] > MAX_FUNCTION_LINES
    assert by_name["wide"][1] == MAX_PARAMS + 1  # a0 .. a6, self not counted
