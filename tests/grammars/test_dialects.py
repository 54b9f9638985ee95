"""The grammar dialects clients send (grammars/dialects): GBNF and llguidance's lark, each
grammar's language checked against a reference (the same language written for Python's `re`
or for lark's Earley parser) on texts in and out of it, through the compiled masks."""

from __future__ import annotations

import json
import re

import lark
import pytest

from braid import grammars
from braid.grammars.compiling.jobs import _ebnf
from braid.grammars.constraints import Ebnf
from braid.grammars.dialects import dialect, read, reply_attributes
from braid.grammars.ebnf.grammar import EbnfGrammar
from braid.grammars.regex.lazy import LazyRegexGrammar
from braid.runtime.protocol import SamplingParams

guidance = pytest.importorskip("guidance")

# GBNF grammars with the same language as a Python regex (no rule recurses: one regex).
REGULAR_GBNF = [
    (
        r"""
        root ::= answer ("," ws answer)*   # a comment
        answer ::= "yes" | "no"
          | [0-9]{1,3}
        ws ::= [ \t]*
        """,
        r"(yes|no|[0-9]{1,3})(,[ \t]*(yes|no|[0-9]{1,3}))*",
        ["yes", "no,12", "7, yes,\tno", "123"],
        ["", "1234", "yes,", "maybe", "yes ,no"],
    ),
    (
        r"""root ::= [^"\\]+ "\x21" 'q'? . [a-c-]""",
        r'[^"\\]+!q?[\s\S][a-c\-]',
        ["ab!qzc", "x!\n-", 'é!q"a'],
        ['a"!qzc', "!qza", "ab!qzd"],
    ),
]
# A recursive GBNF grammar and the same grammar in lark (the reference, parsed by Earley).
RECURSIVE_GBNF = (
    r"""
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= num | "(" expr ")"
    num  ::= [0-9]+
    """,
    """
    start: expr
    expr: term (("+" | "-") term)*
    term: NUM | "(" expr ")"
    NUM: /[0-9]+/
    """,
    ["1", "(1+2)-3", "((4))", "1+(2-(3+44))"],
    ["", "(1", "1+", "()", "1++2", "(1)(2)"],
)


def accepts(grammar, tokenizer, text: str) -> bool:
    """Whether `text`'s tokens pass the masks one by one, and EOS then ends it."""
    matcher = grammar.matcher()
    row = grammars.allocate_bitmask(1, grammar.vocab.size)[0]
    for token in [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]:
        matcher.fill_bitmask(row)
        if not (int(row[token // 32]) >> (token % 32)) & 1:
            return False
        assert matcher.accept_token(token)
    return matcher.is_terminated()


def compiled(text: str, vocab):
    return grammars.compile(Ebnf(text), vocab)


@pytest.mark.parametrize("gbnf,reference,inside,outside", REGULAR_GBNF)
def test_regular_gbnf_is_one_regex_with_the_references_language(
    gbnf, reference, inside, outside, vocab, tokenizer
):
    assert dialect(gbnf) == "gbnf"
    grammar = compiled(gbnf, vocab)
    assert isinstance(grammar, LazyRegexGrammar)
    for text in inside + outside:
        expected = re.fullmatch(reference, text) is not None
        assert expected == (text in inside), text  # the cases are right about the reference
        assert accepts(grammar, tokenizer, text) == expected, text


def test_recursive_gbnf_compiles_to_lark_with_the_references_language(vocab, tokenizer):
    gbnf, reference_lark, inside, outside = RECURSIVE_GBNF
    reference = lark.Lark(reference_lark, parser="earley")
    grammar = compiled(gbnf, vocab)
    assert isinstance(grammar, EbnfGrammar)
    for text in inside + outside:
        try:
            reference.parse(text)
            expected = True
        except lark.exceptions.LarkError:
            expected = False
        assert expected == (text in inside), text
        assert accepts(grammar, tokenizer, text) == expected, text


def test_llama_cpps_json_gbnf_takes_json_documents(vocab, tokenizer):
    gbnf = r"""
    root   ::= object
    value  ::= object | array | string | number | ("true" | "false" | "null") ws
    object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
    array  ::= "[" ws ( value ("," ws value)* )? "]" ws
    string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
    number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
    ws ::= | " " | "\n" [ \t]{0,20}
    """
    grammar = compiled(gbnf, vocab)
    for doc in ['{"a": [1, 2.5, "x\\n"], "b": {"c": null}}', "{}", '{"k":true}']:
        json.loads(doc)
        assert accepts(grammar, tokenizer, doc), doc
    for bad in ['{"a": }', "[1]", '{"a": 1,}', "{'a': 1}"]:
        assert not accepts(grammar, tokenizer, bad), bad


@pytest.mark.parametrize(
    "text,message",
    [
        ("root ::= <[128000]>", "token references"),
        ('root ::= "a" (= "b")', "lookahead"),
        ("root ::= x", "undefined `x`"),
        ('root ::= "a"{5,2}', "bad repetition"),
        ('start ::= "a"', "no start rule `root`"),
        ('root ::= "a" \\q', "unexpected"),
    ],
)
def test_gbnf_it_cannot_read_is_refused_naming_it(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        read(text)


def guidance_cases():
    from guidance import gen, one_or_more, select, substring
    from guidance import json as gjson

    person = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    return [
        (select(["yes", "no", "maybe"], name="a"), ["yes", "maybe"], ["ye", "yesno", "Yes"]),
        (gen("n", regex=r"\d{2,3}"), ["12", "999"], ["1", "1234", "ab"]),
        (
            "Name: " + gen("name", regex="[A-Z][a-z]+") + ", age " + gen("age", regex="[0-9]+"),
            ["Name: Bob, age 42"],
            ["Name: bob, age 42", "Name: Bob, age", "Bob, age 4"],
        ),
        (one_or_more(select(["ab", "c"])), ["ab", "cabc"], ["", "a", "abd"]),
        (substring("the quick fox", name="s"), ["quick", "the quick", " fox", ""], ["fox the"]),
        # guidance writes JSON with ", " and ": " (its x-guidance options); guidance's own
        # matcher, the reference here, refuses compact JSON.
        (gjson("p", schema=person), ['{"name": "Al", "age": 3}'], ['{"name":"Al","age":3}']),
    ]


def test_guidance_grammars_take_what_guidance_itself_matches(vocab, tokenizer):
    for node, inside, outside in guidance_cases():
        text = node.ll_grammar()
        assert dialect(text) == "llguidance"
        grammar = compiled(text, vocab)
        for sample in inside + outside:
            # guidance's own matcher (llguidance) is the reference.
            expected = node.match(sample, raise_exceptions=False) is not None
            assert expected == (sample in inside), (text, sample)
            assert accepts(grammar, tokenizer, sample) == expected, (text, sample)


def test_recursive_llguidance_grammar_compiles_to_lark(vocab, tokenizer):
    text = '%llguidance {}\nstart: item\nitem: "[" (item ("," item)*)? "]" | NUM\nNUM: /[0-9]/\n'
    grammar = compiled(text, vocab)
    assert isinstance(grammar, EbnfGrammar)
    assert accepts(grammar, tokenizer, "[1,[2,[]],3]")
    assert not accepts(grammar, tokenizer, "[1,[2]")


def test_max_tokens_inside_a_grammar_bounds_its_rules_lexeme(vocab, tokenizer, check_rollback):
    from guidance import gen

    text = ("Answer: " + gen("a", regex="[a-z ]+", max_tokens=3) + "!").ll_grammar()
    grammar = compiled(text, vocab)
    assert isinstance(grammar, EbnfGrammar)
    words = tokenizer.encode(" hello world foo bar", add_special_tokens=False)
    assert len(words) == 4  # one token a word: the budget counts them
    assert accepts(grammar, tokenizer, "Answer: hello world foo!")
    assert not accepts(grammar, tokenizer, "Answer: hello world foo bar!")
    assert accepts(grammar, tokenizer, "Answer: hi!")
    check_rollback(grammar, "Answer: hello world foo!")
    # The same rule as the whole reply bounds the reply instead (and stays one regex).
    whole = gen("a", max_tokens=3).ll_grammar()
    assert SamplingParams(grammar=whole).max_tokens == 3
    assert SamplingParams(grammar=text).max_tokens == SamplingParams().max_tokens


def test_reply_attributes_become_the_requests_sampling():
    from guidance import gen

    text = gen("t", stop="\n", max_tokens=20, temperature=0.5).ll_grammar()
    params = SamplingParams(grammar=text, max_tokens=100, stop=["END"])
    assert (params.max_tokens, params.temperature, params.stop) == (20, 0.5, ["END", "\n"])
    assert SamplingParams(grammar=text, max_tokens=5).max_tokens == 5  # the smaller bound
    regex_stop = gen("t", stop_regex=r"[.!]").ll_grammar()
    assert reply_attributes(regex_stop).stop_regex == "[.!]"
    # The body left after the stop is taken out: any text.
    pattern = next(_ebnf(Ebnf(text), None, False))
    assert re.fullmatch(pattern, "any\ntext")


@pytest.mark.parametrize(
    "text,message",
    [
        ('%llguidance {}\nstart: "a: " t "b"\nt[temperature=0.2]: /x+/\n', "whole reply"),
        ('%llguidance {}\nstart: t\nt: "a" u\nu[max_tokens=2]: "x" t\n', "one lexeme"),
        ('%llguidance {}\nstart: t "b"\nt[stop="x"]: /y+/\n', "last item"),
        ("%llguidance {}\nstart: t\nt[lazy]: /y+/\n", "attribute lazy"),
        ("%llguidance {}\nstart: <[12]>\n", "token references"),
        ("%llguidance {}\nstart: @sub\n", "subgrammars"),
        ('%llguidance {}\n%ignore " "\nstart: "a"\n', "%ignore"),
        ('%llguidance {"no_forcing": true}\nstart: "a"\n', "options"),
        ("%llguidance {}\nstart: /a(?=b)/\n", "lookaround"),
        ('%llguidance {}\nstart: %json {"type": "string"', "invalid JSON"),
    ],
)
def test_llguidance_it_cannot_honour_is_refused_naming_it(text, message, vocab):
    with pytest.raises(ValueError, match=re.escape(message)):
        read(text)
        compiled(text, vocab)


def test_plain_lark_is_read_by_lark_as_before(vocab):
    text = '?start: NUMBER ("+" NUMBER)*\n%import common.NUMBER\n'
    assert dialect(text) == "lark" and read(text) is None
    assert isinstance(compiled(text, vocab), EbnfGrammar)
