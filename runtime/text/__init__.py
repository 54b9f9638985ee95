"""Text in: the tokenizer, chat templates rendered under bounds, and the template's markers
that programs render role by role.
"""
