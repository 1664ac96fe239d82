"""The pipeline's near-lossless policy (stages.math_policy): where a close draft token may stand
for the model's own, as a pure function of the text the tokens decode to."""

from hsd_cli.stages.math_policy import OutsideMath, inside_tex_math


def test_inside_tex_math():
    assert inside_tex_math("costs $x^2")
    assert not inside_tex_math("costs $x^2$ and")
    assert inside_tex_math("see $$\\frac{a}{b}")
    assert not inside_tex_math("see $$a$$ then")
    assert not inside_tex_math("price \\$5 only")
    assert inside_tex_math("where \\(a + b")
    assert not inside_tex_math("where \\(a\\) holds")
    assert inside_tex_math("\\[ x")
    assert not inside_tex_math("\\[ x \\] and")
    assert not inside_tex_math("a TeX line break \\\\(no math)")
    assert inside_tex_math("\\[ a \\\\ b")


def test_math_environments_are_math():
    assert inside_tex_math("so \\begin{equation} E = m")
    assert inside_tex_math("\\begin{align*} a &= b")
    assert not inside_tex_math("\\begin{equation} E \\end{equation} so")
    assert not inside_tex_math("\\begin{itemize} \\item one")


def chars(text):
    return [ord(c) for c in text]


# A tokenizer of one character per token: the policy sees what a real one's decode gives.
OUTSIDE_MATH = OutsideMath(lambda tokens: "".join(chr(t) for t in tokens))


def test_a_close_token_may_stand_for_the_models_in_prose_only():
    assert OUTSIDE_MATH(chars("the cost is "), ord("a"), ord("b"))
    assert not OUTSIDE_MATH(chars("the cost $x + "), ord("a"), ord("b"))
    assert not OUTSIDE_MATH(chars("where \\(x + "), ord("a"), ord("b"))
    assert not OUTSIDE_MATH(chars("\\begin{equation} x + "), ord("a"), ord("b"))
    assert OUTSIDE_MATH(chars("the cost $x$ is "), ord("a"), ord("b"))


def test_a_close_token_never_opens_closes_or_escapes_math():
    # The draft's token or the model's would write a TeX mark: either way the rule stays exact.
    assert not OUTSIDE_MATH(chars("the cost "), ord("$"), ord("a"))
    assert not OUTSIDE_MATH(chars("the cost "), ord("a"), ord("$"))
    assert not OUTSIDE_MATH(chars("the cost "), ord("\\"), ord("a"))
    # After a lone backslash, `(` opens \( ... \): not taken for the model's `x`, nor `x` for its `(`.
    assert not OUTSIDE_MATH(chars("see \\"), ord("("), ord("x"))
    assert not OUTSIDE_MATH(chars("see \\"), ord("x"), ord("("))
