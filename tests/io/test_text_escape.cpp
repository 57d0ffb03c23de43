// Each escaper against hand-written expectations, and the invariants text_escape.hpp states: one
// printable line, one token of its language that reads back as the text.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "io/text_escape.hpp"

using namespace longseq;

TEST_CASE("utf8: well-formed sequences pass, each malformed form is found at its byte") {
  CHECK(utf8_valid(""));
  CHECK(utf8_valid("plain ascii"));
  CHECK(utf8_valid("Qwen3 \xE2\x80\x94 \xF0\x9F\x98\x80"));  // an em dash and an emoji
  CHECK(utf8_first_invalid_byte("ab\xFF") == 2);               // a byte no UTF-8 has
  CHECK(utf8_first_invalid_byte("a\xC0\xAF") == 1);            // an overlong '/'
  CHECK(utf8_first_invalid_byte("\xED\xA0\x80") == 0);         // a surrogate, U+D800
  CHECK(utf8_first_invalid_byte("\xF4\x90\x80\x80") == 0);     // past U+10FFFF
  CHECK(utf8_first_invalid_byte("ok\xE2\x80") == 2);           // cut short at the end
  CHECK(utf8_repaired("a\xFF" "b") == "a\xEF\xBF\xBD" "b");
  CHECK(utf8_repaired("\xC3\xA9") == "\xC3\xA9");  // é kept
}

TEST_CASE("one_line_text: no byte of the result can end a comment or a terminal line") {
  CHECK(one_line_text("llama") == "llama");
  CHECK(one_line_text("x\nopen('P','w').write('x')\n#") == "x\\nopen('P','w').write('x')\\n#");
  CHECK(one_line_text("a\rb\tc") == "a\\rb\\tc");
  CHECK(one_line_text("\x1b[31m") == "\\x1b[31m");                // a terminal escape
  CHECK(one_line_text("a\xC2\x85" "b") == "a\\x85b");             // NEL, a YAML 1.1 line break
  CHECK(one_line_text("a\xE2\x80\xA8" "b") == "a\\u2028b");       // LINE SEPARATOR
  CHECK(one_line_text("a\xE2\x80\xA9" "b") == "a\\u2029b");       // PARAGRAPH SEPARATOR
  CHECK(one_line_text("bad\xFF") == "bad\xEF\xBF\xBD");
  // The invariant on every byte value: nothing below 0x20, no DEL, valid UTF-8.
  std::string every_byte;
  for (int c = 0; c < 256; ++c) every_byte.push_back(static_cast<char>(c));
  const std::string line = one_line_text(every_byte);
  CHECK(utf8_valid(line));
  for (char c : line) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7F));
}

TEST_CASE("python_string_literal: ASCII only, quotes and backslashes escaped") {
  CHECK(python_string_literal("meta-llama/Llama-3.1-8B") == "\"meta-llama/Llama-3.1-8B\"");
  CHECK(python_string_literal("my \"fine-tuned\" llama") == "\"my \\\"fine-tuned\\\" llama\"");
  CHECK(python_string_literal("a\\b") == "\"a\\\\b\"");
  CHECK(python_string_literal("x\ny") == "\"x\\x0ay\"");
  CHECK(python_string_literal("\xC3\xA9") == "\"\\xe9\"");
  CHECK(python_string_literal("\xE2\x80\xA8") == "\"\\u2028\"");
  CHECK(python_string_literal("\xF0\x9F\x98\x80") == "\"\\U0001f600\"");  // not a surrogate pair
  CHECK(python_string_literal("\xFF") == "\"\\ufffd\"");
}

TEST_CASE("toml_basic_string: TOML 1.0's escapes, control characters as \\uXXXX") {
  CHECK(toml_basic_string("plain") == "\"plain\"");
  CHECK(toml_basic_string("my \"fine-tuned\" llama") == "\"my \\\"fine-tuned\\\" llama\"");
  CHECK(toml_basic_string("a\\b") == "\"a\\\\b\"");
  CHECK(toml_basic_string("x\ny\rz\x7F") == "\"x\\u000Ay\\u000Dz\\u007F\"");
  CHECK(toml_basic_string("\xC3\xA9") == "\"\xC3\xA9\"");  // UTF-8 kept, TOML is UTF-8
  CHECK(toml_basic_string("\xFF") == "\"\xEF\xBF\xBD\"");
}

TEST_CASE("shell_quote: safe words as they are, anything else one single-quoted word") {
  CHECK(shell_quote("/a/b-c_d.yaml") == "/a/b-c_d.yaml");
  CHECK(shell_quote("with space") == "'with space'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("$HOME") == "'$HOME'");
  CHECK(shell_quote("w s $(touch pwned)/m.deepspeed.json") == "'w s $(touch pwned)/m.deepspeed.json'");
}

TEST_CASE("json_text: a string that is not UTF-8 is written with U+FFFD, not an exception") {
  const nlohmann::json document = {{"model", std::string("bad\xFF")}};
  CHECK(json_text(document, -1) == "{\"model\":\"bad\xEF\xBF\xBD\"}");
  CHECK(nlohmann::json::parse(json_text(document))["model"] == "bad\xEF\xBF\xBD");
}
