"""Misuse of the API fails at once with an error that names the problem."""

from __future__ import annotations

import pytest

from braid import gen, program, select, user


def test_gen_outside_a_program_is_not_text():
    with pytest.raises(TypeError, match="not text: append it to a program's state"):
        str(gen("a"))
    with pytest.raises(TypeError, match="not text"):
        f"{gen('a')}"
    with pytest.raises(TypeError, match="not text"):
        print("Q: " + select("c", ["x", "y"]))  # joined parts are no text either


def test_only_text_and_operations_join():
    with pytest.raises(TypeError, match=r"cannot join int with gen\('a'\)"):
        gen("a") + 5
    with pytest.raises(TypeError, match="cannot join list"):
        [1] + gen("a")


def test_unknown_gen_parameter_is_named():
    with pytest.raises(TypeError, match="unknown parameter 'temprature'"):
        gen("a", temprature=0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": -1}, "max_tokens must be >= 0"),
        ({"max_tokens": "ten"}, r"Expected `int`, got `str` - at `\$.max_tokens`"),
        ({"top_p": 0}, "top_p must be in"),
        ({"regex": "a", "choices": ["a"]}, "at most one constraint"),
        ({"n": 2}, "fork the state"),
        ({"dtype": complex}, "dtype must be one of"),
        ({"dtype": int, "regex": "[0-9]"}, "dtype cannot be combined"),
        ({"json_schema": object()}, "json_schema must be a dict"),
    ],
)
def test_bad_gen_values_are_named(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        gen("a", **kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((["a"], "best"), "unknown method 'best'"),
        (([],), "non-empty list"),
        ((["a", ""],), "non-empty strings"),
        ((["a", "a"],), "distinct"),
        (("ab",), "non-empty list"),
    ],
)
def test_bad_select_is_named(args, message):
    with pytest.raises(ValueError, match=message):
        select("c", *args)


def test_roles_take_text_gen_and_select_only():
    with pytest.raises(TypeError, match="parts must be text, gen or select"):
        user(user("nested"))


@program
def echo(s, text):
    s += text


def test_program_arguments_are_checked():
    with pytest.raises(TypeError, match="echo\\(\\): got an unexpected keyword argument 'txt'"):
        echo.run(txt="hi", backend=object())
    with pytest.raises(TypeError, match="echo\\(\\): missing a required argument: 'text'"):
        echo.run(backend=object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        echo.bind(nope=1)


def test_calling_a_program_without_a_state():
    with pytest.raises(TypeError, match=r"use echo.run\(...\)"):
        echo("hello")
    with pytest.raises(TypeError, match=r"use echo.run\(...\)"):
        echo(text="hello")  # SGLang runs the program here; braid asks for run


def test_a_program_needs_a_state_parameter():
    with pytest.raises(TypeError, match="first parameter must be the state"):
        program(lambda: None)


def test_fork_needs_a_positive_count(tokenizer):
    from tests.interpreter.test_executor import ScriptedBackend

    @program
    def p(s, n):
        s.fork(n)

    for n in (0, -1, 1.5):
        with pytest.raises(ValueError, match="n must be an int >= 1"):
            p.run(n=n, backend=ScriptedBackend(tokenizer))


def test_roles_must_nest_properly(tokenizer):
    from tests.interpreter.test_executor import ScriptedBackend

    @program
    def p(s):
        with s.assistant():
            s += user("inside")

    with pytest.raises(ValueError, match="cannot start inside a assistant one"):
        p.run(backend=ScriptedBackend(tokenizer))


def test_bad_program_sampling_defaults():
    with pytest.raises(ValueError, match=r"echo.run\(sampling=...\): .*temperature must be >= 0"):
        echo.run(text="x", sampling={"temperature": -1}, backend=object())
