"""The server's text handling: byte tokens decode across multi-byte characters, ids above 255
print as <|id|>, stop strings are held back until they cannot match."""

from mlxlab.serve.text import ByteTokenizer, safe_prefix, stop_index


def test_a_character_split_across_tokens_waits_for_its_last_byte():
    tok = ByteTokenizer()
    ids = tok.encode("aé€🙂")
    d = tok.detokenizer()
    pieces = [d.add(t) for t in ids]
    assert "".join(pieces) + d.finish() == "aé€🙂"
    assert pieces[1] == "" and pieces[2] == "é"  # é is two bytes: nothing until the second


def test_ids_beyond_bytes_print_as_markers_and_end_a_pending_character():
    d = ByteTokenizer().detokenizer()
    assert d.add(0xC3) == "" and d.add(700) == "\ufffd<|700|>"


def test_stop_strings():
    assert stop_index("hello END there", ["END", "xx"]) == 6 and stop_index("abc", ["z"]) is None
    assert safe_prefix("hello E", ["END"]) == 6  # "E" might start END: held back
    assert safe_prefix("hello EN", ["END", "N!"]) == 6 and safe_prefix("hello", ["END"]) == 5


def test_the_chat_template_is_plain_and_ends_with_the_assistant_turn():
    tok = ByteTokenizer()
    text = bytes(tok.chat_prompt([{"role": "user", "content": "hi"}])).decode()
    assert text == "<|user|>\nhi\n<|assistant|>\n"
