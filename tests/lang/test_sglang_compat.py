"""SGLang frontend programs run on braid with `import braid as sgl`: what SGLang's names
build, without a model. test_sglang_scripted.py runs programs on a scripted backend, and
test_sglang_on_model.py on the default model.
"""

from __future__ import annotations

import pytest

import braid as sgl
from braid.interpreter.ir import Parts, Role, RoleBegin, RoleEnd, Select
from braid.meta_info import sglang_meta_info

# Every name SGLang's frontend exports that a program can use on braid.
SGLANG_NAMES = (
    "function gen gen_int gen_string select image video system user assistant system_begin "
    "system_end user_begin user_end assistant_begin assistant_end set_default_backend "
    "flush_cache get_server_info RuntimeEndpoint OpenAI global_config separate_reasoning "
    "token_length_normalized greedy_token_selection unconditional_likelihood_normalized"
).split()


def test_every_sglang_name_is_exported():
    for name in SGLANG_NAMES:
        assert getattr(sgl, name) is not None, name
        assert name in sgl.__all__
    assert sgl.function is not sgl.program and sgl.program.__name__ == "program"


def test_expressions_join_into_parts_in_order():
    answer = sgl.gen("answer")
    joined = "A:" + answer
    assert isinstance(joined, Parts) and joined.items == ("A:", answer)
    choice = sgl.select("c", choices=["x", "y"])
    longer = "Q " + answer + " then " + choice + "."
    assert longer.items == ("Q ", answer, " then ", choice, ".")
    assert (answer + "text").items == (answer, "text")
    both = sgl.system("Be brief.") + sgl.user("Hi")
    assert [type(p) for p in both.items] == [Role, Role]


def test_roles_take_joined_parts():
    g = sgl.gen("g")
    message = sgl.user("x" + g + "y")
    assert message.role == "user" and message.parts == ("x", g, "y")
    assert sgl.assistant().parts == ()  # SGLang's empty message
    with pytest.raises(TypeError, match="parts must be text, gen or select"):
        sgl.user("a" + sgl.assistant("nested"))
    begins = [sgl.system_begin(), sgl.user_begin(), sgl.assistant_begin()]
    ends = [sgl.system_end(), sgl.user_end(), sgl.assistant_end()]
    assert [b.role for b in begins] == [e.role for e in ends] == ["system", "user", "assistant"]
    assert all(isinstance(b, RoleBegin) for b in begins)
    assert all(isinstance(e, RoleEnd) for e in ends)


def test_gen_maps_sglang_keywords_onto_sampling_params():
    g = sgl.gen("x", 64, stop="\n", top_k=-1, min_new_tokens=2, ignore_eos=True)
    assert g.sampling == {
        "max_tokens": 64,
        "stop": "\n",
        "top_k": 0,  # SGLang's "off"
        "min_tokens": 2,
        "ignore_eos": True,
    }
    g = sgl.gen(
        "x",
        max_new_tokens=5,
        return_logprob=True,
        top_logprobs_num=3,
        logprob_start_len=0,
        return_text_in_logprobs=True,
        spaces_between_special_tokens=True,
        temperature=None,  # SGLang's "not given"
    )
    assert g.sampling == {
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 3,
        "prompt_logprobs_from": 1,  # the first prompt token has no logprob
    }
    assert "prompt_logprobs_from" not in sgl.gen("x", logprob_start_len=-1).sampling
    with pytest.raises(ValueError, match="spaces_between_special_tokens must be True"):
        sgl.gen("x", spaces_between_special_tokens=False)
    with pytest.raises(TypeError, match="max_tokens is given twice"):
        sgl.gen("x", 8, max_new_tokens=8)
    with pytest.raises(TypeError, match="unknown parameter 'max_new_token'"):
        sgl.gen("x", max_new_token=8)


@pytest.mark.parametrize(
    ("dtype", "text", "value"),
    [("int", "42", 42), (int, "-3", -3), ("float", "1.5", 1.5), (float, "2", 2.0)]
    + [("bool", "True", True), (bool, "False", False), ("str", '"a b"', "a b")]
    + [(str, '"q"', "q"), ("string", '"x"', "x")],
)
def test_gen_dtype_by_name_or_type(dtype, text, value):
    g = sgl.gen("x", dtype=dtype)
    assert "regex" in g.sampling and g.decode(text) == value
    assert sgl.gen_int("n", 4).decode("7") == 7 and sgl.gen_int("n", 4).sampling["max_tokens"] == 4
    assert sgl.gen_string("s", max_tokens=4).decode('"hi"') == "hi"
    with pytest.raises(ValueError, match="dtype must be one of"):
        sgl.gen("x", dtype="complex")


def test_gen_with_choices_is_a_select():
    s = sgl.gen("c", choices=["yes", "no"])
    assert isinstance(s, Select) and s.choices == ("yes", "no")
    assert s.method == "token_length_normalized"
    methods = {
        sgl.token_length_normalized: "token_length_normalized",
        sgl.greedy_token_selection: "greedy",
        sgl.unconditional_likelihood_normalized: "unconditional_likelihood_normalized",
    }
    for method, name in methods.items():
        assert sgl.gen("c", choices=["a", "b"], choices_method=method).method == name
        assert sgl.select("c", choices=["a", "b"], choices_method=method).method == name
        assert sgl.select("c", ["a", "b"], name).method == name  # braid's own spelling
    assert sgl.select("c", ["a", "b"], temperature=0).method == "token_length_normalized"
    with pytest.raises(ValueError, match="temperature must be 0"):
        sgl.select("c", ["a", "b"], temperature=0.7)
    with pytest.raises(ValueError, match="at most one constraint"):
        sgl.gen("c", choices=["a"], regex="a")
    with pytest.raises(ValueError, match="choices_method needs choices"):
        sgl.gen("c", choices_method=sgl.greedy_token_selection)


def test_what_braid_cannot_do_says_so():
    with pytest.raises(NotImplementedError, match="text-only"):
        sgl.image("cat.png")
    with pytest.raises(NotImplementedError, match="text-only"):
        sgl.video("cat.mp4", 8)
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        sgl.function(num_api_spec_tokens=64)
    with pytest.raises(ValueError, match="Azure"):
        sgl.OpenAI("gpt-4o-mini", is_azure=True)


def test_global_config():
    config = sgl.global_config
    assert config.verbosity == 0 and config.skip_special_tokens_in_output is True
    config.enable_precache_with_tracing = False  # an optimisation braid does not need
    config.enable_precache_with_tracing = True
    with pytest.raises(ValueError, match="implements True only"):
        config.skip_special_tokens_in_output = False
    with pytest.raises(AttributeError, match="no 'verbose'"):
        config.verbose = 2


def test_function_decorates_both_ways():
    @sgl.function
    def a(s):
        s += "a"

    @sgl.function()
    def b(s):
        s += "b"

    assert isinstance(a, sgl.Program) and isinstance(b, sgl.Program) and a.name == "a"


def test_openai_takes_sglang_arguments(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    chat = sgl.OpenAI("gpt-4o-mini")
    assert chat.model == "gpt-4o-mini" and chat.http.base_url == "http://127.0.0.1:9/v1"
    assert chat.http.headers == {"Authorization": "Bearer sk-test"}
    text = sgl.OpenAI("gpt-3.5-turbo-instruct", is_chat_model=False, base_url="http://h/v1")
    assert text.http.base_url == "http://h/v1"
    with pytest.raises(ValueError, match="cannot render a user message"):
        text.chat_template.begin("user", first=True)


def test_sglang_meta_info_shape():
    gen_meta = {
        "text": " four five",
        "finish_reason": "length",
        "token_ids": [11, 12],
        "prompt_tokens": 6,
        "cached_tokens": 2,
        "completion_tokens": 2,
        "logprobs": [-0.5, -1.0],
        "top_logprobs": [{11: -0.5, 13: -2.0}, {12: -1.0, 14: -1.5}],
        "prompt_logprobs": [-3.0],
        "prompt_token_ids": [9],
    }
    info = sglang_meta_info(gen_meta, lambda ids: [f"<{i}>" for i in ids])
    assert info["finish_reason"] == {"type": "length", "length": 2}
    assert (info["prompt_tokens"], info["completion_tokens"], info["cached_tokens"]) == (6, 2, 2)
    assert info["output_token_logprobs"] == [[-0.5, 11, "<11>"], [-1.0, 12, "<12>"]]
    assert info["output_top_logprobs"][1] == [[-1.0, 12, "<12>"], [-1.5, 14, "<14>"]]
    assert info["input_token_logprobs"] == [[-3.0, 9, "<9>"]]
    select_meta = {"choices": ["a", "b"], "scores": [0.5, 0.1], "logprobs": [[-1.0, -2.0], [-4.0]]}
    info = sglang_meta_info(select_meta, None)
    assert info["normalized_prompt_logprobs"] == [-1.5, -4.0]
    assert info["input_token_logprobs"][0] == [[-1.0, None, None], [-2.0, None, None]]
    assert sglang_meta_info({}, None) is None  # set_var, var_scope: SGLang has none either
